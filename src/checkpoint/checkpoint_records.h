// What the saving (checkpoint.cpp) and loading (checkpoint_load.cpp) halves of native checkpoints
// share: the format's constants, the summaries of model and layout that state.json records and a
// load compares, and this rank's parameters by global name. Internal to src/checkpoint.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "distributed/parallel_state.h"
#include "tensor_parallel/parameters.h"

namespace megatron {

class GPTModel;
class SafetensorsFile;

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kTracker = "latest_checkpointed_iteration.txt";

// The generators whose states a checkpoint keeps: the CPU's, and the current device's when CUDA
// is present (each rank has its own GPU).
std::vector<at::Generator> checkpoint_generators();

// state.json's "model": the sizes that decide every tensor's shape and name; a load refuses a
// checkpoint whose summary differs from the configured model's.
nlohmann::json model_summary(const ModelConfig& m);

// state.json's "parallel": the layout the files are split by.
nlohmann::json layout_summary(const ParallelConfig& p, int tp, int pp, int dp);
nlohmann::json layout_summary(const Config& c, const dist::ParallelState& ps);

// Every parameter of this rank's chunks under its global name.
std::vector<std::pair<std::string, at::Tensor>> chunk_parameters(const std::vector<GPTModel*>& chunks);

// What every parameter of this rank's chunks is (a tied embedding's copies are one entry).
tp::ParamTable chunk_table(const std::vector<GPTModel*>& chunks);

// Copies the tensors of `file` into `params`, shapes checked.
void load_parameters(const SafetensorsFile& file, const std::vector<std::pair<std::string, at::Tensor>>& params);

}  // namespace megatron
