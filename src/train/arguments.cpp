// One table binds each Megatron flag to a Config field; the command line and YAML recipes are
// both read through it, so a key means the same thing in either place.
#include "train/arguments.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <cerrno>
#include <limits>
#include <type_traits>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>

#include "core/errors.h"
#include "model/families.h"
#include "train/megatron_flags.h"

namespace megatron {
namespace {

// Preset: a switch that sets a string setting to `preset` (a deprecated spelling of one value).
enum class Kind { Int, Int64, Double, Bool, NegatedBool, String, StringList, DoubleList, Preset };

struct Flag {
  std::string name;  // without leading dashes
  Kind kind;
  void* target;
  std::string help;
  std::string preset = "";  // Kind::Preset: the value the switch sets
};

// The flags of `megatron train`, bound to one Config. `--config` and `--model-family` are
// handled before the table because they change what the defaults are.
std::vector<Flag> train_flags(Config& c) {
  ModelConfig& m = c.model;
  TrainConfig& t = c.train;
  DataConfig& d = c.data;
  ParallelConfig& p = c.parallel;
  return {
      // model
      {"num-layers", Kind::Int, &m.num_layers, "number of transformer layers"},
      {"hidden-size", Kind::Int, &m.hidden_size, "transformer hidden size"},
      {"ffn-hidden-size", Kind::Int, &m.ffn_hidden_size, "MLP hidden size (default 4h; with --swiglu 2/3 of that, rounded up to 64)"},
      {"num-attention-heads", Kind::Int, &m.num_attention_heads, "number of attention heads"},
      {"group-query-attention", Kind::Bool, &m.group_query_attention, "use grouped-query attention"},
      {"num-query-groups", Kind::Int, &m.num_query_groups, "number of key/value groups with --group-query-attention"},
      {"kv-channels", Kind::Int, &m.kv_channels, "head dimension (default hidden-size / num-attention-heads)"},
      {"seq-length", Kind::Int, &m.seq_length, "sequence length of a training sample"},
      {"max-position-embeddings", Kind::Int, &m.max_position_embeddings, "maximum sequence length the position embedding covers (default seq-length)"},
      {"vocab-size", Kind::Int, &m.vocab_size, "vocabulary size (NullTokenizer; TikTokenizer's ids in all, default 131072)"},
      {"make-vocab-size-divisible-by", Kind::Int, &m.make_vocab_size_divisible_by, "pad the vocabulary to a multiple of this (times TP)"},
      {"padded-vocab-size", Kind::Int, &m.padded_vocab_size_flag, "the embedding rows exactly, instead of padding the vocabulary (a multiple of TP)"},
      {"extra-vocab-size", Kind::Int, &m.extra_vocab_size, "Pai-Megatron-Patch: embedding rows = the tokenizer's base vocabulary (without added tokens) + this, unpadded"},
      {"normalization", Kind::String, &m.normalization, "LayerNorm or RMSNorm"},
      {"norm-epsilon", Kind::Double, &m.norm_epsilon, "epsilon of the norms"},
      {"apply-layernorm-1p", Kind::Bool, &m.layernorm_zero_centered_gamma, "norm weights stored zero-centred: applied as 1 + weight, initialised to zeros"},
      {"swiglu", Kind::Bool, &m.swiglu, "SwiGLU MLP (linear_fc1 = [gate; up])"},
      {"disable-bias-linear", Kind::NegatedBool, &m.add_bias_linear, "no biases in linear layers"},
      {"add-qkv-bias", Kind::Bool, &m.add_qkv_bias, "bias on the QKV projection even with --disable-bias-linear (Qwen2)"},
      {"qk-layernorm", Kind::Bool, &m.qk_layernorm, "per-head norm on queries and keys (Qwen3)"},
      {"position-embedding-type", Kind::String, &m.position_embedding_type, "learned_absolute, rope or none"},
      {"use-rotary-position-embeddings", Kind::Preset, &m.position_embedding_type, "Megatron's deprecated --position-embedding-type rope", "rope"},
      {"rotary-base", Kind::Double, &m.rotary_base, "RoPE base (theta)"},
      {"rotary-percent", Kind::Double, &m.rotary_percent, "fraction of the head dimension RoPE rotates"},
      {"rotary-seq-len-interpolation-factor", Kind::Double, &m.rotary_seq_len_interpolation_factor, "RoPE positions divided by this (linear interpolation)"},
      {"use-rope-scaling", Kind::Bool, &m.use_rope_scaling, "Llama 3.1 RoPE frequency scaling"},
      {"rope-scaling-factor", Kind::Double, &m.rope_scaling_factor, "Llama 3.1 RoPE scaling factor"},
      {"rope-type", Kind::String, &m.rope_type, "rope or yarn (default: rope; yarn with --multi-latent-attention, as Megatron)"},
      {"rotary-scaling-factor", Kind::Double, &m.rotary_scaling_factor, "YaRN's context extension factor"},
      {"mscale", Kind::Double, &m.mscale, "YaRN mscale"},
      {"mscale-all-dim", Kind::Double, &m.mscale_all_dim, "YaRN mscale_all_dim (also scales MLA's softmax by its mscale squared)"},
      {"yarn-original-max-position-embeddings", Kind::Int, &m.yarn_original_max_position_embeddings, "YaRN's original context length"},
      {"yarn-beta-fast", Kind::Double, &m.yarn_beta_fast, "YaRN beta_fast"},
      {"yarn-beta-slow", Kind::Double, &m.yarn_beta_slow, "YaRN beta_slow"},
      {"multi-latent-attention", Kind::Bool, &m.multi_latent_attention, "DeepSeek's multi-latent attention (MLA)"},
      {"q-lora-rank", Kind::Int, &m.q_lora_rank, "MLA: rank of the query latent (0 or unset: one query projection)"},
      {"kv-lora-rank", Kind::Int, &m.kv_lora_rank, "MLA: rank of the key/value latent"},
      {"qk-head-dim", Kind::Int, &m.qk_head_dim, "MLA: per-head query/key channels without rotary"},
      {"qk-pos-emb-head-dim", Kind::Int, &m.qk_pos_emb_head_dim, "MLA: per-head rotary channels"},
      {"qk-nope-head-dim", Kind::Int, &m.qk_head_dim, "the same as --qk-head-dim (Pai-Megatron-Patch's name)"},
      {"qk-rope-head-dim", Kind::Int, &m.qk_pos_emb_head_dim, "the same as --qk-pos-emb-head-dim (Pai-Megatron-Patch's name)"},
      {"v-head-dim", Kind::Int, &m.v_head_dim, "MLA: per-head value channels"},
      {"mtp-num-layers", Kind::Int, &m.mtp_num_layers, "multi-token prediction depths after the decoder (DeepSeek-V3: 1)"},
      {"mtp-loss-scaling-factor", Kind::Double, &m.mtp_loss_scaling_factor, "weight of the MTP losses: factor / depths x their sum"},
      {"untie-embeddings-and-output-weights", Kind::Bool, &m.untie_embeddings_and_output_weights, "separate output layer weight"},
      {"init-method-std", Kind::Double, &m.init_method_std, "standard deviation of the weight init"},
      {"hidden-dropout", Kind::Double, &m.hidden_dropout, "dropout after attention and MLP"},
      {"attention-dropout", Kind::Double, &m.attention_dropout, "dropout on attention probabilities"},
      {"no-rope-fusion", Kind::NegatedBool, &m.apply_rope_fusion, "RoPE through ATen ops instead of the fused kernel"},
      {"no-bias-swiglu-fusion", Kind::NegatedBool, &m.bias_swiglu_fusion, "SwiGLU through ATen ops instead of the fused kernel"},
      {"no-bias-dropout-fusion", Kind::NegatedBool, &m.bias_dropout_fusion, "the residual add through ATen instead of fused with the RMSNorm after it"},
      {"cross-entropy-loss-fusion", Kind::Bool, &m.cross_entropy_loss_fusion, "cross entropy through the fused kernels, no fp32 logits (the default here; Megatron's flag)"},
      {"no-cross-entropy-loss-fusion", Kind::NegatedBool, &m.cross_entropy_loss_fusion, "cross entropy through ATen's log-softmax over fp32 logits"},
      {"recompute-granularity", Kind::String, &m.recompute_granularity, "recompute activations in the backward: full (whole layers) or selective (core attention)"},
      {"recompute-method", Kind::String, &m.recompute_method, "with full: uniform (every group of --recompute-num-layers layers) or block (the first N layers of each chunk)"},
      {"recompute-num-layers", Kind::Int, &m.recompute_num_layers, "with full: layers per recomputed group (uniform) or recomputed layers per chunk (block)"},
      {"recompute-activations", Kind::Bool, &m.recompute_activations, "the same as --recompute-granularity selective"},
      {"recompute-modules", Kind::StringList, &m.recompute_modules, "with selective: any of core_attn, mlp (dense MLPs), moe, moe_act, shared_experts, mla_up_proj, layernorm"},
      {"cpu-offloading", Kind::Bool, &m.cpu_offloading, "move the saved activations of the first --cpu-offloading-num-layers layers to host memory during the forward"},
      {"cpu-offloading-num-layers", Kind::Int, &m.cpu_offloading_num_layers, "layers whose activations go to host memory (> 0 turns --cpu-offloading on)"},
      {"min-offloaded-tensor-size", Kind::Int64, &m.min_offloaded_tensor_size, "with --cpu-offloading: tensors of fewer elements stay on the device"},
      // FP8 (src/fp8)
      {"fp8-format", Kind::String, &m.fp8, "FP8 GEMMs in the decoder layers' linear layers: e4m3, or hybrid (e5m2 output gradients)"},
      {"fp8-recipe", Kind::String, &m.fp8_recipe, "tensorwise (scales from each tensor's amax), delayed (from an amax history) or blockwise (1x128 / 128x128 tiles)"},
      {"fp8-margin", Kind::Int, &m.fp8_margin, "delayed: scales divided by 2^margin"},
      {"fp8-amax-history-len", Kind::Int, &m.fp8_amax_history_len, "delayed: steps of amax history per tensor"},
      {"fp8-amax-compute-algo", Kind::String, &m.fp8_amax_compute_algo, "delayed: the amax a scale is computed from: max (of the history) or most_recent"},
      {"no-fp8-wgrad", Kind::NegatedBool, &m.fp8_wgrad, "weight gradients from the high-precision inputs (not FP8)"},
      {"disable-fp8-wgrad", Kind::NegatedBool, &m.fp8_wgrad, "the same as --no-fp8-wgrad"},
      {"tp-only-amax-red", Kind::Bool, &m.tp_only_amax_red, "delayed: amaxes reduced over tensor-parallel ranks only (default TP x DP)"},
      {"first-last-layers-bf16", Kind::Bool, &m.first_last_layers_bf16, "keep the first and last layers out of FP8 (tensorwise and blockwise)"},
      {"num-layers-at-start-in-bf16", Kind::Int, &m.num_layers_at_start_in_bf16, "with --first-last-layers-bf16: layers at the start kept in bf16"},
      {"num-layers-at-end-in-bf16", Kind::Int, &m.num_layers_at_end_in_bf16, "with --first-last-layers-bf16: layers at the end kept in bf16"},
      // mixture of experts
      {"num-experts", Kind::Int, &m.num_experts, "experts per MoE layer (0: dense feed-forward)"},
      {"moe-ffn-hidden-size", Kind::Int, &m.moe_ffn_hidden_size, "hidden size of each expert (default --ffn-hidden-size)"},
      {"moe-layer-freq", Kind::String, &m.moe_layer_freq, "MoE layers: every N-th, or a list such as ([0]*1+[1]*47) with one entry per layer"},
      {"moe-router-topk", Kind::Int, &m.moe_router_topk, "experts each token goes to"},
      {"moe-router-pre-softmax", Kind::Bool, &m.moe_router_pre_softmax, "softmax over all experts before top-k, without renormalising (Qwen2-MoE)"},
      {"moe-router-score-function", Kind::String, &m.moe_router_score_function, "softmax or sigmoid"},
      {"moe-router-topk-scaling-factor", Kind::Double, &m.moe_router_topk_scaling_factor, "multiply the top-k routing weights by this"},
      {"moe-router-dtype", Kind::String, &m.moe_router_dtype, "fp32 or fp64: the router's logits and scores in this precision"},
      {"moe-router-force-load-balancing", Kind::Bool, &m.moe_router_force_load_balancing, "route on random logits (benchmarks of balanced load)"},
      {"moe-router-load-balancing-type", Kind::StringList, &m.moe_router_load_balancing_type,
       "aux_loss, seq_aux_loss, global_aux_loss or none; several types together take one coefficient each"},
      {"moe-aux-loss-coeff", Kind::DoubleList, &m.moe_aux_loss_coeff, "coefficient(s) of the load-balancing loss(es), one per type"},
      {"moe-z-loss-coeff", Kind::Double, &m.moe_z_loss_coeff, "coefficient of the router z-loss"},
      {"moe-expert-capacity-factor", Kind::Double, &m.moe_expert_capacity_factor, "each expert takes at most ceil(tokens x topk / experts x factor) tokens; the rest are dropped (default: dropless)"},
      {"moe-token-drop-policy", Kind::String, &m.moe_token_drop_policy, "with a capacity: probs (keep the highest routing weights) or position (keep the first tokens)"},
      {"moe-shared-expert-intermediate-size", Kind::Int, &m.moe_shared_expert_intermediate_size, "hidden size of the shared experts (all of them together)"},
      {"moe-shared-expert-gate", Kind::Bool, &m.moe_shared_expert_gate, "a sigmoid gate on the shared experts' output (Qwen2-MoE)"},
      {"moe-grouped-gemm", Kind::Bool, &m.moe_grouped_gemm, "the local experts as one grouped GEMM on CUDA (the default here; Megatron's flag)"},
      {"no-moe-grouped-gemm", Kind::NegatedBool, &m.moe_grouped_gemm, "one GEMM per local expert"},
      {"moe-token-dispatcher-type", Kind::String, &m.moe_token_dispatcher_type, "allgather or alltoall"},
      {"moe-router-enable-expert-bias", Kind::Bool, &m.moe_router_enable_expert_bias,
       "auxiliary-loss-free balancing: a per-expert bias on the routing scores, updated after each step (sigmoid routing)"},
      {"moe-router-bias-update-rate", Kind::Double, &m.moe_router_bias_update_rate, "step of the expert bias update"},
      {"moe-router-num-groups", Kind::Int, &m.moe_router_num_groups, "group-limited routing: number of expert groups"},
      {"moe-router-group-topk", Kind::Int, &m.moe_router_group_topk, "group-limited routing: groups each token's experts come from"},
      {"moe-permute-fusion", Kind::Bool, &m.moe_permute_fusion, "token permutation through the fused CUDA kernels (the default here; Megatron's flag)"},
      {"no-moe-permute-fusion", Kind::NegatedBool, &m.moe_permute_fusion, "token permutation through ATen's index ops"},
      {"moe-shared-expert-overlap", Kind::Bool, &m.moe_shared_expert_overlap,
       "run the shared experts on a CUDA stream of their own, beside the dispatch and routed experts (alltoall dispatcher)"},
      {"moe-pad-expert-input-to-capacity", Kind::Bool, &m.moe_pad_expert_input_to_capacity,
       "every expert takes exactly its capacity of rows (static shapes; needs --moe-expert-capacity-factor)"},
      // parallelism
      {"tensor-model-parallel-size", Kind::Int, &p.tensor_model_parallel_size, "tensor-parallel size"},
      {"pipeline-model-parallel-size", Kind::Int, &p.pipeline_model_parallel_size, "pipeline-parallel size"},
      {"num-layers-per-virtual-pipeline-stage", Kind::Int, &p.num_layers_per_virtual_pipeline_stage, "interleaved 1F1B: layers per model chunk"},
      {"num-virtual-stages-per-pipeline-rank", Kind::Int, &p.num_virtual_stages_per_pipeline_rank, "interleaved 1F1B: model chunks per pipeline rank"},
      {"decoder-first-pipeline-num-layers", Kind::Int, &p.decoder_first_pipeline_num_layers, "layers on the first pipeline stage (uneven split)"},
      {"decoder-last-pipeline-num-layers", Kind::Int, &p.decoder_last_pipeline_num_layers, "layers on the last pipeline stage (uneven split)"},
      {"context-parallel-size", Kind::Int, &p.context_parallel_size, "context-parallel size: each rank holds 2 of 2 x CP sequence chunks"},
      {"cp-comm-type", Kind::StringList, &m.cp_comm_type, "context-parallel attention: p2p (ring), all_gather or a2a (Ulysses); one, or one per layer"},
      {"expert-model-parallel-size", Kind::Int, &p.expert_model_parallel_size, "expert-parallel size"},
      {"expert-tensor-parallel-size", Kind::Int, &p.expert_tensor_parallel_size, "tensor-parallel size inside each expert (default: --tensor-model-parallel-size)"},
      {"sequence-parallel", Kind::Bool, &p.sequence_parallel, "sequence parallelism (with TP)"},
      {"use-distributed-optimizer", Kind::Bool, &p.use_distributed_optimizer, "shard optimizer state over data-parallel ranks"},
      {"overlap-grad-reduce", Kind::Bool, &p.overlap_grad_reduce, "reduce gradient buckets during backward"},
      {"overlap-param-gather", Kind::Bool, &p.overlap_param_gather, "with the distributed optimizer: all-gather parameters during the next forward"},
      {"no-gradient-accumulation-fusion", Kind::NegatedBool, &p.gradient_accumulation_fusion, "weight gradients through .grad and a separate fp32 add instead of accumulating in the GEMM"},
      {"ddp-bucket-size", Kind::Int64, &p.ddp_bucket_size, "elements per gradient bucket (default max(40M, 1M x DP))"},
      {"grad-reduce-in-bf16", Kind::Bool, &p.grad_reduce_in_bf16, "accumulate and reduce gradients in bf16 instead of fp32 (needs --bf16)"},
      {"distributed-backend", Kind::String, &p.distributed_backend, "nccl or gloo (default: nccl on CUDA, gloo on CPU)"},
      {"distributed-timeout-minutes", Kind::Double, &p.distributed_timeout_minutes, "rendezvous and collective timeout"},
      // data
      {"data-path", Kind::StringList, &d.data_path, "indexed dataset prefix(es): PREFIX or W1 PREFIX1 W2 PREFIX2 ..."},
      {"split", Kind::String, &d.split, "train,valid,test proportions"},
      {"mock-data", Kind::Bool, &d.mock_data, "synthetic data instead of --data-path"},
      {"sft", Kind::Bool, &d.sft, "supervised fine-tuning on a packed dataset from `megatron preprocess --sft`"},
      {"data-cache-path", Kind::String, &d.data_cache_path, "directory for the dataset index caches"},
      {"reset-position-ids", Kind::Bool, &d.reset_position_ids, "restart position ids after each end-of-document"},
      {"reset-attention-mask", Kind::Bool, &d.reset_attention_mask, "no attention across end-of-document"},
      {"eod-mask-loss", Kind::Bool, &d.eod_mask_loss, "no loss on predictions from an end-of-document token"},
      {"tokenizer-type", Kind::String, &d.tokenizer_type,
       "HuggingFaceTokenizer, GPT2BPETokenizer, SentencePieceTokenizer, Llama2Tokenizer, TikTokenizer or NullTokenizer"},
      {"tokenizer-model", Kind::String, &d.tokenizer_model,
       "tokenizer.json (or its directory), a SentencePiece .model, or TikTokenizer's .json list of ranks"},
      {"tiktoken-pattern", Kind::String, &d.tiktoken_pattern, "TikTokenizer's split pattern: v1 or v2 (default v2)"},
      {"tiktoken-num-special-tokens", Kind::Int64, &d.tiktoken_num_special_tokens, "TikTokenizer: special token ids before the ranks"},
      {"tokenizer-special-tokens", Kind::StringList, &d.tokenizer_special_tokens,
       "TikTokenizer's named special tokens (must include <unk> <s> </s> <mask> <pad> <cls> <sep>)"},
      {"vocab-file", Kind::String, &d.vocab_file, "GPT-2 vocab.json"},
      {"merge-file", Kind::String, &d.merge_file, "GPT-2 merges.txt"},
      {"patch-tokenizer-type", Kind::String, &d.patch_tokenizer_type,
       "Pai-Megatron-Patch: Qwen2Tokenizer, Qwen3Tokenizer, LLama3Tokenizer, DeepSeekV2Tokenizer, ...: the HF tokenizer in --load (or --tokenizer-model)"},
      // training
      {"micro-batch-size", Kind::Int, &t.micro_batch_size, "samples per micro-batch"},
      {"global-batch-size", Kind::Int, &t.global_batch_size, "samples per iteration (gradient accumulation fills it)"},
      {"step-batch-size-schedule", Kind::String, &t.step_batch_size_schedule,
       "\"THRESHOLD:BS ...\": the global batch from each threshold of consumed tokens on (K, M, B, T; with --train-samples)"},
      {"train-iters", Kind::Int64, &t.train_iters, "iterations to train"},
      {"train-samples", Kind::Int64, &t.train_samples, "samples to train (instead of --train-iters): iterations = samples / global batch"},
      {"lr", Kind::Double, &t.lr, "peak learning rate"},
      {"min-lr", Kind::Double, &t.min_lr, "learning rate floor of the decay"},
      {"decoupled-lr", Kind::Double, &t.decoupled_lr, "peak learning rate of the embedding and output layer (same schedule)"},
      {"decoupled-min-lr", Kind::Double, &t.decoupled_min_lr, "learning rate floor of the embedding and output layer (default --min-lr)"},
      {"calculate-per-token-loss", Kind::Bool, &t.calculate_per_token_loss, "gradient = sum over the global batch's loss tokens / their count (not a mean of micro-batch means)"},
      {"lr-decay-style", Kind::String, &t.lr_decay_style, "constant, linear, cosine, inverse-square-root or WSD"},
      {"lr-warmup-iters", Kind::Int64, &t.lr_warmup_iters, "linear warm-up iterations"},
      {"lr-warmup-init", Kind::Double, &t.lr_warmup_init, "learning rate at the start of warm-up"},
      {"lr-decay-iters", Kind::Int64, &t.lr_decay_iters, "iterations of the decay (default train-iters)"},
      {"lr-decay-samples", Kind::Int64, &t.lr_decay_samples, "with --train-samples: samples of the decay (default train-samples)"},
      {"lr-warmup-samples", Kind::Int64, &t.lr_warmup_samples, "with --train-samples: samples of linear warm-up"},
      {"lr-warmup-fraction", Kind::Double, &t.lr_warmup_fraction, "warm up over this fraction of the decay (instead of --lr-warmup-iters/samples)"},
      {"lr-wsd-decay-samples", Kind::Int64, &t.lr_wsd_decay_samples, "with --train-samples: samples of WSD's final decay"},
      {"lr-wsd-decay-style", Kind::String, &t.lr_wsd_decay_style, "WSD's final decay: linear, cosine, exponential or minus_sqrt"},
      {"lr-wsd-decay-iters", Kind::Int64, &t.lr_wsd_decay_iters, "length of WSD's final decay"},
      {"weight-decay", Kind::Double, &t.weight_decay, "AdamW weight decay (not on norms and biases)"},
      {"adam-beta1", Kind::Double, &t.adam_beta1, "Adam beta1"},
      {"adam-beta2", Kind::Double, &t.adam_beta2, "Adam beta2"},
      {"adam-eps", Kind::Double, &t.adam_eps, "Adam epsilon"},
      {"clip-grad", Kind::Double, &t.clip_grad, "clip gradients to this global L2 norm (0: off)"},
      {"overlap-optimizer-step", Kind::Bool, &t.overlap_optimizer_step, "CUDA: step the optimizer on a stream of its own, bucket by bucket, under the next forward"},
      {"bf16", Kind::Bool, &t.bf16, "bf16 parameters and activations, fp32 master weights and gradients"},
      {"fp16", Kind::Bool, &t.fp16, "fp16 parameters and activations, fp32 master weights and gradients, loss scaling"},
      {"loss-scale", Kind::Double, &t.loss_scale, "with --fp16: a constant loss scale (default: dynamic)"},
      {"initial-loss-scale", Kind::Double, &t.initial_loss_scale, "with --fp16: the dynamic loss scale's start"},
      {"min-loss-scale", Kind::Double, &t.min_loss_scale, "with --fp16: the dynamic loss scale's floor"},
      {"loss-scale-window", Kind::Double, &t.loss_scale_window, "with --fp16: steps without overflow before the scale doubles"},
      {"hysteresis", Kind::Int64, &t.hysteresis, "with --fp16: overflowing steps in a row before the scale halves"},
      {"use-precision-aware-optimizer", Kind::Bool, &t.use_precision_aware_optimizer, "the optimizer's state in the dtypes below"},
      {"optimizer-cpu-offload", Kind::Bool, &t.optimizer_cpu_offload,
       "the optimizer state (masters, moments) in host memory, stepped by the CPU (with --use-precision-aware-optimizer)"},
      {"optimizer-offload-fraction", Kind::Double, &t.optimizer_offload_fraction, "the share of each rank's parameters offloaded (0 to 1)"},
      {"overlap-cpu-optimizer-d2h-h2d", Kind::Bool, &t.overlap_cpu_optimizer_d2h_h2d,
       "the offloaded step's gradient and weight copies on streams of their own, beside the CPU's work"},
      {"exp-avg-dtype", Kind::String, &t.exp_avg_dtype, "precision-aware optimizer: Adam's first moment in fp32 or bf16"},
      {"exp-avg-sq-dtype", Kind::String, &t.exp_avg_sq_dtype, "precision-aware optimizer: Adam's second moment in fp32 or bf16"},
      {"main-grads-dtype", Kind::String, &t.main_grads_dtype, "precision-aware optimizer: gradients in fp32 or bf16 (= --grad-reduce-in-bf16)"},
      {"main-params-dtype", Kind::String, &t.main_params_dtype, "precision-aware optimizer: master weights (fp32)"},
      {"seed", Kind::Int64, &t.seed, "random seed"},
      {"log-interval", Kind::Int64, &t.log_interval, "iterations between log lines"},
      {"log-throughput", Kind::Bool, &t.log_throughput, "Megatron's TFLOP/s field in the log line (tokens/s and MFU are always at its end)"},
      {"no-check-for-nan-in-loss-and-grad", Kind::NegatedBool, &t.check_for_nan_in_loss_and_grad,
       "skip and count steps whose loss or gradient norm is not finite instead of stopping the run there"},
      {"log-params-norm", Kind::Bool, &t.log_params_norm, "the parameters' L2 norm in the log line and TensorBoard (params-norm)"},
      {"log-num-zeros-in-grad", Kind::Bool, &t.log_num_zeros_in_grad, "the count of zero gradient elements in the log line and TensorBoard (num-zeros)"},
      {"log-timers-to-tensorboard", Kind::Bool, &t.log_timers_to_tensorboard, "TensorBoard: iteration-time (s) and, with --log-throughput, throughput (TFLOP/s/GPU)"},
      {"log-memory-to-tensorboard", Kind::Bool, &t.log_memory_to_tensorboard, "TensorBoard: the CUDA allocator's mem-reserved-bytes, mem-allocated-bytes, mem-max-allocated-bytes, mem-allocated-count"},
      {"log-world-size-to-tensorboard", Kind::Bool, &t.log_world_size_to_tensorboard, "TensorBoard: world-size"},
      {"log-validation-ppl-to-tensorboard", Kind::Bool, &t.log_validation_ppl_to_tensorboard, "TensorBoard: lm loss validation ppl"},
      {"tensorboard-dir", Kind::String, &t.tensorboard_dir, "write TensorBoard event files here"},
      {"eval-interval", Kind::Int64, &t.eval_interval, "iterations between validations"},
      {"eval-iters", Kind::Int64, &t.eval_iters, "iterations of one validation"},
      {"profile", Kind::Bool, &t.profile, "profile iterations --profile-step-start..end with the PyTorch profiler"},
      {"profile-step-start", Kind::Int64, &t.profile_step_start, "first profiled iteration (default 10)"},
      {"profile-step-end", Kind::Int64, &t.profile_step_end, "profiling stops before this iteration (default 12)"},
      {"profile-ranks", Kind::StringList, &t.profile_ranks, "global ranks to profile (default 0)"},
      {"metrics-jsonl", Kind::String, &t.metrics_jsonl, "append one JSON line per iteration (exact loss, grad norm, lr) to this file"},
      {"save", Kind::String, &t.save, "checkpoint directory to save to"},
      {"load", Kind::String, &t.load, "checkpoint directory to resume from"},
      {"save-interval", Kind::Int64, &t.save_interval, "iterations between checkpoints"},
      {"persistent-save-interval", Kind::Int64, &t.save_interval, "the same as --save-interval"},
      {"exit-interval", Kind::Int64, &t.exit_interval, "stop after an iteration divisible by this (saving first)"},
      {"exit-duration-in-mins", Kind::Double, &t.exit_duration_in_mins, "save and stop after the first iteration that ends this many minutes into the run"},
      {"check-weight-hash-across-dp-replicas-interval", Kind::Int64, &t.check_weight_hash_across_dp_replicas_interval,
       "every N iterations, check the weights are identical on all data-parallel replicas"},
      {"no-load-optim", Kind::Bool, &t.no_load_optim, "do not load optimizer state"},
      {"no-load-rng", Kind::Bool, &t.no_load_rng, "do not load RNG state"},
      {"no-save-optim", Kind::Bool, &t.no_save_optim, "checkpoints without optimizer state (resume them with --no-load-optim)"},
      {"no-save-rng", Kind::Bool, &t.no_save_rng, "checkpoints without generator states (resume them with --no-load-rng)"},
      {"async-save", Kind::Bool, &t.async_save, "write checkpoints in the background from host copies"},
      {"keep-last-n", Kind::Int64, &t.keep_last_n, "keep only the newest N checkpoints under --save (default: all)"},
      {"finetune", Kind::Bool, &t.finetune, "with --load: weights only, start at iteration 0 with a fresh optimizer"},
      {"load-hf", Kind::String, &t.load_hf, "start from a Hugging Face model directory (architecture from its config.json)"},
      {"save-hf", Kind::String, &t.save_hf, "at the end, export the model as a Hugging Face directory"},
      {"cuda-graph-impl", Kind::String, &t.cuda_graph_impl, "none, or local: replay the training step as a CUDA graph"},
      {"enable-cuda-graph", Kind::Bool, &t.enable_cuda_graph, "the same as --cuda-graph-impl local"},
      {"cuda-graph-scope", Kind::String, &t.cuda_graph_scope, "what one graph holds: full_iteration (the whole step)"},
      {"cuda-graph-warmup-steps", Kind::Int64, &t.cuda_graph_warmup_steps, "eager iterations before capture (default 3)"},
      {"device", Kind::String, &t.device, "auto, cpu or cuda"},
      {"cpu-threads", Kind::Int, &t.cpu_threads, "intra-op threads on CPU (default: OMP_NUM_THREADS, else one per core)"},
      {"peak-tflops", Kind::Double, &t.peak_tflops, "peak TFLOP/s per device for MFU (default 989 on CUDA)"},
  };
}

const Flag* find_flag(const std::vector<Flag>& flags, std::string name) {
  for (auto& ch : name) {
    if (ch == '_') ch = '-';  // recipes may spell keys with underscores
  }
  for (const auto& f : flags) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// Levenshtein distance of a and b, or limit + 1 once it must exceed limit (a row's minimum never
// falls in later rows): most flags are far from a typo and are dismissed after a few rows.
size_t edit_distance(const std::string& a, const std::string& b, size_t limit) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    size_t row_min = row[0];
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
      row_min = std::min(row_min, row[j]);
    }
    if (row_min > limit) return limit + 1;
  }
  return std::min(row[b.size()], limit + 1);
}

// The nearest flag Megatron or megatron.cpp knows, by edit distance: catches typos such as
// --num-layer or --micro-batchsize, and says nothing when no flag is close.
std::string suggest(const std::vector<Flag>& flags, const std::string& name) {
  const size_t close_enough = std::max<size_t>(2, name.size() / 5);
  size_t best = std::string::npos;
  std::string best_name;
  auto consider = [&](const std::string& candidate) {
    // The distance is at least the difference in length: a name of garbage (a fuzzer's, a
    // pasted paragraph) is compared with no flag of another length.
    const size_t longer = std::max(name.size(), candidate.size()), shorter = std::min(name.size(), candidate.size());
    if (longer - shorter > close_enough) return;
    const size_t d = edit_distance(name, candidate, std::min(best, close_enough + 1));
    if (d < best) best = d, best_name = candidate;
  };
  for (const auto& f : flags) consider(f.name);
  for (const auto& f : megatron_flags()) consider(f.name);
  return best <= close_enough ? " (did you mean --" + best_name + "?)" : "";
}

template <typename T>
T parse_number(const std::string& where, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  T value{};
  if constexpr (std::is_floating_point_v<T>) {
    value = std::strtod(text.c_str(), &end);
  } else {
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) errno = ERANGE;
    value = static_cast<T>(v);
  }
  if (text.empty() || end == nullptr || *end != '\0' || errno == ERANGE) {
    throw UserError(where + ": expected " + (std::is_floating_point_v<T> ? "a number" : "an integer") +
                    ", got '" + text + "'");
  }
  if constexpr (std::is_floating_point_v<T>) {
    // No flag takes NaN or infinity: a NaN passes every range check after it (comparisons are false).
    if (!std::isfinite(value)) throw UserError(where + ": expected a finite number, got '" + text + "'");
  }
  return value;
}

bool parse_bool(const std::string& where, const std::string& text) {
  if (text == "true" || text == "True" || text == "1" || text == "yes") return true;
  if (text == "false" || text == "False" || text == "0" || text == "no") return false;
  throw UserError(where + ": expected true or false, got '" + text + "'");
}

// Stores one value into the field; `where` names the flag or recipe key for errors.
void assign(const Flag& f, const std::string& where, const std::vector<std::string>& values) {
  auto single = [&]() -> const std::string& {
    if (values.size() != 1) throw UserError(where + ": expects exactly one value");
    return values[0];
  };
  switch (f.kind) {
    case Kind::Int: *static_cast<int*>(f.target) = parse_number<int>(where, single()); break;
    case Kind::Int64: *static_cast<int64_t*>(f.target) = parse_number<int64_t>(where, single()); break;
    case Kind::Double: *static_cast<double*>(f.target) = parse_number<double>(where, single()); break;
    case Kind::String: *static_cast<std::string*>(f.target) = single(); break;
    case Kind::Bool: *static_cast<bool*>(f.target) = parse_bool(where, single()); break;
    case Kind::NegatedBool: *static_cast<bool*>(f.target) = !parse_bool(where, single()); break;
    case Kind::Preset:
      if (parse_bool(where, single())) *static_cast<std::string*>(f.target) = f.preset;
      break;
    case Kind::StringList:
      if (values.empty()) throw UserError(where + ": expects at least one value");
      *static_cast<std::vector<std::string>*>(f.target) = values;
      break;
    case Kind::DoubleList: {
      if (values.empty()) throw UserError(where + ": expects at least one value");
      std::vector<double> numbers;
      for (const std::string& v : values) numbers.push_back(parse_number<double>(where, v));
      *static_cast<std::vector<double>*>(f.target) = numbers;
      break;
    }
  }
}

std::vector<std::string> yaml_values(const YAML::Node& node, const std::string& where) {
  std::vector<std::string> out;
  if (node.IsScalar()) {
    out.push_back(node.Scalar());
  } else if (node.IsSequence()) {
    for (const auto& item : node) {
      if (!item.IsScalar()) throw UserError(where + ": list items must be plain values");
      out.push_back(item.Scalar());
    }
  } else {
    throw UserError(where + ": expected a value or a list of values");
  }
  return out;
}

struct SplitArgs {
  std::string config_path;
  std::string family;
  std::vector<std::pair<std::string, std::vector<std::string>>> flags;  // name -> values, in order
};

// Groups argv into (flag, values) pairs: a flag's values are the following non-flag words.
SplitArgs split_args(const std::vector<std::string>& args) {
  SplitArgs out;
  for (size_t i = 0; i < args.size();) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      throw UserError("unexpected argument '" + a + "': flags start with -- (see megatron train --help)");
    }
    std::string name = a.substr(2);
    std::vector<std::string> values;
    auto eq = name.find('=');
    if (eq != std::string::npos) {
      values.push_back(name.substr(eq + 1));
      name = name.substr(0, eq);
    }
    ++i;
    // A negative number is a value, not a flag.
    while (eq == std::string::npos && i < args.size() &&
           (args[i].rfind("--", 0) != 0 || args[i].size() == 2)) {
      values.push_back(args[i++]);
    }
    if (name == "config" || name == "model-family") {
      if (values.size() != 1) throw UserError("--" + name + ": expects exactly one value");
      (name == "config" ? out.config_path : out.family) = values[0];
    } else {
      out.flags.emplace_back(name, values);
    }
  }
  return out;
}

}  // namespace

Config parse_train_arguments(const std::vector<std::string>& args) {
  Config config;
  auto flags = train_flags(config);
  SplitArgs split = split_args(args);

  YAML::Node recipe;
  if (!split.config_path.empty()) {
    try {
      recipe = YAML::LoadFile(split.config_path);
    } catch (const YAML::BadFile&) {
      throw UserError("--config: cannot read '" + split.config_path + "': check the path");
    } catch (const YAML::Exception& e) {
      throw UserError(split.config_path + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML: " + e.msg);
    }
    if (!recipe.IsMap() && !recipe.IsNull()) {
      throw UserError(split.config_path + ": a recipe is a mapping of flag names to values");
    }
    if (recipe.IsMap() && recipe["model-family"] && split.family.empty()) {
      split.family = recipe["model-family"].Scalar();
    }
  }
  if (!split.family.empty()) apply_model_family(split.family, config.model);

  // Every problem of the recipe and the command line is reported at once: porting a launch
  // script should not take one run per flag.
  std::vector<std::string> problems;
  auto take = [&](const std::string& name, const std::string& where, std::vector<std::string> values, bool from_recipe) {
    const Flag* f = find_flag(flags, name);
    if (f != nullptr && (from_recipe || name.find('_') == std::string::npos)) {
      if ((f->kind == Kind::Bool || f->kind == Kind::NegatedBool || f->kind == Kind::Preset) && values.empty()) values = {"true"};
      assign(*f, where, values);
      config.explicit_flags.insert(f->name);
      return;
    }
    // A recipe may spell a key with underscores; the table holds Megatron's dashed names.
    std::string dashed = name;
    if (from_recipe) std::replace(dashed.begin(), dashed.end(), '_', '-');
    if (const MegatronFlag* megatron = find_megatron_flag(dashed)) {
      std::string notice;
      const std::string problem = judge_megatron_flag(*megatron, values, &notice);
      if (!problem.empty()) throw UserError((from_recipe ? where + ": " : std::string()) + problem);
      config.flag_notices.push_back(notice);
      return;
    }
    throw UserError(from_recipe ? where + " is not a known setting" + suggest(flags, dashed)
                                : "unknown flag --" + name + suggest(flags, name) + "; see megatron train --help");
  };
  if (recipe.IsMap()) {
    for (const auto& kv : recipe) {
      const std::string key = kv.first.Scalar();
      const std::string where = split.config_path + ":" + std::to_string(kv.first.Mark().line + 1) + ": key '" + key + "'";
      if (key == "model-family") continue;
      try {
        take(key, where, yaml_values(kv.second, where), true);
      } catch (const UserError& e) {
        problems.push_back(e.what());
      }
    }
  }
  for (const auto& [name, values] : split.flags) {
    try {
      take(name, "--" + name, values, false);
    } catch (const UserError& e) {
      problems.push_back(e.what());
    }
  }
  if (problems.size() == 1) throw UserError(problems[0]);
  if (!problems.empty()) {
    std::string all = std::to_string(problems.size()) + " problems with the flags:";
    for (const auto& p : problems) all += "\n  " + p;
    throw UserError(all);
  }
  if (!config.train.load_hf.empty() && !split.family.empty()) {
    throw UserError("--model-family and --load-hf contradict each other: the architecture comes from the HF config.json");
  }
  return config;
}

namespace {

// The default a flag's field holds, as help shows it ("" for none worth showing: switches, zero,
// empty, and the negative "not given" markers).
std::string default_text(const Flag& f) {
  std::ostringstream v;
  switch (f.kind) {
    case Kind::Int: if (*static_cast<int*>(f.target) > 0) v << *static_cast<int*>(f.target); break;
    case Kind::Int64: if (*static_cast<int64_t*>(f.target) > 0) v << *static_cast<int64_t*>(f.target); break;
    case Kind::Double: if (*static_cast<double*>(f.target) > 0) v << *static_cast<double*>(f.target); break;
    case Kind::String: v << *static_cast<std::string*>(f.target); break;
    case Kind::StringList:
      for (const auto& s : *static_cast<std::vector<std::string>*>(f.target)) v << (v.tellp() > 0 ? " " : "") << s;
      break;
    case Kind::DoubleList:
      for (double d : *static_cast<std::vector<double>*>(f.target)) v << (v.tellp() > 0 ? " " : "") << d;
      break;
    case Kind::Bool:
    case Kind::NegatedBool:
    case Kind::Preset: break;
  }
  return v.str();
}

// Where each group of the table starts, named after Megatron-LM's argument groups.
const std::map<std::string, const char*>& help_groups() {
  static const std::map<std::string, const char*> groups = {
      {"num-layers", "network size"},
      {"position-embedding-type", "position embedding"},
      {"multi-latent-attention", "multi-latent attention"},
      {"mtp-num-layers", "multi-token prediction"},
      {"untie-embeddings-and-output-weights", "output layer, initialization, regularization"},
      {"no-rope-fusion", "fusions and activation recomputation"},
      {"num-experts", "mixture of experts"},
      {"tensor-model-parallel-size", "distributed"},
      {"data-path", "data and dataloader"},
      {"tokenizer-type", "tokenizer"},
      {"micro-batch-size", "training"},
      {"lr", "learning rate"},
      {"weight-decay", "optimizer"},
      {"bf16", "mixed precision and seed"},
      {"log-interval", "logging"},
      {"eval-interval", "validation"},
      {"profile", "profiling and metrics"},
      {"save", "checkpointing"},
      {"cuda-graph-impl", "CUDA graphs"},
      {"device", "device"}};
  return groups;
}

}  // namespace

std::string train_help() {
  Config defaults;
  auto flags = train_flags(defaults);
  std::ostringstream out;
  out << "usage: megatron train [--config recipe.yaml] [--model-family NAME] [flags]\n"
         "       megatron pretrain_gpt.py ARGS   (a Megatron-LM or Pai-Megatron-Patch launch script's arguments)\n\n"
         "Trains a GPT-style model. Flags take Megatron-LM's names; a recipe takes the same keys\n"
         "without the dashes, and flags given here override it. Example:\n"
         "  megatron train --config examples/tiny_cpu.yaml --mock-data --train-iters 20\n"
         "  torchrun --nproc-per-node 8 --no-python megatron pretrain_gpt.py --num-layers 32 ... (unchanged)\n\n"
         "  --config FILE                     YAML recipe\n"
         "  --model-family NAME               preset:";
  for (const auto& name : known_model_families()) out << " " << name;
  out << "\n";
  for (const auto& f : flags) {
    if (auto group = help_groups().find(f.name); group != help_groups().end()) out << "\n" << group->second << ":\n";
    std::string left = "  --" + f.name;
    if (f.kind != Kind::Bool && f.kind != Kind::NegatedBool && f.kind != Kind::Preset) left += f.kind == Kind::StringList || f.kind == Kind::DoubleList ? " V..." : " V";
    if (left.size() < 36) left.resize(36, ' ');
    const std::string fallback = default_text(f);
    out << left << " " << f.help << (fallback.empty() ? "" : " [default: " + fallback + "]") << "\n";
  }
  // The rest of Megatron-LM's and Pai-Megatron-Patch's flags, so that a launch script's whole
  // argument list is understood: those accepted without effect and those refused for now.
  auto list = [&](MegatronFlag::Fate fate, const char* title) {
    out << "\n" << title << "\n ";
    size_t column = 1;
    for (const auto& f : megatron_flags()) {
      if (f.fate != fate) continue;
      const std::string word = std::string(" --") + f.name;
      if (column + word.size() > 100) out << "\n ", column = 1;
      out << word;
      column += word.size();
    }
    out << "\n";
  };
  list(MegatronFlag::Fate::Ignored, "Megatron flags accepted with a notice, without effect here (a kernel, service or format choice):");
  list(MegatronFlag::Fate::NotYet,
       "Megatron flags not implemented yet: refused with what to use instead, unless given Megatron's default value:");
  return out.str();
}

}  // namespace megatron
