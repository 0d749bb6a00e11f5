// What generation needs from a checkpoint, whichever kind it is: the model with its weights,
// the tokenizer, the ids that end a sequence, and how many ids are real (the rest of the output
// layer is Megatron's vocabulary padding). `megatron generate` and the server load through here.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distributed/parallel_state.h"

namespace megatron {

class GPTModel;
class Tokenizer;

struct GenerationModel {
  std::shared_ptr<GPTModel> model;
  std::shared_ptr<Tokenizer> tokenizer;
  std::vector<int64_t> stop_ids;  // EOS: generation_config.json's / config.json's for HF, else the tokenizer's
  int64_t vocab_size = 0;         // candidate ids [0, vocab_size)
  std::string source;             // the directory read, for messages
  c10::Device device = c10::kCPU;  // where the model runs
  // Under tensor and pipeline parallelism: the job's ranks (kept alive with the model, whose
  // layers hold its groups) and their groups; one process otherwise. Under pipeline parallelism
  // `model` is this stage's chunk (its layers; the embedding on the first stage, the final norm and
  // output layer on the last).
  std::shared_ptr<dist::World> world;
  dist::ParallelState parallel = dist::ParallelState::single();
};

// How the layers split over pipeline stages (`ps.pp`): evenly, or as Megatron's
// --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers give the first and last
// stage's (0: an even share); the rest evenly over the stages between.
struct StageSplit {
  int first_stage_layers = 0;
  int last_stage_layers = 0;
};

// A native checkpoint directory (as train --save wrote it: the latest iteration, its model and
// tokenizer records). `tokenizer_model` (optional) replaces the recorded tokenizer file. Under
// tensor and pipeline parallelism (`ps.tp`, `ps.pp` of more than one rank) this rank's shard of its
// stage's layers, resharded from whatever layout the checkpoint was saved in.
GenerationModel load_native_for_generation(const std::string& load_dir, const std::string& tokenizer_model, const at::Device& device,
                                           const dist::ParallelState& ps = dist::ParallelState::single(), const StageSplit& split = {});

// A Hugging Face model directory (config.json, safetensors, tokenizer.json); `tokenizer_model`
// (optional) is another HF tokenizer file or directory. A directory without any tokenizer is a
// UserError unless `need_tokenizer` is false (token ids in, token ids out). Under tensor
// parallelism this rank's shard (the vocabulary padded to a multiple of the TP size); under
// pipeline parallelism its stage's layers.
GenerationModel load_hf_for_generation(const std::string& hf_dir, const std::string& tokenizer_model, const at::Device& device,
                                       bool need_tokenizer = true, const dist::ParallelState& ps = dist::ParallelState::single(),
                                       const StageSplit& split = {});

}  // namespace megatron
