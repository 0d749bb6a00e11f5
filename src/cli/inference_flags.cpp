#include "cli/inference_flags.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdlib>
#include <thread>

#include "core/errors.h"
#include "model/gpt_model.h"
#include "train/rank_resources.h"

namespace megatron::cli {

const char* kInferenceModelFlagsHelp =
    "  --load DIR                   checkpoint directory (as given to train --save)\n"
    "  --load-hf DIR                Hugging Face model directory (config.json, safetensors, tokenizer.json)\n"
    "  --tokenizer-model PATH       use this tokenizer instead of the checkpoint's\n"
    "  --device auto|cpu|cuda       where to run (default auto)\n"
    "  --cpu-threads N              intra-op threads on CPU (default: one per core)\n"
    "  --bf16                       run in bf16 (default fp32)\n"
    "  --cuda-graph-impl none|local on a GPU, local: replay decode steps from CUDA graphs, attention reading the\n"
    "                               KV cache in place (default none; --enable-cuda-graph: local)\n";

double number_flag(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v) || std::fabs(v) > 9007199254740992.0) {
    throw UserError(flag + ": expected a finite number, got '" + text + "'");
  }
  return v;
}

bool take_inference_model_flag(const Args& args, size_t& i, InferenceModelFlags& flags) {
  if (args[i] == "--bf16") {
    flags.bf16 = true;
    return true;
  }
  if (args[i] == "--enable-cuda-graph") {
    flags.cuda_graph_impl = "local";
    return true;
  }
  std::string* target = args[i] == "--load"              ? &flags.load
                        : args[i] == "--load-hf"         ? &flags.load_hf
                        : args[i] == "--tokenizer-model" ? &flags.tokenizer_model
                        : args[i] == "--device"          ? &flags.device
                        : args[i] == "--cpu-threads"     ? &flags.cpu_threads
                        : args[i] == "--cuda-graph-impl" ? &flags.cuda_graph_impl
                                                         : nullptr;
  if (target == nullptr) return false;
  if (i + 1 >= args.size()) throw UserError(args[i] + ": expects a value");
  *target = args[++i];
  return true;
}

bool decode_cuda_graphs(const InferenceModelFlags& flags) {
  if (flags.cuda_graph_impl != "none" && flags.cuda_graph_impl != "local") {
    throw UserError("--cuda-graph-impl: expected none or local, got " + flags.cuda_graph_impl);
  }
  return flags.cuda_graph_impl == "local";
}

GenerationModel load_inference_model(const InferenceModelFlags& flags) {
  decode_cuda_graphs(flags);  // a bad value is refused before the model loads
  if (flags.load.empty() == flags.load_hf.empty()) {
    throw UserError("need one of --load DIR (a checkpoint directory) and --load-hf DIR (a Hugging Face model)");
  }
  const double threads = flags.cpu_threads.empty() ? double(std::max(1u, std::thread::hardware_concurrency()))
                                                   : number_flag("--cpu-threads", flags.cpu_threads);
  if (!(threads >= 1 && threads <= kMaxCpuThreads)) {
    throw UserError("--cpu-threads must be from 1 to " + std::to_string(kMaxCpuThreads) + ", got " + flags.cpu_threads);
  }
  at::set_num_threads(static_cast<int>(threads));
  if (flags.device != "auto" && flags.device != "cpu" && flags.device != "cuda") {
    throw UserError("--device: expected auto, cpu or cuda, got " + flags.device);
  }
  if (flags.device == "cuda" && !at::hasCUDA()) throw UserError("--device cuda: no CUDA device here; use --device cpu");
  const at::Device device = (flags.device == "cuda" || (flags.device == "auto" && at::hasCUDA())) ? at::Device(at::kCUDA, 0)
                                                                                                  : at::Device(at::kCPU);
  GenerationModel g = flags.load.empty() ? load_hf_for_generation(flags.load_hf, flags.tokenizer_model, device)
                                         : load_native_for_generation(flags.load, flags.tokenizer_model, device);
  if (flags.bf16) g.model->to(device, at::kBFloat16);
  return g;
}

}  // namespace megatron::cli
