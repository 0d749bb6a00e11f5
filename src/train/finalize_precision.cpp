// The precision flags' checks and derived fields (part of finalize_config): --fp16 and its loss
// scaling, the precision-aware optimizer's dtypes, the optimizer's CPU offload and FP8. Each
// problem is an error naming the flag.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/errors.h"
#include "train/precision.h"

namespace megatron {
namespace {

// Megatron's precision-aware optimizer flags. The moments may be bf16; fp16 and fp8 moments (and
// fp16 masters) need the per-tensor scaling TransformerEngine adds, not built here: refused rather
// than run with moments that underflow. Without --use-precision-aware-optimizer Megatron ignores
// the dtypes; so does this, with a notice.
void finalize_optimizer_precision(Config& c) {
  TrainConfig& t = c.train;
  struct Choice {
    const char* flag;
    std::string* value;
    std::vector<std::string> built;
    std::vector<std::string> megatron;  // Megatron's choices
  };
  Choice choices[] = {{"main-grads-dtype", &t.main_grads_dtype, {"fp32", "bf16"}, {"fp32", "bf16"}},
                      {"main-params-dtype", &t.main_params_dtype, {"fp32"}, {"fp32", "fp16"}},
                      {"exp-avg-dtype", &t.exp_avg_dtype, {"fp32", "bf16"}, {"fp32", "fp16", "bf16", "fp8"}},
                      {"exp-avg-sq-dtype", &t.exp_avg_sq_dtype, {"fp32", "bf16"}, {"fp32", "fp16", "bf16", "fp8"}}};
  auto among = [](const std::string& v, const std::vector<std::string>& list) { return std::find(list.begin(), list.end(), v) != list.end(); };
  for (Choice& ch : choices) {
    if (!among(*ch.value, ch.megatron)) {
      std::string list;
      for (const auto& m : ch.megatron) list += (list.empty() ? "" : ", ") + m;
      throw UserError(std::string("--") + ch.flag + " must be one of " + list + " (got '" + *ch.value + "')");
    }
    if (*ch.value == "fp32") continue;
    if (!t.use_precision_aware_optimizer) {
      c.flag_notices.push_back(std::string("--") + ch.flag + " " + *ch.value +
                               " has no effect without --use-precision-aware-optimizer (as in Megatron): fp32");
      *ch.value = "fp32";
      continue;
    }
    if (!among(*ch.value, ch.built)) {
      throw UserError(std::string("--") + ch.flag + " " + *ch.value + " is not implemented yet: " +
                      (ch.built.size() > 1 ? "bf16 keeps fp32's range (fp16 and fp8 state needs per-tensor scaling); use bf16"
                                           : "the master weights stay fp32"));
    }
  }
  if (t.main_grads_dtype == "bf16") {
    if (!t.bf16) throw UserError("--main-grads-dtype bf16 needs --bf16: the gradients are kept in the bf16 parameters' dtype");
    c.parallel.grad_reduce_in_bf16 = true;  // the same thing under its other name
  }
}

// --optimizer-cpu-offload and its companions, with Megatron's rule (it rides on the
// precision-aware optimizer) and ours (no device-side step overlap or captured step to mix with).
void validate_cpu_offload(const Config& c) {
  const TrainConfig& t = c.train;
  if (!(t.optimizer_offload_fraction >= 0.0 && t.optimizer_offload_fraction <= 1.0)) {
    throw UserError("--optimizer-offload-fraction must be between 0 and 1 (got " + std::to_string(t.optimizer_offload_fraction) + ")");
  }
  if (!t.optimizer_cpu_offload) return;
  if (!t.use_precision_aware_optimizer) {
    throw UserError("--optimizer-cpu-offload needs --use-precision-aware-optimizer (as in Megatron, whose hybrid optimizer "
                    "rides on it); add it, with --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 to halve the host memory");
  }
  if (t.overlap_optimizer_step) throw UserError("--optimizer-cpu-offload and --overlap-optimizer-step do not go together: drop one");
  if (t.cuda_graph_impl != "none" || t.enable_cuda_graph) {
    throw UserError("--optimizer-cpu-offload steps on the host, which a captured CUDA graph cannot replay: drop --cuda-graph-impl");
  }
}

// --fp16 and Megatron's loss-scaling flags (which, as Megatron, mean nothing without it).
void validate_loss_scaling(const TrainConfig& t) {
  if (t.fp16 && t.bf16) throw UserError("--fp16 and --bf16 exclude each other: give one");
  auto positive = [](const char* flag, double v) {
    if (!(v > 0.0) || !std::isfinite(v)) throw UserError(std::string("--") + flag + " must be a positive number (got " + std::to_string(v) + ")");
  };
  if (t.loss_scale != 0.0) positive("loss-scale", t.loss_scale);
  positive("initial-loss-scale", t.initial_loss_scale);
  positive("min-loss-scale", t.min_loss_scale);
  positive("loss-scale-window", t.loss_scale_window);
  if (t.hysteresis <= 0) throw UserError("--hysteresis must be a positive count (got " + std::to_string(t.hysteresis) + ")");
  if (t.loss_scale == 0.0 && t.min_loss_scale > t.initial_loss_scale) {
    throw UserError("--min-loss-scale " + std::to_string(t.min_loss_scale) + " exceeds --initial-loss-scale " +
                    std::to_string(t.initial_loss_scale));
  }
}

// --fp8-*: Megatron's choices, named in each error. mxfp8 (Blackwell) and custom quantizer
// factories (Python) are not built; the experts of MoE layers keep bf16 GEMMs.
void finalize_fp8(Config& c) {
  ModelConfig& m = c.model;
  if (m.fp8.empty()) return;
  if (m.fp8 != "e4m3" && m.fp8 != "hybrid") throw UserError("--fp8-format must be e4m3 or hybrid (got '" + m.fp8 + "')");
  if (m.fp8_recipe == "mxfp8" || m.fp8_recipe == "custom") {
    throw UserError("--fp8-recipe " + m.fp8_recipe + " is not implemented yet" +
                    (m.fp8_recipe == "mxfp8" ? " (Blackwell's MXFP8); use blockwise, the Hopper recipe closest to it"
                                             : " (a Python quantizer factory); use tensorwise, delayed or blockwise"));
  }
  if (m.fp8_recipe != "tensorwise" && m.fp8_recipe != "delayed" && m.fp8_recipe != "blockwise") {
    throw UserError("--fp8-recipe must be tensorwise, delayed or blockwise (got '" + m.fp8_recipe + "')");
  }
  if (m.fp8_amax_compute_algo != "max" && m.fp8_amax_compute_algo != "most_recent") {
    throw UserError("--fp8-amax-compute-algo must be max or most_recent (got '" + m.fp8_amax_compute_algo + "')");
  }
  if (m.fp8_amax_history_len < 1) throw UserError("--fp8-amax-history-len must be at least 1 (got " + std::to_string(m.fp8_amax_history_len) + ")");
  if (m.fp8_margin < 0 || m.fp8_margin > 64) throw UserError("--fp8-margin must be between 0 and 64 (got " + std::to_string(m.fp8_margin) + ")");
  if (m.first_last_layers_bf16) {
    // As Megatron: the delayed recipe's amax reduction spans every FP8 layer of a step.
    if (m.fp8_recipe == "delayed") throw UserError("--first-last-layers-bf16 does not work with --fp8-recipe delayed (as in Megatron); use tensorwise or blockwise");
    const int per_stage = m.num_layers / std::max(1, c.parallel.pipeline_model_parallel_size);
    for (auto [flag, n] : {std::pair{"num-layers-at-start-in-bf16", m.num_layers_at_start_in_bf16},
                           std::pair{"num-layers-at-end-in-bf16", m.num_layers_at_end_in_bf16}}) {
      if (n < 0 || n > per_stage) {
        throw UserError(std::string("--") + flag + " must be between 0 and the layers per pipeline stage, " + std::to_string(per_stage) +
                        " (got " + std::to_string(n) + ")");
      }
    }
  }
  if (m.num_experts > 0) {
    c.flag_notices.push_back("--fp8-format: the MoE layers' experts run FP8 grouped GEMMs scaled per row (per token, per "
                             "weight row; the only scaling of the grouped FP8 GEMM), e4m3 for their gradients too, "
                             "whatever --fp8-recipe and --fp8-format say; attention, dense MLPs and shared experts follow the recipe");
  }
}

}  // namespace

void finalize_precision(Config& c) {
  if (c.parallel.grad_reduce_in_bf16 && !c.train.bf16) {
    throw UserError("--grad-reduce-in-bf16 needs --bf16: the gradients are kept in the bf16 parameters' dtype");
  }
  validate_loss_scaling(c.train);
  finalize_optimizer_precision(c);
  validate_cpu_offload(c);
  finalize_fp8(c);
}

}  // namespace megatron
