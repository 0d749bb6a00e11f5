#include "kernels/attention_ops.h"

#include <ATen/ATen.h>

#include "kernels/cuda_dispatch.h"

namespace megatron::kernels {

namespace {

void attention_merge_composite(const at::Tensor& out, const at::Tensor& lse, const at::Tensor& part_out, const at::Tensor& part_lse) {
  const at::Tensor merged = at::logaddexp(lse, part_lse);
  // Rows neither side saw anything in stay at zero (exp(-inf - -inf) is NaN).
  const at::Tensor kept = at::exp(lse - merged).nan_to_num_(0.0).unsqueeze(-1);  // [b, H, rows, 1]
  const at::Tensor added = at::exp(part_lse - merged).nan_to_num_(0.0).unsqueeze(-1);
  // Two passes over the rows' outputs, the block's read in its own dtype (no fp32 copy of it).
  out.mul_(kept).addcmul_(part_out, added);
  lse.copy_(merged);
}

}  // namespace

void attention_merge(const at::Tensor& out, const at::Tensor& lse, const at::Tensor& part_out, const at::Tensor& part_lse,
                     Impl impl) {
  TORCH_CHECK(out.dim() == 4 && lse.dim() == 3 && part_out.sizes() == out.sizes() && part_lse.sizes() == lse.sizes() &&
                  lse.size(0) == out.size(0) && lse.size(1) == out.size(1) && lse.size(2) == out.size(2),
              "attention_merge: out ", out.sizes(), " / lse ", lse.sizes(), " and the block's ", part_out.sizes(), " / ",
              part_lse.sizes(), " must be [b, H, rows, dv] and [b, H, rows] alike");
  TORCH_CHECK(out.scalar_type() == at::kFloat && lse.scalar_type() == at::kFloat && part_lse.scalar_type() == at::kFloat,
              "attention_merge: the accumulator and the log-sum-exps are fp32");
  const bool kernel = uses_kernel(part_out, impl) && out.is_cuda() && out.stride(3) == 1 && part_out.stride(3) == 1;
  if (!kernel) return attention_merge_composite(out, lse, part_out, part_lse);
#ifdef MEGATRON_WITH_CUDA_KERNELS
  cuda::AttentionMergeArgs a{};
  a.out = out.data_ptr<float>();
  a.lse = lse.data_ptr<float>();
  a.part_out = part_out.data_ptr();
  a.part_lse = part_lse.data_ptr<float>();
  a.part_dtype = storage_type(part_out);
  a.b = out.size(0), a.heads = out.size(1), a.rows = out.size(2), a.dv = out.size(3);
  a.out_stride_b = out.stride(0), a.out_stride_h = out.stride(1), a.out_stride_row = out.stride(2);
  a.lse_stride_b = lse.stride(0), a.lse_stride_h = lse.stride(1), a.lse_stride_row = lse.stride(2);
  a.part_stride_b = part_out.stride(0), a.part_stride_h = part_out.stride(1), a.part_stride_row = part_out.stride(2);
  a.part_lse_stride_b = part_lse.stride(0), a.part_lse_stride_h = part_lse.stride(1), a.part_lse_stride_row = part_lse.stride(2);
  cuda::attention_merge(a, current_stream());
#endif
}

}  // namespace megatron::kernels
