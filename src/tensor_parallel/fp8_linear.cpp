#include "tensor_parallel/fp8_linear.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "core/errors.h"
#include "tensor_parallel/grad_accumulation.h"

namespace megatron::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using fp8::Recipe;

enum Role { kInput = 0, kWeight = 1, kGradOutput = 2 };

// The autograd function of one FP8 GEMM. The layer (owned by its module, which outlives the
// graph) travels as an integer: autograd's saved data holds IValues only.
struct Fp8LinearFunction : torch::autograd::Function<Fp8LinearFunction> {
  // x [tokens, in], weight [out, in] -> [tokens, out]
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, int64_t layer_id) {
    auto* layer = reinterpret_cast<Fp8Linear*>(layer_id);
    const fp8::Options& o = layer->context().options();
    const bool weight_grad = weight.requires_grad(), input_grad = x.requires_grad();
    const bool fp8_wgrad = weight_grad && o.wgrad;
    const Fp8Linear::WeightCast& w = layer->weight_cast(weight);
    const fp8::Cast qx = layer->cast_activation(x, kInput, /*rowwise=*/true, /*transposed=*/fp8_wgrad);
    at::Tensor y = fp8::scaled_mm(qx.rowwise, w.rowwise, x.scalar_type(), /*fast_accum=*/true);  // [tokens, out]
    ctx->saved_data["layer"] = layer_id;
    ctx->saved_data["input_grad"] = input_grad;
    // The weight's transposed cast is the layer's cache for the step, not an activation: kept
    // apart from the saved tensors (which --cpu-offloading moves to the host).
    ctx->saved_data["weight_t"] = w.transposed.data;
    ctx->saved_data["weight_t_scale_inv"] = w.transposed.scale_inv;
    // The parameter itself: its main_grad registration is keyed by this TensorImpl, which a saved
    // variable with hooks would hand back as a copy.
    ctx->saved_data["weight"] = weight;
    // The weight gradient's x: its transposed FP8 copy [in, tokens], or x itself.
    if (fp8_wgrad) {
      ctx->save_for_backward({qx.transposed.data, qx.transposed.scale_inv});
    } else {
      ctx->save_for_backward({weight_grad ? x : at::Tensor(), at::Tensor()});
    }
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* layer = reinterpret_cast<Fp8Linear*>(ctx->saved_data["layer"].toInt());
    const bool input_grad = ctx->saved_data["input_grad"].toBool();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor weight = ctx->saved_data["weight"].toTensor();
    const fp8::Quantized weight_t{ctx->saved_data["weight_t"].toTensor(), ctx->saved_data["weight_t_scale_inv"].toTensor()};
    const bool weight_grad = weight.requires_grad();
    const bool fp8_wgrad = weight_grad && layer->context().options().wgrad;
    const at::Tensor dy = grads[0].contiguous();  // [tokens, out]
    const fp8::Cast qdy = layer->cast_activation(dy, kGradOutput, /*rowwise=*/input_grad, /*transposed=*/fp8_wgrad);
    at::Tensor dx;
    if (input_grad) dx = fp8::scaled_mm(qdy.rowwise, weight_t, dy.scalar_type());  // [tokens, in]
    if (!weight_grad) return {dx, at::Tensor(), at::Tensor()};

    const MainGradTarget* target = main_grad_target(weight);
    at::Tensor dw;  // [out, in]
    auto compute = [&](const at::Tensor& into, at::ScalarType type) {
      if (fp8_wgrad) return fp8::scaled_mm(qdy.transposed, {saved[0], saved[1]}, type, false, into);
      const at::Tensor x = saved[0];  // [tokens, in], high precision
      at::Tensor r = at::mm(dy.t(), x).to(type);
      if (into.defined()) into.copy_(r);
      return into.defined() ? into : r;
    };
    if (target == nullptr) {
      dw = compute({}, weight.scalar_type());
      return {dx, dw, at::Tensor()};
    }
    at::NoGradGuard no_grad;
    at::Tensor main_grad = target->main_grad;
    const bool first = target->first_add();  // main_grad holds no gradient of this step yet (nor zeros)
    if (first && main_grad.is_contiguous()) {
      compute(main_grad, main_grad.scalar_type());  // written in place by the GEMM
    } else if (first) {
      main_grad.copy_(compute({}, at::kFloat));
    } else {
      main_grad.add_(compute({}, at::kFloat));
    }
    target->on_added();
    return {dx, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

Fp8Linear::Fp8Linear(std::shared_ptr<fp8::Fp8Context> context, std::string name)
    : context_(std::move(context)), name_(std::move(name)) {
  const fp8::Options& o = context_->options();
  if (o.recipe == Recipe::Delayed) {
    columns_[kInput] = context_->delayed().add(fp8::max_finite(o.forward_type));
    columns_[kWeight] = context_->delayed().add(fp8::max_finite(o.forward_type));
    columns_[kGradOutput] = context_->delayed().add(fp8::max_finite(o.backward_type));
  }
}

void Fp8Linear::check_shapes(int64_t tokens, int64_t in, int64_t out, const at::Device& device) const {
  auto dims = [&] {
    return " (" + name_ + ": " + std::to_string(tokens) + " tokens of the micro-batch, " + std::to_string(in) +
           " input and " + std::to_string(out) + " output features on this rank)";
  };
  if (context_->options().recipe == Recipe::Blockwise && (tokens % 128 != 0 || in % 128 != 0 || out % 128 != 0)) {
    throw UserError("--fp8-recipe blockwise casts tiles of 128: every GEMM dimension must be a multiple of 128" + dims() +
                    "; choose sizes (--seq-length x --micro-batch-size, --hidden-size, --ffn-hidden-size, heads x "
                    "--kv-channels, divided by --tensor-model-parallel-size) that are, or use --fp8-recipe tensorwise");
  }
  if (device.is_cuda() && (tokens % 16 != 0 || in % 16 != 0 || out % 16 != 0)) {
    throw UserError("FP8 GEMMs on CUDA need every dimension divisible by 16" + dims() +
                    "; choose --seq-length x --micro-batch-size and the layer sizes (per tensor-parallel rank) accordingly, "
                    "or train without --fp8-format");
  }
}

const Fp8Linear::WeightCast& Fp8Linear::weight_cast(const at::Tensor& weight) {
  if (weight_.step == context_->step() && weight_.rowwise.data.defined() &&
      weight_.rowwise.data.device() == weight.device()) {
    return weight_;
  }
  at::NoGradGuard no_grad;
  const fp8::Options& o = context_->options();
  const at::Tensor w = weight.detach();  // [out, in]
  WeightCast cast;
  cast.step = context_->step();
  if (o.recipe == Recipe::Blockwise) {
    cast.rowwise = fp8::cast_blockwise(w, o.forward_type, 128);
    // 128 x 128 tiles are their own transposes: the same values and scales, transposed.
    cast.transposed = {cast.rowwise.data.t().contiguous(), cast.rowwise.scale_inv.t().contiguous()};
  } else {
    const fp8::Cast both = cast_with_tensor_scale(w, kWeight, /*rowwise=*/true, /*transposed=*/true);
    cast.rowwise = both.rowwise;
    cast.transposed = both.transposed;
  }
  weight_ = std::move(cast);
  return weight_;
}

fp8::Cast Fp8Linear::cast_activation(const at::Tensor& x, int role, bool rowwise, bool transposed) {
  const fp8::Options& o = context_->options();
  const at::ScalarType type = role == kGradOutput ? o.backward_type : o.forward_type;
  if (o.recipe == Recipe::Blockwise) {
    fp8::Cast out;
    if (rowwise) out.rowwise = fp8::cast_blockwise(x, type, 1);
    if (transposed) out.transposed = fp8::cast_blockwise(x.t(), type, 1);  // tiles along the tokens
    return out;
  }
  return cast_with_tensor_scale(x, role, rowwise, transposed);
}

fp8::Cast Fp8Linear::cast_with_tensor_scale(const at::Tensor& t, int role, bool rowwise, bool transposed) {
  const fp8::Options& o = context_->options();
  const at::ScalarType type = role == kGradOutput ? o.backward_type : o.forward_type;
  if (o.recipe != Recipe::Delayed) return fp8::cast_current_scaling(t, type, rowwise, transposed);
  // The scale from earlier steps; this tensor's amax joins the history for the next, pooled in the cast's pass.
  fp8::DelayedScaling& delayed = context_->delayed();
  const at::Tensor scale = delayed.scale(columns_[role], t.device());
  return fp8::cast_tensorwise(t, scale, type, rowwise, transposed, kernels::Impl::Auto, delayed.current_amax(columns_[role]));
}

at::Tensor Fp8Linear::forward(const at::Tensor& x, const at::Tensor& weight) {
  const int64_t in = weight.size(1), out = weight.size(0);
  TORCH_CHECK(x.size(-1) == in, name_, ": input has ", x.size(-1), " features, the weight ", in);
  const at::Tensor x2 = x.reshape({-1, in}).contiguous();  // [tokens, in]
  check_shapes(x2.size(0), in, out, x.device());
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out;
  at::Tensor y;
  if (at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad())) {
    y = Fp8LinearFunction::apply(x2, weight, reinterpret_cast<int64_t>(this));
  } else {
    at::NoGradGuard no_grad;
    const fp8::Cast qx = cast_activation(x2, kInput, true, false);
    y = fp8::scaled_mm(qx.rowwise, weight_cast(weight).rowwise, x.scalar_type(), /*fast_accum=*/true);
  }
  return y.view(shape);  // [..., out]
}

}  // namespace megatron::tp
