#include "moe/fp8_grouped_linear.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "core/errors.h"
#include "fp8/grouped.h"
#include "tensor_parallel/grad_accumulation.h"

namespace megatron::moe {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool any_requires_grad(at::TensorList weights) {
  for (const at::Tensor& w : weights) {
    if (w.requires_grad()) return true;
  }
  return false;
}

// The layer (owned by its module, which outlives the graph) travels as an integer: autograd's
// saved data holds IValues only.
struct Fp8GroupedLinearFunction : torch::autograd::Function<Fp8GroupedLinearFunction> {
  // x [N, in] -> [N, out]
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& counts, const at::Tensor& ends,
                            int64_t layer_id, at::TensorList weights) {
    auto* layer = reinterpret_cast<Fp8GroupedLinear*>(layer_id);
    const Fp8GroupedLinear::WeightCast& w = layer->weight_cast(weights);
    const at::Tensor y = fp8::grouped_mm_rows(fp8::cast_rows(x), w.rowwise, ends, /*fast_accum=*/true);  // [N, out] bf16
    ctx->saved_data["input_grad"] = x.requires_grad();
    ctx->saved_data["x_dtype"] = int64_t(x.scalar_type());
    ctx->saved_data["counts"] = counts;
    ctx->saved_data["ends"] = ends;
    // The weights' transposed cast is the layer's cache for the step, not an activation: kept
    // apart from the saved tensors (which --cpu-offloading moves to the host).
    ctx->saved_data["weight_t"] = w.transposed.data;
    ctx->saved_data["weight_t_scale_inv"] = w.transposed.scale_inv;
    ctx->saved_data["weights"] = weights.vec();  // the parameters themselves, to find their main_grads
    if (any_requires_grad(weights)) {
      // The weight gradient's x: its columns cast per expert [in, P], the padded ends.
      const fp8::GroupColumns xc = fp8::cast_group_columns(x, counts);
      ctx->save_for_backward({xc.q.data, xc.q.scale_inv, xc.ends});
    } else {
      ctx->save_for_backward({at::Tensor(), at::Tensor(), at::Tensor()});
    }
    return y.to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor counts = ctx->saved_data["counts"].toTensor(), ends = ctx->saved_data["ends"].toTensor();
    const std::vector<at::Tensor> weights = ctx->saved_data["weights"].toTensorVector();
    const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const at::Tensor dy = grads[0].contiguous();  // [N, out]
    variable_list out(4 + weights.size());
    if (ctx->saved_data["input_grad"].toBool()) {
      const fp8::Quantized weight_t{ctx->saved_data["weight_t"].toTensor(), ctx->saved_data["weight_t_scale_inv"].toTensor()};
      out[0] = fp8::grouped_mm_rows(fp8::cast_rows(dy), weight_t, ends, /*fast_accum=*/false).to(x_dtype);  // [N, in]
    }
    if (!saved[0].defined()) return out;
    const fp8::GroupColumns x_columns{{saved[0], saved[1]}, saved[2]};
    const at::Tensor dw = fp8::grouped_mm_groups(fp8::cast_group_columns(dy, counts), x_columns);  // [E, out, in] bf16
    if (!tp::add_to_stacked_main_grads(weights, dw)) {
      for (size_t e = 0; e < weights.size(); ++e) out[4 + e] = dw[int64_t(e)].to(weights[e].scalar_type());
    }
    return out;
  }
};

}  // namespace

Fp8GroupedLinear::Fp8GroupedLinear(std::shared_ptr<fp8::Fp8Context> context, std::string name)
    : context_(std::move(context)), name_(std::move(name)) {}

void Fp8GroupedLinear::check_shapes(int64_t in, int64_t out) const {
  if (in % 16 != 0 || out % 16 != 0) {
    throw UserError("FP8 grouped GEMMs need every expert's dimensions divisible by 16 (" + name_ + ": " + std::to_string(in) +
                    " input and " + std::to_string(out) + " output features on this rank); choose --hidden-size and "
                    "--moe-ffn-hidden-size (divided by --expert-tensor-parallel-size) that are, or train without --fp8-format");
  }
}

const Fp8GroupedLinear::WeightCast& Fp8GroupedLinear::weight_cast(at::TensorList weights) {
  if (weight_.step == context_->step() && weight_.rowwise.data.defined() && weight_.rowwise.data.device() == weights[0].device() &&
      weight_.rowwise.data.size(0) == int64_t(weights.size())) {
    return weight_;
  }
  at::NoGradGuard no_grad;
  const at::Tensor w = tp::stacked(weights).detach();  // [E, out, in]
  WeightCast cast;
  cast.step = context_->step();
  cast.rowwise = fp8::cast_rows(w);
  cast.transposed = fp8::cast_rows(w.transpose(1, 2).contiguous());  // [E, in, out]
  weight_ = std::move(cast);
  return weight_;
}

at::Tensor Fp8GroupedLinear::forward(const at::Tensor& rows, const at::Tensor& counts, const at::Tensor& ends,
                                     at::TensorList weights) {
  TORCH_CHECK(!weights.empty() && counts.numel() == int64_t(weights.size()), name_, ": ", counts.numel(), " row counts for ",
              weights.size(), " experts");
  const int64_t out = weights[0].size(0), in = weights[0].size(1);
  TORCH_CHECK(rows.dim() == 2 && rows.size(1) == in, name_, ": rows ", rows.sizes(), " for weights [", out, ", ", in, "]");
  check_shapes(in, out);
  if (at::GradMode::is_enabled() && (rows.requires_grad() || any_requires_grad(weights))) {
    return Fp8GroupedLinearFunction::apply(rows.contiguous(), counts, ends, reinterpret_cast<int64_t>(this), weights);
  }
  at::NoGradGuard no_grad;
  return fp8::grouped_mm_rows(fp8::cast_rows(rows.contiguous()), weight_cast(weights).rowwise, ends, /*fast_accum=*/true)
      .to(rows.scalar_type());
}

}  // namespace megatron::moe
