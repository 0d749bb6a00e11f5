#include "train/precision.h"

#include <ATen/ATen.h>

#include <cstdio>

#include "core/errors.h"

#include "optim/adamw.h"

namespace megatron {

std::string describe_precision(const TrainConfig& t, const ParallelConfig& p) {
  if (!t.bf16 && !t.fp16) return "fp32";
  std::string details = t.bf16 && stores_param_remainders(t) ? "fp32 master weights as bf16 + 16-bit remainders" : "fp32 master weights";
  details += p.grad_reduce_in_bf16 ? ", bf16 gradients" : t.fp16 ? " and gradients" : "";
  if (t.exp_avg_dtype == "bf16" || t.exp_avg_sq_dtype == "bf16") details += ", Adam moments " + t.exp_avg_dtype + "/" + t.exp_avg_sq_dtype;
  if (t.fp16) {
    char scale[96];
    std::snprintf(scale, sizeof(scale), t.loss_scale > 0 ? ", constant loss scale %g" : ", dynamic loss scale from %g",
                  t.loss_scale > 0 ? t.loss_scale : t.initial_loss_scale);
    details += scale;
  }
  return std::string(t.bf16 ? "bf16" : "fp16") + " (" + details + ")";
}

std::string describe_fp8(const ModelConfig& m) {
  if (m.fp8.empty()) return "";
  std::string line = "> FP8 GEMMs: " + m.fp8 + (m.fp8 == "hybrid" ? " (e4m3 forward, e5m2 gradients)" : " (e4m3)") + ", ";
  if (m.fp8_recipe == "delayed") {
    line += "delayed scaling (amax history " + std::to_string(m.fp8_amax_history_len) + ", " + m.fp8_amax_compute_algo +
            ", margin " + std::to_string(m.fp8_margin) + (m.tp_only_amax_red ? ", reduced over TP" : ", reduced over TP x DP") + ")";
  } else {
    line += m.fp8_recipe == "tensorwise" ? "tensor-wise current scaling" : "blockwise scaling (1x128 activations, 128x128 weights)";
  }
  if (!m.fp8_wgrad) line += ", weight gradients in high precision";
  int first = -1, last = -1;
  for (int i = 0; i < m.num_layers; ++i) {
    if (m.fp8_layer(i)) last = i, first = first < 0 ? i : first;
  }
  line += first < 0 ? ", no layer in FP8" : ", layers " + std::to_string(first) + "-" + std::to_string(last);
  return line + "\n";
}

std::string check_fp8_device(const ModelConfig& m, const at::Device& device) {
  if (m.fp8.empty()) return "";
  if (!device.is_cuda()) {
    return "FP8 on the CPU: the FP8 values multiply in fp32 GEMMs (exact products, as an FP8 GEMM's; no speed-up; for tests)";
  }
  try {
    const at::Tensor a = at::zeros({16, 16}, at::TensorOptions().device(device)).to(at::kFloat8_e4m3fn);
    const at::Tensor one = at::ones({}, at::TensorOptions().device(device).dtype(at::kFloat));
    at::_scaled_mm(a, a.t(), one, one, std::nullopt, std::nullopt, at::kBFloat16);
  } catch (const c10::Error& e) {
    const std::string why = e.what_without_backtrace();
    throw UserError("--fp8-format: this GPU cannot run FP8 GEMMs (" + why.substr(0, why.find('\n')) +
                    "); FP8 needs compute capability 8.9 or 9.0 (Ada, Hopper). Train with --bf16 instead");
  }
  if (m.num_experts > 0) {
    // The experts' grouped FP8 GEMM (fp8/grouped.h) has kernels for Hopper only, not for Ada.
    try {
      const at::TensorOptions on = at::TensorOptions().device(device);
      const at::Tensor a = at::zeros({16, 16}, on).to(at::kFloat8_e4m3fn), b = at::zeros({1, 16, 16}, on).to(at::kFloat8_e4m3fn);
      at::_scaled_grouped_mm(a, b.transpose(1, 2), at::ones({16}, on), at::ones({1, 16}, on),
                             at::full({1}, 16, on.dtype(at::kInt)), std::nullopt, std::nullopt, at::kBFloat16);
    } catch (const c10::Error& e) {
      const std::string why = e.what_without_backtrace();
      throw UserError("--fp8-format with --num-experts: this GPU cannot run the experts' FP8 grouped GEMMs (" +
                      why.substr(0, why.find('\n')) + "); they need compute capability 9.0 (Hopper). Train with --bf16 instead");
    }
  }
  return "";
}

}  // namespace megatron
