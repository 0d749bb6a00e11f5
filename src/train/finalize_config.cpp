// The checks and derived fields of a parsed Config (finalize_config): what no single flag can
// say alone, named by flag, and what follows from the flags (ffn size, head dim, padded
// vocabulary from the tokenizer, the data-parallel size).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "core/errors.h"
#include "train/batch_schedule.h"
#include "model/rope.h"
#include "moe/moe_config.h"
#include "pipeline/layout.h"
#include "tokenizer/tokenizer.h"
#include "train/arguments.h"
#include "train/precision.h"
#include "train/rank_resources.h"
#include "train/stop_signal.h"

namespace megatron {
namespace {

// The step is captured as a CUDA graph (--cuda-graph-impl, or Megatron's older --enable-cuda-graph).
bool captures_cuda_graph(const TrainConfig& t) { return t.cuda_graph_impl != "none" || t.enable_cuda_graph; }

// --recompute-*: Megatron's combinations (full needs a method and a layer count; selective
// takes neither), named in each error.
void validate_recompute(ModelConfig& m, const TrainConfig& t) {
  if (m.recompute_activations) {
    if (!m.recompute_granularity.empty() && m.recompute_granularity != "selective") {
      throw UserError("--recompute-activations means --recompute-granularity selective, but --recompute-granularity " +
                      m.recompute_granularity + " was also given: keep one");
    }
    m.recompute_granularity = "selective";
  }
  const std::string& g = m.recompute_granularity;
  if (!g.empty() && g != "full" && g != "selective") {
    throw UserError("--recompute-granularity must be full or selective (got '" + g + "')");
  }
  if (g == "full") {
    if (m.recompute_method != "uniform" && m.recompute_method != "block") {
      throw UserError("--recompute-granularity full needs --recompute-method uniform or block" +
                      (m.recompute_method.empty() ? std::string() : " (got '" + m.recompute_method + "')"));
    }
    if (m.recompute_num_layers < 1 || m.recompute_num_layers > m.num_layers) {
      throw UserError("--recompute-granularity full needs --recompute-num-layers between 1 and --num-layers " +
                      std::to_string(m.num_layers) + " (got " + std::to_string(m.recompute_num_layers) + ")");
    }
  } else if (!m.recompute_method.empty() || m.recompute_num_layers != 0) {
    throw UserError("--recompute-method and --recompute-num-layers apply to --recompute-granularity full only");
  }
  // Megatron's --recompute-modules, read with selective granularity only (as Megatron).
  static const std::set<std::string> megatrons = {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"};
  for (const std::string& module : m.recompute_modules) {
    if (megatrons.count(module) == 0) {
      throw UserError("--recompute-modules: unknown module '" + module + "' (Megatron's: core_attn, moe_act, layernorm, mla_up_proj, "
                      "mlp, moe, shared_experts)");
    }
  }
  if ((m.selectively_recomputes("layernorm") || m.selectively_recomputes("moe_act")) &&
      captures_cuda_graph(t)) {
    // Their memory comes back through a backward hook, which a replayed graph does not run.
    throw UserError("--recompute-modules layernorm / moe_act free outputs until a backward hook brings them back, which a "
                    "captured CUDA graph cannot replay: drop them or --cuda-graph-impl");
  }
  if (!g.empty() && captures_cuda_graph(t) && (m.hidden_dropout > 0 || m.attention_dropout > 0)) {
    throw UserError("--recompute-granularity with dropout replays the generators' states, which a captured CUDA graph "
                    "cannot: set --hidden-dropout 0 --attention-dropout 0, or drop --cuda-graph-impl");
  }
}

// --cpu-offloading / --cpu-offloading-num-layers: Megatron's limits (fewer layers than the
// model has, no pipeline, no recomputation) plus what this implementation cannot replay.
void validate_cpu_offloading(Config& c) {
  ModelConfig& m = c.model;
  const TrainConfig& t = c.train;
  if (m.cpu_offloading_num_layers < 0) throw UserError("--cpu-offloading-num-layers must be >= 0");
  if (m.min_offloaded_tensor_size < 0) throw UserError("--min-offloaded-tensor-size must be >= 0 (elements)");
  if (m.cpu_offloading_num_layers > 0) m.cpu_offloading = true;
  if (!m.cpu_offloading) return;
  if (m.cpu_offloading_num_layers < 1 || m.cpu_offloading_num_layers >= m.num_layers) {
    throw UserError("--cpu-offloading needs --cpu-offloading-num-layers between 1 and --num-layers - 1 = " +
                    std::to_string(m.num_layers - 1) + " (got " + std::to_string(m.cpu_offloading_num_layers) +
                    "): the layers after the offloaded ones hide their activations' way back");
  }
  if (c.parallel.pipeline_model_parallel_size > 1) {
    throw UserError("--cpu-offloading does not work with --pipeline-model-parallel-size > 1 (as in Megatron): several "
                    "micro-batches' forwards would share one layer's host buffers");
  }
  if (!m.recompute_granularity.empty()) {
    throw UserError("--cpu-offloading does not work with --recompute-granularity / --recompute-activations (as in Megatron)");
  }
  if (captures_cuda_graph(t)) {
    throw UserError("--cpu-offloading moves tensors from hooks that a captured CUDA graph does not run: drop it or --cuda-graph-impl");
  }
}

// --multi-latent-attention and --rope-type yarn: the dimensions MLA needs, each error naming its
// flag.
void validate_mla_and_yarn(const ModelConfig& m, const ParallelConfig& p) {
  auto bad = [](const std::string& flag, const std::string& what) { throw UserError("--" + flag + " " + what); };
  if (!m.rope_type.empty() && m.rope_type != "rope" && m.rope_type != "yarn") {
    bad("rope-type", "must be rope or yarn (got '" + m.rope_type + "')");
  }
  if (uses_yarn(m)) {
    if (!(m.rotary_scaling_factor > 0.0) || !std::isfinite(m.rotary_scaling_factor)) bad("rotary-scaling-factor", "must be positive");
    if (!std::isfinite(m.mscale) || !std::isfinite(m.mscale_all_dim)) bad("mscale", "and --mscale-all-dim must be finite");
    if (m.yarn_original_max_position_embeddings <= 0) bad("yarn-original-max-position-embeddings", "must be positive");
    if (!(m.yarn_beta_fast > 0.0 && m.yarn_beta_slow > 0.0)) bad("yarn-beta-fast", "and --yarn-beta-slow must be positive");
  }
  if (m.mtp_num_layers < 0) bad("mtp-num-layers", "must be >= 0");
  if (m.mtp_num_layers > 0) {
    if (m.position_embedding_type == "learned_absolute") {
      bad("mtp-num-layers", "needs rotary (or no) position embeddings, as Megatron: the last stage has no position table");
    }
    if (!(m.mtp_loss_scaling_factor >= 0.0) || !std::isfinite(m.mtp_loss_scaling_factor)) {
      bad("mtp-loss-scaling-factor", "must be finite and >= 0");
    }
  }
  if (!m.multi_latent_attention) return;
  if (m.position_embedding_type != "rope") bad("multi-latent-attention", "needs --position-embedding-type rope");
  if (m.group_query_attention) bad("multi-latent-attention", "has no query groups: drop --group-query-attention");
  for (auto [flag, v] : {std::pair<const char*, int>{"kv-lora-rank", m.kv_lora_rank}, {"qk-head-dim", m.qk_head_dim},
                         {"qk-pos-emb-head-dim", m.qk_pos_emb_head_dim}, {"v-head-dim", m.v_head_dim}}) {
    if (v <= 0) bad(flag, "must be positive with --multi-latent-attention (got " + std::to_string(v) + ")");
  }
  if (m.q_lora_rank < 0) bad("q-lora-rank", "must be positive, or 0 for one query projection");
  if (m.qk_pos_emb_head_dim % 2 != 0) {
    bad("qk-pos-emb-head-dim", std::to_string(m.qk_pos_emb_head_dim) + " must be even: the rotary channels turn in pairs");
  }
  if (m.num_attention_heads % p.tensor_model_parallel_size != 0) {
    bad("num-attention-heads", std::to_string(m.num_attention_heads) + " is not divisible by --tensor-model-parallel-size " +
                                   std::to_string(p.tensor_model_parallel_size) + " (MLA splits whole heads)");
  }
}

// Pai-Megatron-Patch's --patch-tokenizer-type: an HF tokenizer read from the --load directory
// (Pai's conversion copies the tokenizer files there), here from --tokenizer-model, --load-hf or
// --load, in that order. Only the types Pai loads with AutoTokenizer are the same tokenizer here.
void apply_patch_tokenizer(Config& c) {
  DataConfig& d = c.data;
  if (d.patch_tokenizer_type.empty()) return;
  static const std::set<std::string> hf_types = {"LLamaTokenizer", "LLama2Tokenizer", "LLama3Tokenizer", "MistralTokenizer",
                                                 "MixtralTokenizer", "Qwen2Tokenizer", "Qwen3Tokenizer", "DeepSeekV2Tokenizer",
                                                 "YiTokenizer"};
  if (hf_types.count(d.patch_tokenizer_type) == 0) {
    std::string names;
    for (const auto& n : hf_types) names += (names.empty() ? "" : ", ") + n;
    throw UserError("--patch-tokenizer-type " + d.patch_tokenizer_type + " is not supported; supported: " + names +
                    " (or give --tokenizer-type and --tokenizer-model)");
  }
  if (!d.tokenizer_type.empty() && d.tokenizer_type != "HuggingFaceTokenizer") {
    throw UserError("--patch-tokenizer-type " + d.patch_tokenizer_type + " contradicts --tokenizer-type " + d.tokenizer_type);
  }
  d.tokenizer_type = "HuggingFaceTokenizer";
  if (d.tokenizer_model.empty()) d.tokenizer_model = !c.train.load_hf.empty() ? c.train.load_hf : c.train.load;
  if (d.tokenizer_model.empty()) {
    throw UserError("--patch-tokenizer-type " + d.patch_tokenizer_type +
                    " reads the tokenizer from --load, as Pai-Megatron-Patch does: pass --load DIR (holding tokenizer.json), "
                    "--load-hf DIR or --tokenizer-model DIR");
  }
}

// The iteration count and learning-rate schedule, as Megatron's validate_args and
// get_optimizer_param_scheduler: by iterations (--train-iters, --lr-*-iters) or by samples
// (--train-samples, --lr-*-samples; iterations = samples / global batch), never both; the
// warm-up given as iterations, samples or --lr-warmup-fraction of the decay.
void finalize_schedule(TrainConfig& t, int64_t seq_length) {
  const bool by_samples = t.train_samples > 0;
  if (by_samples) {
    t.train_iters = GlobalBatchSchedule(t, seq_length).iterations_for(t.train_samples);
    if (t.train_iters == 0) {
      throw UserError("--train-samples " + std::to_string(t.train_samples) + " is less than one global batch (" +
                      std::to_string(t.global_batch_size) + ")");
    }
    if (t.lr_decay_iters != 0 || t.lr_warmup_iters != 0 || t.lr_wsd_decay_iters != 0) {
      throw UserError("--train-samples counts the schedule in samples: give --lr-decay-samples, --lr-warmup-samples and "
                      "--lr-wsd-decay-samples instead of their -iters forms");
    }
    if (t.lr_decay_samples == 0) t.lr_decay_samples = t.train_samples;
  } else if (t.lr_decay_samples != 0 || t.lr_warmup_samples != 0 || t.lr_wsd_decay_samples != 0) {
    throw UserError("--lr-decay-samples, --lr-warmup-samples and --lr-wsd-decay-samples need --train-samples; with --train-iters "
                    "give their -iters forms");
  }
  if (t.lr_warmup_fraction >= 0 && (t.lr_warmup_iters != 0 || t.lr_warmup_samples != 0)) {
    throw UserError("--lr-warmup-fraction and --lr-warmup-" + std::string(by_samples ? "samples" : "iters") +
                    " contradict each other: give one of them");
  }
  if (!(t.lr_warmup_fraction < 1.0) || (t.lr_warmup_fraction < 0 && t.lr_warmup_fraction != -1.0)) {
    throw UserError("--lr-warmup-fraction must be in [0, 1)");
  }
  if (t.lr <= 0.0) throw UserError("--lr is required and must be positive");
  if (t.min_lr < 0.0 || t.min_lr > t.lr) throw UserError("--min-lr must be between 0 and --lr");
  if (t.lr_decay_iters == 0) t.lr_decay_iters = t.train_iters;
  static const char* styles[] = {"constant", "linear", "cosine", "inverse-square-root", "WSD"};
  if (std::find(std::begin(styles), std::end(styles), t.lr_decay_style) == std::end(styles)) {
    throw UserError("--lr-decay-style must be constant, linear, cosine, inverse-square-root or WSD (got '" + t.lr_decay_style + "')");
  }
  const std::string unit = by_samples ? "samples" : "iters";
  const int64_t decay = by_samples ? t.lr_decay_samples : t.lr_decay_iters;
  const int64_t warmup = by_samples ? t.lr_warmup_samples : t.lr_warmup_iters;
  const int64_t wsd = by_samples ? t.lr_wsd_decay_samples : t.lr_wsd_decay_iters;
  if (decay <= 0) throw UserError("--lr-decay-" + unit + " must be positive");
  if (warmup < 0 || (t.lr_decay_style != "constant" && t.lr_decay_style != "inverse-square-root" && warmup > decay)) {
    throw UserError("--lr-warmup-" + unit + " must be between 0 and --lr-decay-" + unit + " (" + std::to_string(decay) + ")");
  }
  if (t.lr_decay_style == "WSD") {
    static const char* wsd_styles[] = {"linear", "cosine", "exponential", "minus_sqrt"};
    if (std::find(std::begin(wsd_styles), std::end(wsd_styles), t.lr_wsd_decay_style) == std::end(wsd_styles)) {
      throw UserError("--lr-wsd-decay-style must be linear, cosine, exponential or minus_sqrt");
    }
    if (wsd <= 0 || wsd > decay - warmup) {
      throw UserError("--lr-decay-style WSD needs --lr-wsd-decay-" + unit + " in (0, lr-decay-" + unit + " - lr-warmup-" + unit + "]");
    }
  }
}

// As Megatron's validate_args: constant decays by --weight-decay throughout and takes no start or
// end; linear and cosine need both (and ignore --weight-decay).
void check_weight_decay_schedule(const TrainConfig& t) {
  const std::string& style = t.weight_decay_incr_style;
  const bool start = t.start_weight_decay != -1.0, end = t.end_weight_decay != -1.0;
  if (style == "constant") {
    if (start || end) {
      throw UserError(std::string(start ? "--start-weight-decay" : "--end-weight-decay") +
                      " needs --weight-decay-incr-style linear or cosine (constant decays by --weight-decay throughout)");
    }
    return;
  }
  if (style != "linear" && style != "cosine") {
    throw UserError("--weight-decay-incr-style must be constant, linear or cosine (got '" + style + "')");
  }
  if (!start || !end) throw UserError("--weight-decay-incr-style " + style + " needs --start-weight-decay and --end-weight-decay");
  if (t.start_weight_decay < 0 || t.end_weight_decay < t.start_weight_decay) {
    throw UserError("--start-weight-decay must be >= 0 and --end-weight-decay at least as large (Megatron's schedule only increases it)");
  }
  if (captures_cuda_graph(t)) {
    throw UserError("--weight-decay-incr-style " + style + " changes the weight decay every step, which a captured CUDA graph "
                    "replays unchanged: use constant, or drop --cuda-graph-impl");
  }
}

}  // namespace

TokenizerSpec tokenizer_spec(const DataConfig& d, int64_t vocab_size) {
  TokenizerSpec spec;
  spec.type = d.tokenizer_type;
  spec.model = d.tokenizer_model;
  spec.vocab_file = d.vocab_file;
  spec.merge_file = d.merge_file;
  spec.vocab_size = vocab_size;
  spec.tiktoken_pattern = d.tiktoken_pattern;
  spec.tiktoken_num_special_tokens = d.tiktoken_num_special_tokens;
  spec.special_tokens = d.tokenizer_special_tokens;
  return spec;
}

TokenizerInfo tokenizer_info(const TokenizerSpec& spec) {
  auto tokenizer = make_tokenizer(spec);
  auto eod = tokenizer->eod_id();
  if (!eod) throw UserError("--tokenizer-model " + spec.model + ": the tokenizer has no end-of-document (EOS) token");
  return {tokenizer->vocab_size(), *eod, tokenizer->base_vocab_size()};
}

void finalize_config(Config& c, int world_size) {
  ModelConfig& m = c.model;
  TrainConfig& t = c.train;
  ParallelConfig& p = c.parallel;
  DataConfig& d = c.data;
  auto require_positive = [](const char* flag, int64_t v) {
    if (v <= 0) throw UserError(std::string("--") + flag + " is required and must be positive (got " + std::to_string(v) + ")");
  };
  require_positive("num-layers", m.num_layers);
  require_positive("hidden-size", m.hidden_size);
  require_positive("num-attention-heads", m.num_attention_heads);
  require_positive("seq-length", m.seq_length);
  require_positive("micro-batch-size", t.micro_batch_size);
  if (t.train_samples < 0) throw UserError("--train-samples must be positive");
  if (t.train_samples == 0) require_positive("train-iters", t.train_iters);
  if (t.train_samples > 0 && t.train_iters > 0) throw UserError("--train-iters and --train-samples contradict each other: give one of them");

  if (m.kv_channels == 0) {
    if (m.hidden_size % m.num_attention_heads != 0) {
      throw UserError("--hidden-size " + std::to_string(m.hidden_size) + " is not divisible by --num-attention-heads " +
                      std::to_string(m.num_attention_heads) + ": change one of them or set --kv-channels");
    }
    m.kv_channels = m.hidden_size / m.num_attention_heads;
  }
  if (!m.group_query_attention) {
    if (m.num_query_groups != 0 && m.num_query_groups != m.num_attention_heads) {
      throw UserError("--num-query-groups needs --group-query-attention");
    }
    m.num_query_groups = m.num_attention_heads;
  } else if (m.num_query_groups <= 0) {
    throw UserError("--group-query-attention needs --num-query-groups");
  }
  if (m.num_attention_heads % m.num_query_groups != 0) {
    throw UserError("--num-attention-heads " + std::to_string(m.num_attention_heads) +
                    " is not divisible by --num-query-groups " + std::to_string(m.num_query_groups));
  }
  if (m.ffn_hidden_size == 0) {
    // Megatron: 4h, and for SwiGLU 2/3 of that rounded up to a multiple of 64.
    m.ffn_hidden_size = m.swiglu ? ((4 * m.hidden_size * 2 / 3 + 63) / 64) * 64 : 4 * m.hidden_size;
  }
  if (m.max_position_embeddings == 0) m.max_position_embeddings = m.seq_length;
  if (m.position_embedding_type != "learned_absolute" && m.position_embedding_type != "rope" &&
      m.position_embedding_type != "none") {
    throw UserError("--position-embedding-type must be learned_absolute, rope or none (got '" + m.position_embedding_type + "')");
  }
  if (m.position_embedding_type == "learned_absolute" && m.seq_length > m.max_position_embeddings) {
    throw UserError("--seq-length " + std::to_string(m.seq_length) + " exceeds --max-position-embeddings " +
                    std::to_string(m.max_position_embeddings));
  }
  if (m.position_embedding_type == "rope" && !m.multi_latent_attention &&
      (m.rotary_percent <= 0.0 || m.rotary_percent > 1.0 || static_cast<int>(m.kv_channels * m.rotary_percent) % 2 != 0)) {
    throw UserError("--rotary-percent must be in (0, 1] and rotate an even number of head channels");
  }
  if (m.normalization != "LayerNorm" && m.normalization != "RMSNorm") {
    throw UserError("--normalization must be LayerNorm or RMSNorm (got '" + m.normalization + "')");
  }
  for (auto [flag, v] : {std::pair<const char*, double>{"hidden-dropout", m.hidden_dropout},
                         {"attention-dropout", m.attention_dropout}}) {
    if (v < 0.0 || v >= 1.0) throw UserError(std::string("--") + flag + " must be in [0, 1)");
  }
  // Values that train with every step NaN (a zero or negative epsilon or base) rather than fail.
  if (!(m.norm_epsilon > 0.0)) throw UserError("--norm-epsilon must be > 0 (got " + std::to_string(m.norm_epsilon) + ")");
  if (m.position_embedding_type == "rope" && !(m.rotary_base > 0.0)) {
    throw UserError("--rotary-base must be > 0 (got " + std::to_string(m.rotary_base) + ")");
  }
  if (m.init_method_std < 0.0) throw UserError("--init-method-std must be >= 0");

  // Stopping and resuming.
  if (exit_signal_number(c.train.exit_signal) < 0) {
    throw UserError("--exit-signal " + c.train.exit_signal +
                    ": not a signal the run can stop on; give one of SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, "
                    "SIGALRM, SIGXCPU");
  }
  if (c.train.override_opt_param_scheduler && c.train.use_checkpoint_opt_param_scheduler) {
    throw UserError("--override-opt-param-scheduler and --use-checkpoint-opt-param-scheduler contradict each other (the "
                    "flags' schedule or the checkpoint's): pass one of them");
  }

  // Data and vocabulary.
  // One source of data, as Megatron's "a single data source must be provided".
  std::vector<std::string> sources;
  if (d.mock_data) sources.push_back("--mock-data");
  if (!d.data_path.empty()) sources.push_back("--data-path");
  if (d.per_split_data()) sources.push_back("per-split paths");
  if (sources.size() > 1) {
    std::string given = sources[0];
    for (size_t i = 1; i < sources.size(); ++i) given += ", " + sources[i];
    throw UserError("--mock-data, --data-path and --train-data-path/--valid-data-path/--test-data-path are three sources of "
                    "data: pass one of them (given: " + given + ")");
  }
  if (sources.empty()) throw UserError("pass --data-path PREFIX, --train-data-path PREFIX or --mock-data");
  if (d.per_split_data() && c.explicit_flags.count("split")) {
    throw UserError("--split cuts --data-path into splits; with --train-data-path/--valid-data-path/--test-data-path each "
                    "split is its own data, taken whole (Megatron refuses both too): drop --split");
  }
  if (d.sft && d.mock_data) throw UserError("--sft trains on a packed dataset: pass --data-path, not --mock-data");
  apply_patch_tokenizer(c);
  if (d.tokenizer_type.empty() && !d.vocab_file.empty() && !d.merge_file.empty()) {
    // Megatron-LM's GPT-3 example gives GPT-2's files and no type (today's Megatron then stops):
    // they can only be GPT-2's BPE.
    d.tokenizer_type = "GPT2BPETokenizer";
    c.flag_notices.push_back("no --tokenizer-type: --vocab-file and --merge-file are GPT-2's BPE files, so GPT2BPETokenizer");
  }
  if (d.tokenizer_type.empty()) d.tokenizer_type = "NullTokenizer";
  if (d.tokenizer_type == "NullTokenizer" && m.vocab_size <= 0) {
    throw UserError("--tokenizer-type NullTokenizer needs --vocab-size N");
  }
  if (d.tokenizer_type != "TikTokenizer") {
    // Megatron's scripts pass the tiktoken flags whatever the tokenizer; only TikTokenizer reads them.
    for (auto [flag, given] : {std::pair{"--tiktoken-pattern", !d.tiktoken_pattern.empty()},
                               std::pair{"--tiktoken-num-special-tokens", d.tiktoken_num_special_tokens != DataConfig().tiktoken_num_special_tokens}}) {
      if (given) c.flag_notices.push_back(std::string(flag) + ": only --tokenizer-type TikTokenizer reads it; ignored with " + d.tokenizer_type);
    }
    // Megatron's HF and SentencePiece tokenizers add these to their vocabulary; here they are not.
    if (!d.tokenizer_special_tokens.empty() && d.tokenizer_type != "NullTokenizer" && d.tokenizer_type != "GPT2BPETokenizer") {
      throw UserError("--tokenizer-special-tokens with --tokenizer-type " + d.tokenizer_type +
                      " is not implemented yet (TikTokenizer only): add the tokens to the tokenizer's files instead");
    }
  }
  const TokenizerInfo info = tokenizer_info(tokenizer_spec(d, m.vocab_size));
  m.vocab_size = static_cast<int>(info.vocab_size);
  d.eod_id = info.eod_id;
  const int64_t tokenizer_vocab = m.vocab_size;
  const int64_t multiple = int64_t(m.make_vocab_size_divisible_by) * p.tensor_model_parallel_size;
  if (multiple <= 0) throw UserError("--make-vocab-size-divisible-by must be positive");
  // A Hugging Face checkpoint may have more embedding rows than its tokenizer has ids (Qwen).
  const int64_t rows = std::max<int64_t>(tokenizer_vocab, m.hf_vocab_size);
  m.padded_vocab_size = static_cast<int>((rows + multiple - 1) / multiple * multiple);
  if (m.padded_vocab_size_flag != 0) {  // the rows a script names (Pai's converted Qwen checkpoints: 151936)
    if (m.padded_vocab_size_flag < rows || m.padded_vocab_size_flag % p.tensor_model_parallel_size != 0) {
      throw UserError("--padded-vocab-size " + std::to_string(m.padded_vocab_size_flag) + " must cover the " + std::to_string(rows) +
                      " ids of the tokenizer (and checkpoint) and be a multiple of --tensor-model-parallel-size " +
                      std::to_string(p.tensor_model_parallel_size));
    }
    m.padded_vocab_size = m.padded_vocab_size_flag;
  }
  if (m.extra_vocab_size != 0) {
    // Pai-Megatron-Patch's rows: the tokenizer's base vocabulary plus --extra-vocab-size, unpadded.
    if (m.padded_vocab_size_flag != 0) throw UserError("--extra-vocab-size and --padded-vocab-size both set the embedding rows: pass one");
    const int64_t pai_rows = info.base_vocab_size + m.extra_vocab_size;
    if (m.extra_vocab_size < 0 || pai_rows < rows || pai_rows % p.tensor_model_parallel_size != 0) {
      throw UserError("--extra-vocab-size " + std::to_string(m.extra_vocab_size) + ": the tokenizer's " + std::to_string(info.base_vocab_size) +
                      " base ids plus it (" + std::to_string(pai_rows) + ") must cover its " + std::to_string(rows) +
                      " ids (added tokens and checkpoint rows included) and be a multiple of --tensor-model-parallel-size " +
                      std::to_string(p.tensor_model_parallel_size));
    }
    m.padded_vocab_size = static_cast<int>(pai_rows);
  }

  // Parallel layout.
  for (auto [flag, v] : {std::pair<const char*, int>{"tensor-model-parallel-size", p.tensor_model_parallel_size},
                         {"pipeline-model-parallel-size", p.pipeline_model_parallel_size},
                         {"context-parallel-size", p.context_parallel_size},
                         {"expert-model-parallel-size", p.expert_model_parallel_size}}) {
    if (v < 1) throw UserError(std::string("--") + flag + " must be at least 1");
  }
  const int model_parallel = p.tensor_model_parallel_size * p.pipeline_model_parallel_size * p.context_parallel_size;
  if (world_size % model_parallel != 0) {
    throw UserError("world size " + std::to_string(world_size) + " is not divisible by tensor x pipeline x context parallel size " +
                    std::to_string(model_parallel));
  }
  p.data_parallel_size = world_size / model_parallel;
  if (p.sequence_parallel && p.tensor_model_parallel_size == 1) p.sequence_parallel = false;  // as Megatron
  pipeline::check_pipeline_layout(p, m.num_layers);
  check_context_parallel(c);
  if (m.num_experts > 0 && m.moe_router_pre_softmax && m.moe_router_score_function == "sigmoid") {
    // Pai's DeepSeek-V3 script gives both; Megatron's topk routing reads pre-softmax for softmax only.
    c.flag_notices.push_back("--moe-router-pre-softmax has no effect with --moe-router-score-function sigmoid (as in Megatron)");
    m.moe_router_pre_softmax = false;
  }
  moe::finalize_moe_config(m, p, world_size);
  if (m.num_experts > 0 && captures_cuda_graph(t)) {
    std::string why = moe::route_reads_host(m, t.bf16);
    // Training only: at inference sinkhorn routing is a plain top-k.
    if (why.empty() && m.routes_by_sinkhorn()) {
      why = "--moe-router-load-balancing-type sinkhorn reads on the host whether it has converged, each round";
    }
    if (!why.empty()) {
      throw UserError("--cuda-graph-impl local with --num-experts: " + why + ", which a captured CUDA graph cannot; change that or "
                      "drop --cuda-graph-impl");
    }
  }
  const int tp = p.tensor_model_parallel_size;
  for (auto [flag, v] : {std::pair<const char*, int>{"num-attention-heads", m.num_attention_heads},
                         {"num-query-groups", m.num_query_groups},
                         {"ffn-hidden-size", m.ffn_hidden_size}}) {
    if (v % tp != 0) {
      throw UserError(std::string("--") + flag + " " + std::to_string(v) + " is not divisible by --tensor-model-parallel-size " +
                      std::to_string(tp) + ": tensor parallelism splits it across ranks");
    }
  }
  if (p.sequence_parallel && m.seq_length % tp != 0) {
    throw UserError("--seq-length " + std::to_string(m.seq_length) + " is not divisible by --tensor-model-parallel-size " +
                    std::to_string(tp) + ", which --sequence-parallel needs");
  }
  if (!p.distributed_backend.empty() && p.distributed_backend != "nccl" && p.distributed_backend != "gloo") {
    throw UserError("--distributed-backend must be nccl or gloo (got '" + p.distributed_backend + "')");
  }
  // Positive, and small enough that the seconds fit every clock it is turned into (a year).
  if (!(p.distributed_timeout_minutes > 0) || p.distributed_timeout_minutes > 525600) {
    throw UserError("--distributed-timeout-minutes must be positive and at most 525600 (a year)");
  }
  if (p.ddp_bucket_size < 0) throw UserError("--ddp-bucket-size must be >= 0");
  validate_recompute(m, t);
  validate_cpu_offloading(c);
  if (uses_yarn(m) && m.use_rope_scaling) {
    // Pai's DeepSeek-V3 script gives both; Megatron builds YaRN's rotary embedding then, which
    // has no Llama 3.1 scaling.
    c.flag_notices.push_back("--use-rope-scaling (Llama 3.1's) has no effect with YaRN (as in Megatron)");
    m.use_rope_scaling = false;
  }
  validate_mla_and_yarn(m, p);
  finalize_precision(c);

  // Batches.
  if (t.global_batch_size < 0) throw UserError("--global-batch-size must be positive (or left out: micro-batch x data-parallel size)");
  const int64_t per_step = int64_t(t.micro_batch_size) * p.data_parallel_size;
  if (t.global_batch_size == 0) t.global_batch_size = static_cast<int>(per_step);
  if (t.global_batch_size % per_step != 0) {
    throw UserError("--global-batch-size " + std::to_string(t.global_batch_size) + " is not divisible by --micro-batch-size " +
                    std::to_string(t.micro_batch_size) + " x data-parallel size " + std::to_string(p.data_parallel_size) +
                    ": make it a multiple of " + std::to_string(per_step));
  }
  if (p.num_virtual_stages_per_pipeline_rank > 1 && (t.global_batch_size / per_step) % p.pipeline_model_parallel_size != 0) {
    throw UserError("the interleaved schedule needs the number of micro-batches (" + std::to_string(t.global_batch_size / per_step) +
                    " = --global-batch-size / (--micro-batch-size x data-parallel size)) to be a multiple of "
                    "--pipeline-model-parallel-size " + std::to_string(p.pipeline_model_parallel_size));
  }

  auto given = [&](const char* flag) { return c.explicit_flags.count(flag) > 0; };
  if (!t.step_batch_size_schedule.empty()) {
    if (given("global-batch-size")) {
      throw UserError("--step-batch-size-schedule and --global-batch-size contradict each other (Megatron refuses both too): "
                      "the schedule gives every batch size");
    }
    if (t.train_samples <= 0) {
      throw UserError("--step-batch-size-schedule needs sample-based training (--train-samples and --lr-*-samples): counted "
                      "in iterations, the learning rate would assume --micro-batch-size x data-parallel samples per step");
    }
    if (captures_cuda_graph(t)) {
      throw UserError("--step-batch-size-schedule changes the number of micro-batches, which a captured CUDA graph cannot: "
                      "drop --cuda-graph-impl");
    }
    const GlobalBatchSchedule schedule(t, m.seq_length);
    for (const auto& [threshold, batch] : schedule.steps()) {
      const bool interleaved_ok = p.num_virtual_stages_per_pipeline_rank == 1 || (batch / per_step) % p.pipeline_model_parallel_size == 0;
      if (batch % per_step != 0 || !interleaved_ok) {
        throw UserError("--step-batch-size-schedule: the batch size " + std::to_string(batch) + " (from " + std::to_string(threshold) +
                        " samples on) is not a multiple of --micro-batch-size x data-parallel size " + std::to_string(per_step) +
                        (interleaved_ok ? "" : " x --pipeline-model-parallel-size (the interleaved schedule)"));
      }
    }
  }
  finalize_schedule(t, m.seq_length);
  if (t.clip_grad < 0.0) throw UserError("--clip-grad must be >= 0");
  if (given("decoupled-lr") && !(t.decoupled_lr >= 0.0 && std::isfinite(t.decoupled_lr))) {
    throw UserError("--decoupled-lr must be a finite number >= 0");
  }
  if (given("decoupled-min-lr") && !(t.decoupled_min_lr >= 0.0 && std::isfinite(t.decoupled_min_lr))) {
    throw UserError("--decoupled-min-lr must be a finite number >= 0");
  }
  if (!(m.rotary_seq_len_interpolation_factor > 0.0) || !std::isfinite(m.rotary_seq_len_interpolation_factor)) {
    throw UserError("--rotary-seq-len-interpolation-factor must be a finite number > 0");
  }
  if (t.calculate_per_token_loss && m.mtp_num_layers > 0) {
    throw UserError("--calculate-per-token-loss with --mtp-num-layers is not implemented yet: drop one of them");
  }
  if (t.log_params_norm && t.overlap_optimizer_step) {
    throw UserError("--log-params-norm reads the weights right after the update, which --overlap-optimizer-step runs "
                    "under the next forward: drop one of them");
  }
  if (t.adam_beta1 < 0 || t.adam_beta1 >= 1 || t.adam_beta2 < 0 || t.adam_beta2 >= 1) {
    throw UserError("--adam-beta1 and --adam-beta2 must be in [0, 1)");
  }
  if (!(t.adam_eps > 0.0)) throw UserError("--adam-eps must be > 0");
  if (t.weight_decay < 0.0) throw UserError("--weight-decay must be >= 0");
  check_weight_decay_schedule(t);

  // Logging and checkpoints.
  if (t.log_interval <= 0) throw UserError("--log-interval must be positive");
  if (t.eval_interval < 0 || t.eval_iters < 0) throw UserError("--eval-interval and --eval-iters must be >= 0");
  if (t.save_interval < 0 || t.exit_interval < 0) throw UserError("--save-interval and --exit-interval must be >= 0");
  if (!(t.exit_duration_in_mins >= 0) || !std::isfinite(t.exit_duration_in_mins)) {
    throw UserError("--exit-duration-in-mins must be a finite number >= 0");
  }
  if (t.profile && (t.profile_step_start < 0 || t.profile_step_end <= t.profile_step_start)) {
    throw UserError("--profile-step-end (" + std::to_string(t.profile_step_end) + ") must be after --profile-step-start (" +
                    std::to_string(t.profile_step_start) + ")");
  }
  for (const auto& r : t.profile_ranks) {
    char* end = nullptr;
    const long v = std::strtol(r.c_str(), &end, 10);
    if (r.empty() || *end != '\0' || v < 0) throw UserError("--profile-ranks: expected rank numbers, got '" + r + "'");
  }
  if (t.check_weight_hash_across_dp_replicas_interval < 0) {
    throw UserError("--check-weight-hash-across-dp-replicas-interval must be >= 0");
  }
  if (t.device != "auto" && t.device != "cpu" && t.device != "cuda") {
    throw UserError("--device must be auto, cpu or cuda (got '" + t.device + "')");
  }
  if (t.cpu_threads < 0 || t.cpu_threads > kMaxCpuThreads) {
    throw UserError("--cpu-threads must be from 0 (one per core) to " + std::to_string(kMaxCpuThreads) + ", got " + std::to_string(t.cpu_threads));
  }
  if (t.enable_cuda_graph && t.cuda_graph_impl == "none") t.cuda_graph_impl = "local";
  if (t.cuda_graph_impl == "transformer_engine") {
    throw UserError("--cuda-graph-impl transformer_engine: megatron.cpp has no Transformer Engine; use --cuda-graph-impl local");
  }
  if (t.cuda_graph_impl != "none" && t.cuda_graph_impl != "local") {
    throw UserError("--cuda-graph-impl must be none or local (got '" + t.cuda_graph_impl + "')");
  }
  if (t.cuda_graph_impl == "local") {
    if (t.cuda_graph_scope != "full_iteration") {
      throw UserError("--cuda-graph-scope " + t.cuda_graph_scope +
                      ": only full_iteration (the whole training step as one graph) is implemented; per-layer graphs "
                      "(full, attn) are not");
    }
    if (t.cuda_graph_warmup_steps < 1) {
      throw UserError("--cuda-graph-warmup-steps must be at least 1: the eager steps set up cuBLAS, cuDNN and the "
                      "model's caches outside the graph");
    }
    if (t.device == "cpu") throw UserError("--cuda-graph-impl local needs a CUDA device (--device cpu was given)");
  }
  if (!t.save_hf.empty()) {
    if (m.normalization != "RMSNorm" || !m.swiglu || m.add_bias_linear || m.position_embedding_type != "rope") {
      throw UserError("--save-hf exports Llama-family models (--normalization RMSNorm --swiglu --disable-bias-linear "
                      "--position-embedding-type rope); this model is not one");
    }
    std::error_code ec;
    if (std::filesystem::exists(t.save_hf) && !std::filesystem::is_empty(t.save_hf, ec)) {
      throw UserError("--save-hf " + t.save_hf + " exists and is not empty: export into a new directory");
    }
  }
  if (t.finetune && t.load.empty()) throw UserError("--finetune needs --load DIR");
  if (t.ckpt_step < -1) throw UserError("--ckpt-step must be an iteration number (>= 0)");
  if (t.ckpt_step >= 0 && t.load.empty()) throw UserError("--ckpt-step needs --load DIR (the iteration to load under it)");
  if (t.keep_last_n < 0) throw UserError("--keep-last-n must be >= 0");
}

}  // namespace megatron
