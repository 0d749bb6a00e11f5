// The flags `megatron generate` and `megatron serve` share: which checkpoint (native or Hugging
// Face), its tokenizer, and where the model runs.
#pragma once

#include <string>

#include "cli/commands.h"
#include "inference/engine.h"
#include "inference/generation_model.h"
#include "model/kv_cache.h"

namespace megatron::cli {

struct InferenceModelFlags {
  std::string load;             // --load DIR
  std::string load_hf;          // --load-hf DIR
  std::string tokenizer_model;  // --tokenizer-model PATH
  std::string device = "auto";  // --device auto|cpu|cuda
  std::string cpu_threads;      // --cpu-threads N ("": one per core)
  bool bf16 = false;            // --bf16: weights and activations in bf16 (fp32 otherwise)
  std::string tensor_parallel;  // --tensor-model-parallel-size N ("": 1); N ranks of `megatron launch`
  std::string pipeline_parallel;  // --pipeline-model-parallel-size N ("": 1); tensor x pipeline ranks
  std::string first_stage_layers;  // --decoder-first-pipeline-num-layers N ("": an even share)
  std::string last_stage_layers;   // --decoder-last-pipeline-num-layers N ("": an even share)
  std::string cuda_graph_impl = "auto";  // --cuda-graph-impl auto|none|local (--enable-cuda-graph: local): EngineOptions::cuda_graphs
  std::string decode_ahead = "auto";     // --decode-ahead / --no-decode-ahead: EngineOptions::decode_ahead
  std::string attention_backend = "auto";  // --attention-backend auto|flash|decode: EngineOptions::decode_kernels
  std::string decode_norms_in_gemv = "auto";  // --decode-norms-in-gemv / --no-decode-norms-in-gemv: EngineOptions::decode_kernels
  std::string decode_rope_in_gemv = "auto";  // --decode-rope-in-gemv / --no-decode-rope-in-gemv: EngineOptions::decode_kernels
  bool chunked_prefill = false;            // --enable-chunked-prefill: EngineOptions::prefill_chunk
  std::string max_batched_tokens;          // --max-num-batched-tokens N: the chunk (implies chunked prefill)
};

// The decode kernels the flags ask for by name: --attention-backend decode (auto, the default,
// and flash: FA2), --decode-norms-in-gemv, --decode-rope-in-gemv (UserError for another backend).
DecodeKernels asked_decode_kernels(const InferenceModelFlags& flags);
// Those the engine uses (EngineOptions::decode_kernels): the ones asked for, and RoPE in the QKV
// GEMV by default where decode steps read the cache in place (a GPU with --cuda-graph-impl auto or
// local; --no-decode-rope-in-gemv turns it off). A warning on stderr where those asked for cannot
// run (the model on the CPU; attention and RoPE without decode steps reading the cache in place).
DecodeKernels decode_kernels(const InferenceModelFlags& flags, const GenerationModel& g);
// For the timing line: ", decode kernels run: ..." (those the steps ran, asked for or default) and
// ", asked for, not run: ..." (of `asked`, asked_decode_kernels); "" when none was run or asked for.
std::string decode_kernels_note(const DecodeKernels& asked, const DecodeKernels& run);

// Whether greedy decoding runs one step ahead (EngineOptions::decode_ahead): on with the model on a
// GPU unless --no-decode-ahead (measured there: 1.96 -> 1.80 ms a step at batch 1, docs/performance.md);
// off on the CPU (nothing to overlap: the step ahead of a sequence's last is work thrown away)
// unless --decode-ahead.
bool decode_one_step_ahead(const InferenceModelFlags& flags, const GenerationModel& g);

// Whether decode steps replay CUDA graphs (EngineOptions::cuda_graphs): --cuda-graph-impl local, or
// auto (the default) with the model on a GPU; none turns them off. UserError for any other value.
bool decode_cuda_graphs(const InferenceModelFlags& flags, const GenerationModel& g);

// The engine's options these flags and the model set (all but max_batch): CUDA graphs, decoding
// ahead, the decode kernels, the real vocabulary, the tokenizer's decoding (the engine must not
// outlive `g`), the pipeline stages.
EngineOptions engine_options_for(const InferenceModelFlags& flags, const GenerationModel& g);

// The help lines of these flags.
extern const char* kInferenceModelFlagsHelp;

// When args[i] is one of these flags: takes it and its value (i moves past the value), true.
bool take_inference_model_flag(const Args& args, size_t& i, InferenceModelFlags& flags);

// Checks the flags (exactly one of --load and --load-hf), sets the CPU threads, joins the other
// ranks under tensor and pipeline parallelism (`command` names the subcommand in errors), and loads.
GenerationModel load_inference_model(const InferenceModelFlags& flags, const std::string& command);

// Under tensor or pipeline parallelism `separator` + "the model split over N tensor-parallel ranks"
// (or "P pipeline stages", or "P pipeline stages of N tensor-parallel ranks"; for the
// subcommands' banners); "" on one rank.
std::string tensor_parallel_note(const GenerationModel& g, const std::string& separator);

// `text` as a finite number within 2^53 (the integer flags are cast from it); UserError naming `flag`.
double number_flag(const std::string& flag, const std::string& text);

}  // namespace megatron::cli
