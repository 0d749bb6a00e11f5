// The configuration structs every part of the trainer reads. Field names follow Megatron-LM's
// argument names (flag `--num-layers` -> `num_layers`); defaults are Megatron's defaults.
// Filled by train/arguments.cpp from flags and YAML, then validated and completed by
// train/finalize_config.cpp.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace megatron {

struct ModelFamily;  // model/family.h

struct ModelConfig {
  // The family record (presets, HF mapping, layer spec, FLOPs) this model is built from; null:
  // the built-in family whose fields these are (family_of). A program with a family of its own
  // sets it; it is not saved: the process that loads a checkpoint names the family again.
  const ModelFamily* family = nullptr;

  int num_layers = 0;
  int hidden_size = 0;
  int ffn_hidden_size = 0;       // 0: derived (4h, or Megatron's SwiGLU rule)
  int num_attention_heads = 0;
  bool group_query_attention = false;
  int num_query_groups = 0;      // 0: = num_attention_heads (multi-head attention)
  int kv_channels = 0;           // head dim; 0: hidden_size / num_attention_heads
  int seq_length = 0;
  int max_position_embeddings = 0;

  int vocab_size = 0;            // tokenizer vocabulary (before padding)
  int make_vocab_size_divisible_by = 128;
  int padded_vocab_size = 0;     // derived: vocab padded as Megatron does
  int padded_vocab_size_flag = 0;  // --padded-vocab-size: the embedding rows exactly (0: derived)
  int hf_vocab_size = 0;         // rows of the HF checkpoint loaded (--load-hf); the padding covers them
  // Pai-Megatron-Patch's --extra-vocab-size: the embedding rows are the tokenizer's base vocabulary
  // (without its added tokens) plus this many, unpadded (0: Megatron's padding).
  int extra_vocab_size = 0;
  // Multi-token prediction layers an HF checkpoint carries after the decoder (DeepSeek-V3's
  // model.layers.61) that this model does not build: left unread, and said so at start-up.
  int hf_mtp_layers = 0;

  std::string normalization = "LayerNorm";  // LayerNorm | RMSNorm
  double norm_epsilon = 1e-5;
  // --apply-layernorm-1p (Megatron's layernorm_zero_centered_gamma): every norm's weight is
  // stored as gamma - 1 (initialised to zeros) and applied as 1 + weight.
  bool layernorm_zero_centered_gamma = false;
  bool swiglu = false;
  bool add_bias_linear = true;   // --disable-bias-linear clears it
  bool add_qkv_bias = false;     // Qwen2: bias on linear_qkv only
  bool qk_layernorm = false;     // Qwen3: per-head RMSNorm on q and k

  std::string position_embedding_type = "learned_absolute";  // learned_absolute | rope | none
  double rotary_base = 10000.0;
  double rotary_percent = 1.0;
  double rotary_seq_len_interpolation_factor = 1.0;  // positions divided by this (linear RoPE scaling)
  bool use_rope_scaling = false;      // Llama 3.1 frequency scaling
  double rope_scaling_factor = 8.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int rope_original_max_position_embeddings = 8192;

  // YaRN (--rope-type yarn; DeepSeek): frequencies below the original context's band slowed by
  // --rotary-scaling-factor, the band between blended; cos/sin scaled by get_mscale(factor,
  // mscale) / get_mscale(factor, mscale_all_dim). "" = rope: plain, or Llama 3.1 scaling above.
  std::string rope_type;
  double rotary_scaling_factor = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
  int yarn_original_max_position_embeddings = 4096;
  double yarn_beta_fast = 32.0;
  double yarn_beta_slow = 1.0;

  // Multi-latent attention (DeepSeek-V2/V3, --multi-latent-attention; model/mla): queries through
  // a low-rank latent (q_lora_rank; 0: one projection), keys and values up-projected from a shared
  // latent (kv_lora_rank) plus one rotary key shared by all heads.
  bool multi_latent_attention = false;
  int q_lora_rank = 0;
  int kv_lora_rank = 32;
  int qk_head_dim = 128;          // per head, the query / key channels without rotary (HF qk_nope_head_dim)
  int qk_pos_emb_head_dim = 64;   // per head, the rotary channels (HF qk_rope_head_dim)
  int v_head_dim = 128;

  // Multi-token prediction (DeepSeek-V3, --mtp-num-layers; model/mtp): depths after the decoder,
  // each predicting one more token ahead; the objective adds scaling / D x their losses' sum.
  int mtp_num_layers = 0;
  // --cp-comm-type under context parallelism: p2p (ring), all_gather or a2a (Ulysses); one for
  // every layer, or one per layer (Megatron's list form).
  std::vector<std::string> cp_comm_type = {"p2p"};
  const std::string& cp_comm_type_of(int layer) const { return cp_comm_type.size() == 1 ? cp_comm_type[0] : cp_comm_type.at(size_t(layer)); }
  double mtp_loss_scaling_factor = 0.1;

  bool untie_embeddings_and_output_weights = false;
  double init_method_std = 0.02;
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;

  // Fused kernels (src/kernels; CUDA kernels on GPU, the same math composed from ATen ops
  // elsewhere), each on by default since each computes what the unfused path does up to fp32
  // rounding: --no-rope-fusion, --no-bias-swiglu-fusion, --no-bias-dropout-fusion,
  // --no-cross-entropy-loss-fusion (off by default in Megatron; its --cross-entropy-loss-fusion is
  // accepted). Runtime choices, not part of the model's saved config.
  bool apply_rope_fusion = true;
  bool bias_swiglu_fusion = true;
  bool cross_entropy_loss_fusion = true;
  // The residual add (bias-dropout-add without bias or dropout) fused with the RMSNorm after it
  // (--no-bias-dropout-fusion turns it off).
  bool bias_dropout_fusion = true;

  // Mixture of experts (Megatron-Core's --num-experts / --moe-* flags; src/moe). num_experts 0:
  // every layer's feed-forward is the dense MLP.
  int num_experts = 0;
  int moe_ffn_hidden_size = 0;        // each expert's hidden size; 0: ffn_hidden_size
  // Which layers are MoE: "N" every N-th layer from the first, or Megatron's Python list form
  // "([0]*1+[1]*47)" / "[1,0,1,...]" with one entry per layer. Expanded into moe_layers.
  std::string moe_layer_freq = "1";
  std::vector<int> moe_layers;        // derived: 1 where layer i is an MoE layer
  int moe_router_topk = 2;
  bool moe_router_pre_softmax = false;  // softmax over all experts before top-k, no renormalisation
  std::string moe_router_score_function = "softmax";  // softmax | sigmoid
  double moe_router_topk_scaling_factor = 0.0;       // 0: none
  std::string moe_router_dtype;       // "" (the activations') | fp32 | fp64: the router's logits and scores
  bool moe_router_force_load_balancing = false;      // random logits (benchmarks)
  // DeepSeek-V3's auxiliary-loss-free balancing: a per-expert bias added to the scores when
  // choosing experts (not to the weights), moved after each step by rate x sign(mean - count).
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  // Group-limited routing: experts in num_groups groups, a token's experts from its group_topk
  // best groups (a group scored by the sum of its top topk / group_topk scores). 0: off.
  int moe_router_num_groups = 0;
  int moe_router_group_topk = 0;
  // Load-balancing losses, one coefficient each (Megatron's lists: --moe-router-load-balancing-type
  // seq_aux_loss global_aux_loss --moe-aux-loss-coeff 1e-3 1e-4); types: aux_loss | seq_aux_loss |
  // global_aux_loss | none. A single coefficient goes with a single type.
  std::vector<std::string> moe_router_load_balancing_type = {"aux_loss"};
  std::vector<double> moe_aux_loss_coeff = {0.0};
  double moe_z_loss_coeff = 0.0;      // 0: no z-loss
  // Token dropping: each expert takes at most ceil(T k / E x factor) of a rank's T tokens; 0: dropless.
  double moe_expert_capacity_factor = 0.0;
  std::string moe_token_drop_policy = "probs";  // probs (keep the highest weights) | position (keep the first tokens)
  bool moe_pad_expert_input_to_capacity = false;
  int moe_shared_expert_intermediate_size = 0;  // 0: no shared experts
  bool moe_shared_expert_gate = false;          // Qwen2-MoE's sigmoid gate on the shared experts' output
  bool moe_shared_expert_overlap = false;       // shared experts on a stream of their own beside the routed ones (CUDA)
  // On by default here (off in Megatron, whose --moe-grouped-gemm / --moe-permute-fusion are
  // accepted): the same arithmetic up to rounding, faster on CUDA; --no-moe-grouped-gemm,
  // --no-moe-permute-fusion turn them off.
  bool moe_grouped_gemm = true;       // experts as one grouped GEMM (CUDA), else one GEMM per expert
  std::string moe_token_dispatcher_type = "allgather";  // allgather | alltoall
  bool moe_permute_fusion = true;     // token permutations as gather kernels (CUDA), else ATen's index ops

  bool is_moe_layer(int layer) const {
    return num_experts > 0 && layer >= 0 && size_t(layer) < moe_layers.size() && moe_layers[size_t(layer)] != 0;
  }
  // The layers after the decoder use the word embedding: as a tied output layer, or for the
  // multi-token prediction depths' embeddings. Under pipeline parallelism the last stage then
  // holds a copy of it, kept equal to the first stage's.
  bool output_uses_word_embeddings() const { return !untie_embeddings_and_output_weights || mtp_num_layers > 0; }
  int expert_ffn_hidden_size() const { return moe_ffn_hidden_size > 0 ? moe_ffn_hidden_size : ffn_hidden_size; }
  // The coefficient of load-balancing loss `type` (Megatron's get_aux_loss_coeff): 0 when not used.
  double aux_loss_coeff(const std::string& type) const {
    for (size_t i = 0; i < moe_router_load_balancing_type.size() && i < moe_aux_loss_coeff.size(); ++i) {
      if (moe_router_load_balancing_type[i] == type) return moe_aux_loss_coeff[i];
    }
    return 0.0;
  }
  // --moe-router-load-balancing-type sinkhorn: the router balances by Sinkhorn iterations
  // (moe/router.cpp), no load-balancing loss; sinkhorn is then the only type.
  bool routes_by_sinkhorn() const {
    return num_experts > 0 && !moe_router_load_balancing_type.empty() && moe_router_load_balancing_type.front() == "sinkhorn";
  }
  int num_moe_layers() const {
    int n = 0;
    for (int v : moe_layers) n += v;
    return num_experts > 0 ? n : 0;
  }

  // Activation recomputation (Megatron's flags; runtime choices, not saved with the model).
  // full: whole layers keep only their input and run again in the backward, in groups of
  // recompute_num_layers layers (uniform) or only the first recompute_num_layers layers of each
  // model chunk (block). selective: only core attention (--recompute-activations says the same).
  std::string recompute_granularity;  // "" | full | selective
  std::string recompute_method;       // uniform | block (full only)
  int recompute_num_layers = 0;
  bool recompute_activations = false;  // read as recompute_granularity = selective
  // With selective: what is recomputed (Megatron's --recompute-modules): core_attn, mlp (dense
  // MLPs), moe, moe_act, shared_experts, mla_up_proj, layernorm.
  std::vector<std::string> recompute_modules = {"core_attn"};
  // Whether selective recomputation covers `module` (a --recompute-modules name).
  bool selectively_recomputes(const std::string& module) const {
    if (recompute_granularity != "selective") return false;
    for (const auto& m : recompute_modules) {
      if (m == module) return true;
    }
    return false;
  }

  // Megatron's --cpu-offloading / --cpu-offloading-num-layers N (a runtime choice): the first N
  // decoder layers' saved activations go to host memory during the forward and come back during
  // the backward (core/activation_offload.h). N > 0 turns it on, as in Megatron.
  bool cpu_offloading = false;
  int cpu_offloading_num_layers = 0;
  // Tensors of fewer elements stay on the device (Megatron's --min-offloaded-tensor-size, which it
  // reads for its fine-grained offloading).
  int64_t min_offloaded_tensor_size = int64_t(1) << 20;

  // FP8 linear layers (Megatron's --fp8-* flags; runtime choices, not saved with the model):
  // the GEMMs of the decoder layers' linear layers take FP8 inputs (src/fp8).
  std::string fp8;                            // "" (off) | e4m3 | hybrid (e5m2 gradients)
  std::string fp8_recipe = "delayed";         // tensorwise | delayed | blockwise
  int fp8_margin = 0;                         // delayed: scales divided by 2^margin
  int fp8_amax_history_len = 1;               // delayed: the amaxes a scale is chosen from
  std::string fp8_amax_compute_algo = "most_recent";  // delayed: most_recent | max
  bool fp8_wgrad = true;                      // false: weight gradients from the high-precision inputs
  bool tp_only_amax_red = false;              // delayed: amaxes reduced over TP only (default TP x DP)
  bool first_last_layers_bf16 = false;        // the first and last layers' GEMMs stay in bf16
  int num_layers_at_start_in_bf16 = 1;
  int num_layers_at_end_in_bf16 = 1;
  // Whether decoder layer `layer` (global index) runs its linear layers in FP8.
  bool fp8_layer(int layer) const {
    if (fp8.empty()) return false;
    return !first_last_layers_bf16 || (layer >= num_layers_at_start_in_bf16 && layer < num_layers - num_layers_at_end_in_bf16);
  }

  int head_dim() const { return kv_channels; }
  int query_groups() const { return num_query_groups; }
};

struct ParallelConfig {
  int tensor_model_parallel_size = 1;
  int pipeline_model_parallel_size = 1;
  // Interleaved 1F1B: model chunks per pipeline rank (set directly or from
  // --num-layers-per-virtual-pipeline-stage); 1 = plain 1F1B.
  int num_virtual_stages_per_pipeline_rank = 1;
  int num_layers_per_virtual_pipeline_stage = 0;
  // Uneven pipeline splits: layers on the first / last stage (0: an even share).
  int decoder_first_pipeline_num_layers = 0;
  int decoder_last_pipeline_num_layers = 0;
  int context_parallel_size = 1;
  // --cp-comm-type a2a+p2p: the CP group's two levels, [a2a, p2p] (product = CP): all-to-all
  // among a2a adjacent CP ranks, the ring among the ranks that hold the same position in theirs.
  std::vector<int> hierarchical_context_parallel_sizes;
  int expert_model_parallel_size = 1;
  // Each expert's weights split over this many ranks (Megatron's expert TP); 0: the TP size.
  int expert_tensor_parallel_size = 0;
  bool sequence_parallel = false;
  bool use_distributed_optimizer = false;
  bool overlap_grad_reduce = false;   // reduce gradient buckets while backward runs
  bool overlap_param_gather = false;  // distributed optimizer: all-gather layer by layer into the next forward
  bool gradient_accumulation_fusion = true;  // weight-gradient GEMMs add into fp32 main_grad (--no-gradient-accumulation-fusion)
  int64_t ddp_bucket_size = 0;        // elements per gradient bucket; 0: max(40M, 1M x DP) as Megatron
  // --grad-reduce-in-bf16: main_grad in bf16, so gradients are accumulated over micro-batches and
  // reduced over DP in bf16 (half the bytes of Megatron's default fp32); masters stay fp32.
  bool grad_reduce_in_bf16 = false;
  std::string distributed_backend;    // nccl | gloo; "": nccl on CUDA, gloo on CPU
  double distributed_timeout_minutes = 10.0;
  int data_parallel_size = 1;    // derived: world / (tp * pp * cp)
};

struct DataConfig {
  std::vector<std::string> data_path;   // prefixes of .bin/.idx (optionally weighted)
  // Megatron's --train-data-path / --valid-data-path / --test-data-path: each split from its own
  // prefixes (optionally weighted), each whole, instead of --data-path cut by --split.
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  bool per_split_data() const { return !train_data_path.empty() || !valid_data_path.empty() || !test_data_path.empty(); }
  std::string split = "969, 30, 1";
  bool mock_data = false;
  bool sft = false;                     // --data-path is a packed SFT dataset (preprocess --sft)
  std::string data_cache_path;          // where GPTDataset index caches go ("": next to the data)
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
  std::string tokenizer_type;           // HuggingFaceTokenizer | GPT2BPETokenizer | SentencePieceTokenizer | TikTokenizer | NullTokenizer
  std::string tokenizer_model;
  // TikTokenizer's (tokenizer/tiktoken_tokenizer.h): the split pattern ("" = v2), the special
  // tokens in front of the ranks, and their names (empty: Megatron's seven, then fillers).
  std::string tiktoken_pattern;
  int64_t tiktoken_num_special_tokens = 1000;
  std::vector<std::string> tokenizer_special_tokens;
  std::string patch_tokenizer_type;     // Pai-Megatron-Patch: an HF tokenizer read from --load (see finalize_config)
  std::string vocab_file;
  std::string merge_file;
  int64_t eod_id = -1;                  // derived from the tokenizer
};

struct TrainConfig {
  int micro_batch_size = 1;
  int global_batch_size = 0;     // 0: micro_batch_size * data_parallel_size
  // --step-batch-size-schedule "THRESHOLD:BS ...": the global batch grows with the tokens
  // consumed (train/batch_schedule.h); "" = --global-batch-size throughout.
  std::string step_batch_size_schedule;
  int64_t train_iters = 0;
  // Megatron's sample-based schedule: --train-samples sets train_iters = samples / global batch,
  // and the learning rate then counts samples (--lr-decay-samples, --lr-warmup-samples,
  // --lr-wsd-decay-samples) instead of iterations.
  int64_t train_samples = 0;
  int64_t lr_decay_samples = 0;  // 0: = train_samples
  int64_t lr_warmup_samples = 0;
  int64_t lr_wsd_decay_samples = 0;
  double lr_warmup_fraction = -1.0;  // >= 0: warm-up over this fraction of the decay (iterations or samples)
  double exit_duration_in_mins = 0;  // > 0: save and stop once the run is this old
  // Megatron's --iterations-to-skip: these iterations consume their global batch without
  // training on it (the way past a batch that spikes the loss); the learning rate does not move.
  std::vector<int> iterations_to_skip;
  // Megatron's --exit-signal: a signal that saves and stops the run as SIGTERM and SIGINT do
  // (SIGUSR1 for SLURM's --signal=USR1@120); `megatron launch` passes SIGUSR1/2 on to the ranks.
  std::string exit_signal = "SIGTERM";
  bool log_throughput = false;       // Megatron's TFLOP/s field in the log line
  // --calculate-per-token-loss: the gradient is the sum over every loss token of the global batch
  // divided by their count (not the mean of per-micro-batch means).
  bool calculate_per_token_loss = false;
  // --decoupled-lr / --decoupled-min-lr: the embedding and output layer follow the same schedule
  // from this peak (and floor); < 0: Megatron's None (the other parameters' values).
  double decoupled_lr = -1.0;
  double decoupled_min_lr = -1.0;
  // Megatron's optional TensorBoard series and log-line fields.
  // --no-check-for-nan-in-loss-and-grad turns it off: a step whose loss or gradient norm is not
  // finite is then skipped and counted instead of stopping the run (train/divergence_check.h).
  bool check_for_nan_in_loss_and_grad = true;
  bool log_params_norm = false;       // "params norm" (after each step)
  bool log_num_zeros_in_grad = false; // "num zeros" of the reduced gradients
  bool log_timers_to_tensorboard = false;           // iteration-time, throughput
  bool log_memory_to_tensorboard = false;           // mem-* of the CUDA allocator
  bool log_world_size_to_tensorboard = false;       // world-size
  bool log_validation_ppl_to_tensorboard = false;   // "<loss> validation ppl"

  double lr = 0.0;
  double min_lr = 0.0;
  std::string lr_decay_style = "linear";  // constant | linear | cosine | inverse-square-root | WSD
  int64_t lr_warmup_iters = 0;
  int64_t lr_decay_iters = 0;    // 0: = train_iters
  double lr_warmup_init = 0.0;
  std::string lr_wsd_decay_style = "exponential";  // linear | cosine | exponential | minus_sqrt
  int64_t lr_wsd_decay_iters = 0;

  double weight_decay = 0.01;
  // Megatron's weight-decay schedule: constant (--weight-decay throughout), or linear / cosine
  // from --start-weight-decay to --end-weight-decay over the run. -1: not given.
  std::string weight_decay_incr_style = "constant";
  double start_weight_decay = -1.0;
  double end_weight_decay = -1.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double clip_grad = 1.0;
  // megatron.cpp's own: on CUDA the optimizer steps bucket by bucket on a stream of its own
  // while the next forward starts on the buckets already stepped (first layers first).
  bool overlap_optimizer_step = false;

  bool bf16 = false;
  // --fp16: fp16 parameters and activations, fp32 master weights and gradients, the loss scaled
  // before backward (Megatron's DynamicGradScaler, or a constant --loss-scale): a step whose
  // gradients overflow is skipped and the scale backs off.
  bool fp16 = false;
  double loss_scale = 0.0;  // > 0: this constant scale; 0: dynamic
  double initial_loss_scale = 4294967296.0;  // 2^32
  double min_loss_scale = 1.0;
  double loss_scale_window = 1000;  // overflow-free steps before the scale doubles
  int64_t hysteresis = 2;           // overflowing steps in a row before the scale halves
  // --use-precision-aware-optimizer: the optimizer's state in lower precision (Megatron's
  // --main-params-dtype fp32|fp16, --exp-avg-dtype / --exp-avg-sq-dtype fp32|bf16|fp16; the
  // kernel computes in fp32 whatever it stores). --main-grads-dtype bf16 is --grad-reduce-in-bf16.
  bool use_precision_aware_optimizer = false;
  std::string main_grads_dtype = "fp32";
  std::string main_params_dtype = "fp32";
  std::string exp_avg_dtype = "fp32";
  std::string exp_avg_sq_dtype = "fp32";
  // --optimizer-cpu-offload (Megatron's HybridDeviceOptimizer; optim/host_optimizer.h): the
  // optimizer state of the first --optimizer-offload-fraction of each rank's parameters in host
  // memory, stepped by the CPU; --overlap-cpu-optimizer-d2h-h2d overlaps the copies with it.
  bool optimizer_cpu_offload = false;
  double optimizer_offload_fraction = 1.0;
  bool overlap_cpu_optimizer_d2h_h2d = false;
  int64_t seed = 1234;

  int64_t log_interval = 100;
  int64_t eval_interval = 1000;
  int64_t eval_iters = 100;
  std::string tensorboard_dir;
  // --profile: record iterations [profile_step_start, profile_step_end) on profile_ranks with
  // the PyTorch (Kineto) profiler; Chrome trace + a table of where the time went.
  bool profile = false;
  int64_t profile_step_start = 10;
  int64_t profile_step_end = 12;
  std::vector<std::string> profile_ranks = {"0"};
  std::string metrics_jsonl;     // one JSON line per iteration with exact loss / grad norm / lr

  std::string save;
  std::string load;
  int64_t save_interval = 0;
  int64_t exit_interval = 0;
  bool no_load_optim = false;
  // Resuming with the optimizer, Megatron checks the schedule the flags give (peak and minimum
  // learning rate, warm-up and decay lengths, decay style, weight-decay schedule) against the one
  // the checkpoint was saved with and refuses a difference. --override-opt-param-scheduler
  // takes the flags' schedule at the run's position, --use-checkpoint-opt-param-scheduler the
  // checkpoint's.
  bool override_opt_param_scheduler = false;
  bool use_checkpoint_opt_param_scheduler = false;
  // Megatron's --ckpt-step: load iteration N under --load, not the one its tracker names (-1).
  int64_t ckpt_step = -1;
  // Megatron's --exit-on-missing-checkpoint: nothing to load under --load is an error, not a
  // fresh start.
  bool exit_on_missing_checkpoint = false;
  bool no_save_optim = false;  // checkpoints without optimizer state (resumed with --no-load-optim)
  bool no_save_rng = false;    // checkpoints without generator states (resumed with --no-load-rng)
  bool no_load_rng = false;
  bool async_save = false;       // write checkpoints on a thread from host copies while training goes on
  int64_t keep_last_n = 0;       // keep only the newest N checkpoints under --save (0: all)
  bool finetune = false;         // load weights only: iteration 0, fresh optimizer and generators
  bool skip_train = false;       // Megatron's --skip-train: evaluate the loaded weights instead (`megatron eval`)
  std::string load_hf;           // start from this Hugging Face model directory
  bool use_checkpoint_args = false;  // Megatron's: the model (and tokenizer) recorded by the --load checkpoint
  std::string save_hf;           // export the trained model there as a Hugging Face model

  int64_t check_weight_hash_across_dp_replicas_interval = 0;  // 0: never

  // --cuda-graph-impl local --cuda-graph-scope full_iteration (Megatron's flags; --enable-cuda-graph
  // is the older spelling of the first): after --cuda-graph-warmup-steps eager iterations the
  // whole training step is captured as one CUDA graph and replayed (train/step_graph.h).
  std::string cuda_graph_impl = "none";  // none | local
  bool enable_cuda_graph = false;         // read as cuda_graph_impl = local
  std::string cuda_graph_scope = "full_iteration";
  int64_t cuda_graph_warmup_steps = 3;

  std::string device = "auto";   // auto | cpu | cuda
  int cpu_threads = 0;           // 0: one per core
  double peak_tflops = 0.0;      // MFU denominator; 0: 989 on CUDA (H100/H200 dense bf16), none on CPU
};

struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  DataConfig data;
  TrainConfig train;
  std::set<std::string> explicit_flags;  // flags given on the command line or in the recipe
  // Megatron flags accepted without effect (train/megatron_flags.h): one line each, printed by rank 0.
  std::vector<std::string> flag_notices;
};

}  // namespace megatron
