#include "cli/inference_flags.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/errors.h"
#include "distributed/launch_env.h"
#include "distributed/world.h"
#include "model/gpt_model.h"
#include "tokenizer/tokenizer.h"
#include "train/rank_resources.h"

namespace megatron::cli {

const char* kInferenceModelFlagsHelp =
    "  --load DIR                   checkpoint directory (as given to train --save)\n"
    "  --load-hf DIR                Hugging Face model directory (config.json, safetensors, tokenizer.json)\n"
    "  --tokenizer-model PATH       use this tokenizer instead of the checkpoint's\n"
    "  --device auto|cpu|cuda       where to run (default auto)\n"
    "  --cpu-threads N              intra-op threads on CPU (default: one per core)\n"
    "  --bf16                       run in bf16 (default fp32)\n"
    "  --tensor-model-parallel-size N  split each layer over N ranks (run under `megatron launch --nproc-per-node N`)\n"
    "  --pipeline-model-parallel-size N  split the layers into N stages, one a rank (the ranks of `megatron launch`:\n"
    "                               tensor x pipeline)\n"
    "  --decoder-first-pipeline-num-layers N, --decoder-last-pipeline-num-layers N  the first / last stage's\n"
    "                               layers (default: an even share; the rest evenly over the stages between)\n"
    "  --cuda-graph-impl auto|none|local  decode steps replayed from CUDA graphs, attention reading the KV cache\n"
    "                               in place (default auto: on a GPU where the model allows; none: eager steps)\n"
    "  --decode-ahead, --no-decode-ahead  greedy decoding launches each step before the host reads the last\n"
    "                               one's tokens (same tokens; overlaps the host's work with the GPU's;\n"
    "                               default: on a GPU)\n"
    "  --attention-backend auto|flash|decode  attention of decode steps over the KV cache: flash: FA2;\n"
    "                               decode: this project's one-launch kernel where it takes the step (faster\n"
    "                               below ~1000 keys at 16 sequences, slower beyond, and at 1 below 129 keys);\n"
    "                               auto (default): that kernel for steps of 2-16 sequences up to 512 keys, of\n"
    "                               17-32 up to 256, of 33-64 up to 128 and of one over 129-512, FA2 for the rest\n"
    "  --decode-norms-in-gemv, --no-decode-norms-in-gemv  batch-1 decode steps compute the RMSNorms inside\n"
    "                               their GEMVs: the output projection and fc2 add the residual and prepare\n"
    "                               the next norm, QKV, fc1 and the output layer finish it (default: on one GPU)\n"
    "  --decode-rope-in-gemv, --no-decode-rope-in-gemv  batch-1 decode steps rotate the queries and keys\n"
    "                               into the KV cache in the QKV GEMV's epilogue (default: on where decode\n"
    "                               steps read the cache in place, a GPU with --cuda-graph-impl auto)\n"
    "  --enable-chunked-prefill     prefill a long prompt a chunk a step, the running requests decoding\n"
    "                               between its chunks (default off: a prompt in one forward)\n"
    "  --max-num-batched-tokens N   the chunk: the prompt tokens one prefill forward takes at most\n"
    "                               (default 2048; implies --enable-chunked-prefill)\n";

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
  if (args[i] == "--decode-ahead" || args[i] == "--no-decode-ahead") {
    flags.decode_ahead = args[i] == "--decode-ahead" ? "on" : "off";
    return true;
  }
  if (args[i] == "--decode-norms-in-gemv" || args[i] == "--no-decode-norms-in-gemv") {
    flags.decode_norms_in_gemv = args[i] == "--decode-norms-in-gemv" ? "on" : "off";
    return true;
  }
  if (args[i] == "--decode-rope-in-gemv" || args[i] == "--no-decode-rope-in-gemv") {
    flags.decode_rope_in_gemv = args[i] == "--decode-rope-in-gemv" ? "on" : "off";
    return true;
  }
  if (args[i] == "--enable-chunked-prefill") {
    flags.chunked_prefill = true;
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
                        : args[i] == "--attention-backend" ? &flags.attention_backend
                        : args[i] == "--tensor-model-parallel-size" ? &flags.tensor_parallel
                        : args[i] == "--pipeline-model-parallel-size" ? &flags.pipeline_parallel
                        : args[i] == "--max-num-batched-tokens" ? &flags.max_batched_tokens
                        : args[i] == "--decoder-first-pipeline-num-layers" ? &flags.first_stage_layers
                        : args[i] == "--decoder-last-pipeline-num-layers" ? &flags.last_stage_layers
                                                         : nullptr;
  if (target == nullptr) return false;
  if (i + 1 >= args.size()) throw UserError(args[i] + ": expects a value");
  *target = args[++i];
  return true;
}

std::string tensor_parallel_note(const GenerationModel& g, const std::string& separator) {
  const int tp = g.parallel.tp.size(), pp = g.parallel.pp.size();
  if (tp == 1 && pp == 1) return "";
  const std::string over_tp = std::to_string(tp) + " tensor-parallel ranks", over_pp = std::to_string(pp) + " pipeline stages";
  return separator + "the model split over " + (pp == 1 ? over_tp : tp == 1 ? over_pp : over_pp + " of " + over_tp);
}

namespace {

void check_cuda_graph_impl(const InferenceModelFlags& flags) {
  if (flags.cuda_graph_impl != "auto" && flags.cuda_graph_impl != "none" && flags.cuda_graph_impl != "local") {
    throw UserError("--cuda-graph-impl: expected auto, none or local, got " + flags.cuda_graph_impl);
  }
}

void check_attention_backend(const InferenceModelFlags& flags) {
  if (flags.attention_backend != "auto" && flags.attention_backend != "flash" && flags.attention_backend != "decode") {
    throw UserError("--attention-backend: expected auto, flash or decode for generation, got " + flags.attention_backend);
  }
}

// A flag's whole number from 1 to `most`; `fallback` when the flag was not given.
int64_t whole_number_flag(const std::string& flag, const std::string& text, int64_t fallback, int64_t most) {
  if (text.empty()) return fallback;
  const double n = number_flag(flag, text);
  if (n < 1 || n != std::floor(n) || n > double(most)) throw UserError(flag + " must be a whole number >= 1, got " + text);
  return static_cast<int64_t>(n);
}

// EngineOptions::prefill_chunk: --max-num-batched-tokens (2048 with --enable-chunked-prefill
// alone); 0 without either.
int64_t prefill_chunk(const InferenceModelFlags& flags) {
  return whole_number_flag("--max-num-batched-tokens", flags.max_batched_tokens, flags.chunked_prefill ? 2048 : 0, int64_t(1) << 40);
}

// --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers (0: an even share).
StageSplit stage_split(const InferenceModelFlags& flags) {
  StageSplit split;
  split.first_stage_layers = int(whole_number_flag("--decoder-first-pipeline-num-layers", flags.first_stage_layers, 0, 1000000));
  split.last_stage_layers = int(whole_number_flag("--decoder-last-pipeline-num-layers", flags.last_stage_layers, 0, 1000000));
  return split;
}

}  // namespace

DecodeKernels asked_decode_kernels(const InferenceModelFlags& flags) {
  check_attention_backend(flags);
  DecodeKernels kernels;
  kernels.attention = flags.attention_backend == "decode";
  kernels.norms_in_gemv = flags.decode_norms_in_gemv == "on";
  kernels.rope_in_gemv = flags.decode_rope_in_gemv == "on";
  return kernels;
}

DecodeKernels decode_kernels(const InferenceModelFlags& flags, const GenerationModel& g) {
  DecodeKernels kernels = asked_decode_kernels(flags);
  const bool asked = kernels.attention || kernels.norms_in_gemv || kernels.rope_in_gemv;
  const bool in_place = g.device.is_cuda() && decode_cuda_graphs(flags, g);
  if (asked && !g.device.is_cuda()) {
    std::fprintf(stderr, "warning: --attention-backend decode, --decode-norms-in-gemv and --decode-rope-in-gemv are CUDA kernels; "
                         "with the model on the CPU they change nothing\n");
  } else if ((kernels.attention || kernels.rope_in_gemv) && !in_place) {
    std::fprintf(stderr, "warning: --attention-backend decode and --decode-rope-in-gemv need decode steps that read the KV cache "
                         "in place (--cuda-graph-impl auto or local); with --cuda-graph-impl none they change nothing\n");
  }
  // RoPE in the QKV GEMV: on by default where it can run, on one GPU as measured (an H100, session
  // 34: 1.52 -> 1.49 ms a batch-1 step; docs/performance.md).
  if (flags.decode_rope_in_gemv == "auto") kernels.rope_in_gemv = in_place && g.parallel.world_size == 1;
  // The norms in the GEMVs (prepared by the GEMV before each, finished by the one after): on by
  // default on one GPU as measured (an H100, session 43: 1.093 -> 1.070 ms a batch-1 step).
  if (flags.decode_norms_in_gemv == "auto") kernels.norms_in_gemv = g.device.is_cuda() && g.parallel.world_size == 1;
  // The one-launch decode attention where it measured faster than FA2 (decode_attention_chosen):
  // on by default likewise, --attention-backend flash keeps FA2 everywhere.
  if (flags.attention_backend == "auto") kernels.attention_where_faster = in_place && g.parallel.world_size == 1;
  return kernels;
}

std::string decode_kernels_note(const DecodeKernels& asked, const DecodeKernels& run) {
  std::string ran, missed;
  auto add = [&](bool was_asked, bool did_run, const char* name) {
    if (!was_asked && !did_run) return;
    std::string& list = did_run ? ran : missed;
    list += (list.empty() ? "" : ", ") + std::string(name);
  };
  add(asked.attention, run.attention, "decode attention");
  add(asked.norms_in_gemv, run.norms_in_gemv, "norms in GEMVs");
  add(asked.rope_in_gemv, run.rope_in_gemv, "RoPE in the QKV GEMV");
  return (ran.empty() ? "" : ", decode kernels run: " + ran) + (missed.empty() ? "" : ", asked for, not run: " + missed);
}

bool decode_cuda_graphs(const InferenceModelFlags& flags, const GenerationModel& g) {
  check_cuda_graph_impl(flags);
  return flags.cuda_graph_impl == "local" || (flags.cuda_graph_impl == "auto" && g.device.is_cuda());
}

bool decode_one_step_ahead(const InferenceModelFlags& flags, const GenerationModel& g) {
  return flags.decode_ahead == "on" || (flags.decode_ahead == "auto" && g.device.is_cuda());
}

EngineOptions engine_options_for(const InferenceModelFlags& flags, const GenerationModel& g) {
  EngineOptions options;
  options.cuda_graphs = decode_cuda_graphs(flags, g);
  options.decode_ahead = decode_one_step_ahead(flags, g);
  options.decode_kernels = decode_kernels(flags, g);
  options.vocab_size = g.vocab_size;
  if (g.tokenizer) {
    const Tokenizer* tokenizer = g.tokenizer.get();
    options.detokenize = [tokenizer](const std::vector<int64_t>& ids) { return tokenizer->decode(ids); };
  }
  options.pipeline = g.parallel.pp;
  options.prefill_chunk = prefill_chunk(flags);
  return options;
}

GenerationModel load_inference_model(const InferenceModelFlags& flags, const std::string& command) {
  check_cuda_graph_impl(flags);  // bad values are refused before the model loads
  check_attention_backend(flags);
  prefill_chunk(flags);
  const StageSplit split = stage_split(flags);
  const int tp = int(whole_number_flag("--tensor-model-parallel-size", flags.tensor_parallel, 1, 65536));
  const int pp = int(whole_number_flag("--pipeline-model-parallel-size", flags.pipeline_parallel, 1, 65536));
  const dist::LaunchEnv env = dist::launch_env_from_environment();
  if (env.world_size != tp * pp) {
    const std::string asked = (tp > 1 ? "--tensor-model-parallel-size " + std::to_string(tp) : "") + (tp > 1 && pp > 1 ? " with " : "") +
                              (pp > 1 ? "--pipeline-model-parallel-size " + std::to_string(pp) : "");
    throw UserError(tp * pp > 1 ? asked + " needs " + (tp > 1 && pp > 1 ? std::to_string(tp * pp) + " ranks" : "as many ranks") +
                                      ": run `megatron launch --nproc-per-node " + std::to_string(tp * pp) + " " + command +
                                      " ...` (this process is one of " + std::to_string(env.world_size) + ")"
                                : command + " runs on one rank, or splits the model over all " + std::to_string(env.world_size) +
                                      " ranks of the job with --tensor-model-parallel-size and --pipeline-model-parallel-size (their "
                                      "product the ranks)");
  }
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
  const bool cuda = flags.device == "cuda" || (flags.device == "auto" && at::hasCUDA());
  const at::Device device = cuda ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank)) : at::Device(at::kCPU);
  std::shared_ptr<dist::World> world;
  dist::ParallelState ps = dist::ParallelState::single();
  if (env.world_size > 1) {
    world = std::make_shared<dist::World>(dist::World::connect(env, cuda ? "nccl" : "gloo", std::chrono::minutes(10)));
    ParallelConfig layout;
    layout.tensor_model_parallel_size = tp;
    layout.pipeline_model_parallel_size = pp;
    ps = dist::ParallelState::build(*world, layout);
  }
  GenerationModel g = flags.load.empty() ? load_hf_for_generation(flags.load_hf, flags.tokenizer_model, device, true, ps, split)
                                         : load_native_for_generation(flags.load, flags.tokenizer_model, device, ps, split);
  g.world = world;
  g.parallel = ps;
  if (flags.bf16) g.model->to(device, at::kBFloat16);
  g.model->pack_experts();  // after the last move: it keeps the parameters' new storage
  return g;
}

}  // namespace megatron::cli
