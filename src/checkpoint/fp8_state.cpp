#include "checkpoint/fp8_state.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include "core/errors.h"
#include "model/gpt_model.h"

namespace fs = std::filesystem;

namespace megatron {
namespace {

const char* const kHistory = ".fp8_amax_history";
const char* const kScale = ".fp8_scale";

bool uses_delayed(const GPTModel& chunk) {
  return chunk.fp8_context() && chunk.fp8_context()->options().recipe == fp8::Recipe::Delayed;
}

}  // namespace

std::string fp8_state_file(int pp_rank) {
  char name[64];
  std::snprintf(name, sizeof(name), "fp8_pp%03d.safetensors", pp_rank);
  return name;
}

std::vector<SafetensorsEntry> fp8_state_tensors(const std::vector<GPTModel*>& chunks) {
  std::vector<SafetensorsEntry> out;
  for (const GPTModel* chunk : chunks) {
    if (!uses_delayed(*chunk)) continue;
    fp8::DelayedScaling& delayed = chunk->fp8_context()->delayed();
    for (const auto& [name, layer] : chunk->fp8_linears()) {
      std::vector<at::Tensor> history, scale;
      for (int column : layer->columns()) {
        auto [h, s] = delayed.column(column);
        if (!h.defined()) return {};  // nothing cast yet: no state to keep
        history.push_back(h);
        scale.push_back(s);
      }
      out.push_back({name + kHistory, at::stack(history, 1).cpu()});  // [L, 3]
      out.push_back({name + kScale, at::stack(scale).cpu()});         // [3]
    }
  }
  return out;
}

int load_fp8_state(const std::string& dir, const std::vector<GPTModel*>& chunks, bool report) {
  bool any = false;
  for (const GPTModel* chunk : chunks) any = any || uses_delayed(*chunk);
  if (!any) return 0;
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, const SafetensorsFile*> by_name;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind("fp8_pp", 0) != 0 || entry.path().extension() != ".safetensors") continue;
    files.push_back(std::make_unique<SafetensorsFile>(entry.path().string()));
    files.back()->verify_checksum();
    for (const auto& name : files.back()->names()) by_name[name] = files.back().get();
  }
  int missing = 0;
  for (const GPTModel* chunk : chunks) {
    if (!uses_delayed(*chunk)) continue;
    fp8::DelayedScaling& delayed = chunk->fp8_context()->delayed();
    const at::Device device = chunk->parameters().at(0).device();
    for (const auto& [name, layer] : chunk->fp8_linears()) {
      auto h = by_name.find(name + kHistory), s = by_name.find(name + kScale);
      if (h == by_name.end() || s == by_name.end()) {
        ++missing;
        continue;
      }
      const at::Tensor history = h->second->load(name + kHistory), scale = s->second->load(name + kScale);  // [L, 3], [3]
      if (history.dim() != 2 || history.size(1) != 3 || scale.dim() != 1 || scale.size(0) != 3 ||
          history.scalar_type() != at::kFloat || scale.scalar_type() != at::kFloat) {
        throw UserError(h->second->path() + ": '" + name + kHistory + "' / '" + kScale + "' must be fp32 [L, 3] and [3], got " +
                        c10::str(history.scalar_type(), history.sizes(), " and ", scale.scalar_type(), scale.sizes()));
      }
      for (int k = 0; k < 3; ++k) delayed.set_column(layer->columns()[size_t(k)], history.select(1, k), scale[k], device);
    }
  }
  if (missing > 0 && report) {
    std::printf("> note: %s holds no FP8 delayed-scaling state for %d layer(s) (saved without --fp8-recipe delayed?): "
                "their amax histories start empty, their scales at 1\n", dir.c_str(), missing);
  }
  return missing;
}

}  // namespace megatron
