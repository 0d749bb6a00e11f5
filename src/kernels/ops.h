// The fused operations as LibTorch sees them: autograd functions whose forward and backward run
// the CUDA kernels of src/kernels/*.cu where the build has them and the tensors live on a CUDA
// device, and an ATen composite computing the same thing (in fp32, cast back) everywhere else.
// Impl::Composite forces the fallback, which is what the CUDA tests compare the kernels against.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace megatron::kernels {

enum class Impl { Auto, Composite };

// Whether this build compiled the CUDA kernels (MEGATRON_CUDA builds).
bool built_with_kernels();
// Whether an Impl::Auto call on `t` runs a CUDA kernel.
bool uses_kernel(const at::Tensor& t, Impl impl = Impl::Auto);

// Rotary embedding of x [s, b, n, d] (last dim contiguous; a view into the QKV output is fine)
// with fp32 tables cos / sin [>= s, 1 or b, 1, rot_dim]: the first rot_dim channels of each head
// rotate (rotate-half form), the rest pass through. Returns a contiguous [s, b, n, d]. x may also
// be [s, b, G, n / G, d], heads in groups (the queries of the QKV output read in place).
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, Impl impl = Impl::Auto);

// The QKV projection's output qkv [s, b, G, (P + 2) * d] (per query group: its P query heads, one
// key head, one value head) as q [s, b, G * P, d] and k [s, b, G, d], both rotated as rope()
// does, and v [s, b, G, d]; all three are new tensors. Backward writes the three gradients
// straight into their places in one gradient of qkv's shape: no concatenation pass, and no part
// of the QKV output is kept for it.
struct QkvRope {
  at::Tensor q, k, v;
};
QkvRope split_qkv_rope(const at::Tensor& qkv, int64_t heads_per_group, const at::Tensor& cos, const at::Tensor& sin,
                       Impl impl = Impl::Auto);

// SwiGLU of h [..., 2f] = [gate | up] -> silu(gate) * up [..., f]; saves only h for backward.
at::Tensor swiglu(const at::Tensor& h, Impl impl = Impl::Auto);

// RMSNorm of x [..., h] with weight [h] of x's dtype, as ATen's rms_norm computes it (fp32
// statistics, the product with the weight rounded once): the kernels where they apply (CUDA,
// bf16/fp16/fp32, h a multiple of the 16-byte pack with 32..1024 packs), at::rms_norm elsewhere.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, Impl impl = Impl::Auto);
// The residual add fused with the RMSNorm that follows it: sum = a + b (rounded to the storage
// type, as a plain add), normed = rms_norm(sum). One read of a and b, one write of each output;
// in backward one pass adds the sum's own gradient to the norm's.
struct AddRmsNorm {
  at::Tensor sum;
  at::Tensor normed;
};
AddRmsNorm add_rms_norm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& weight, double eps,
                        Impl impl = Impl::Auto);

// The index of each row's largest value, x [rows, n] -> [rows] int64: at::argmax(x, -1)'s answer
// (ties to the lower index, NaN above every number), one CUDA launch where the kernels apply
// (the values contiguous), at::argmax elsewhere. A decode step's greedy choice.
at::Tensor argmax_rows(const at::Tensor& x, Impl impl = Impl::Auto);

// Cross-entropy pieces over a vocabulary slice (no autograd; tensor_parallel/cross_entropy.cpp
// composes them with the TP reductions). logits [rows, vocab] holds ids [first, first + vocab).
// The statistics are fp32, fp64 for fp64 logits (the composite keeps their precision, as the
// unfused loss does: finite-difference checks run in fp64).
struct CrossEntropyStats {
  at::Tensor max;           // [rows] fp32, max over the slice
  at::Tensor sum_exp;       // [rows] fp32, sum(exp(logit - max)) over the slice
  at::Tensor target_logit;  // [rows] fp32, the target's logit if in the slice, else 0
};
CrossEntropyStats cross_entropy_stats(const at::Tensor& logits, const at::Tensor& targets, int64_t first,
                                      Impl impl = Impl::Auto);
// (softmax - one_hot(target)) * grad_loss in the logits' dtype [rows, vocab], from the global
// row max and exp-sum ([rows] fp32) and grad_loss [rows] fp32 (all three fp64 for fp64 logits).
at::Tensor cross_entropy_backward(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& max,
                                  const at::Tensor& sum_exp, const at::Tensor& grad_loss, int64_t first,
                                  Impl impl = Impl::Auto);

// A gradient into its accumulator: dst = src (overwrite) or dst += src, src upcast as read. One
// vectorised kernel for a contiguous fp32 dst on CUDA; ATen's copy_ / add_ elsewhere.
void accumulate_grad(const at::Tensor& dst, const at::Tensor& src, bool overwrite, Impl impl = Impl::Auto);

// One AdamW step (PyTorch's arithmetic, decoupled weight decay) on one parameter's fp32 master
// and moments [n] (fp32, or bf16 under the precision-aware optimizer: computed in fp32, rounded
// once when stored), from its gradient [n] (fp32, or bf16 with --grad-reduce-in-bf16) divided by
// the step's grad_scale; the result is also written to `model` ([n], bf16 / fp16) unless model is
// the master itself. The step's scalars are tensors on the parameters' device, formed once per
// step for all parameters, so no host synchronisation is needed; found_inf skips the step
// (nothing changes). The kernel does all of it in one pass; the fallback runs ATen's
// _fused_adamw_ (same scalars, the gradient upcast) and then copies.
struct AdamWHyperparameters {
  double beta1, beta2, eps, weight_decay;
};
struct AdamWStepScalars {
  at::Tensor step;              // [] fp32: steps taken, this one included
  at::Tensor bias_corrections;  // [2] fp32: 1 - beta1^step, sqrt(1 - beta2^step), formed in fp64
  at::Tensor grad_scale;        // [] fp32: gradients are divided by it (clipping)
  at::Tensor found_inf;         // [] fp32: nonzero skips the step
  at::Tensor lr;                // [] fp64: the learning rate, on the device so that a step captured
                                // as a CUDA graph reads each iteration's value
};
// `master` may also be int16 remainders (see join_master) with `model` the bf16 weights holding
// the masters' high halves: then both are written.
AdamWStepScalars adamw_step_scalars(const at::Tensor& step, const at::Tensor& grad_scale, const at::Tensor& found_inf,
                                    const at::Tensor& lr, double beta1, double beta2);
void adamw_step(const at::Tensor& master, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                const at::Tensor& grad, const at::Tensor& model, const AdamWHyperparameters& h,
                const AdamWStepScalars& scalars, Impl impl = Impl::Auto);

// The precision-aware optimizer's fp32 master weights as Megatron keeps them by default
// (store_param_remainders): the bf16 model weight is the master's high half, rounded half away
// from zero, and an int16 remainder [n] the rest, so the pair is the fp32 value exactly in 2
// bytes more than the model weight instead of 4. join_master: the fp32 masters [n] (a new
// tensor); split_master: `master` [n] fp32 into both.
at::Tensor join_master(const at::Tensor& model_bf16, const at::Tensor& remainder);
void split_master(const at::Tensor& master, const at::Tensor& model_bf16, const at::Tensor& remainder);

}  // namespace megatron::kernels
