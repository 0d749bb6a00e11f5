#include "kernels/attention_ops.h"

#include <ATen/ATen.h>

#include <limits>

#include "kernels/cuda_dispatch.h"
#include "kernels/kernels.h"

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

int64_t max_row_blocks() { return cuda::kMaxRowBlocks; }

void combine_row_blocks(const std::vector<AttentionRows>& blocks, const at::Tensor& out, const at::Tensor& out_lse, bool weighted,
                        Impl impl) {
  const int64_t count = static_cast<int64_t>(blocks.size());
  TORCH_CHECK(count >= 1 && count <= max_row_blocks(), "combine_row_blocks: 1 to ", max_row_blocks(), " blocks, not ", count);
  TORCH_CHECK(out.dim() == 4 && (!out_lse.defined() || (weighted && out_lse.dim() == 3 && out_lse.scalar_type() == at::kFloat)),
              "combine_row_blocks: out [b, H, rows, dv]; out_lse [b, H, rows] fp32, for weighted blocks only");
  bool kernel = uses_kernel(out, impl) && out.stride(3) == 1;
  for (const AttentionRows& blk : blocks) {
    TORCH_CHECK(blk.values.dim() == 4 && blk.values.size(0) == out.size(0) && blk.values.size(1) == out.size(1) &&
                    blk.values.size(3) == out.size(3) && blk.first_row >= 0 && blk.first_row + blk.values.size(2) <= out.size(2),
                "combine_row_blocks: a block of ", blk.values.sizes(), " at row ", blk.first_row, " does not fit ", out.sizes());
    TORCH_CHECK(!weighted || (blk.lse.defined() && blk.lse.scalar_type() == at::kFloat && blk.lse.dim() == 3),
                "combine_row_blocks: weighted blocks carry their lse [b, H, rows] fp32");
    kernel = kernel && uses_kernel(blk.values, impl) && blk.values.stride(3) == 1;
  }
  if (!kernel) {
    at::Tensor sum = at::zeros(out.sizes(), out.options().dtype(at::kFloat));
    at::Tensor lse = weighted ? at::full(out.sizes().slice(0, 3), -std::numeric_limits<double>::infinity(), sum.options()) : at::Tensor();
    for (const AttentionRows& blk : blocks) {
      const int64_t rows = blk.values.size(2);
      if (weighted) {
        attention_merge(sum.narrow(2, blk.first_row, rows), lse.narrow(2, blk.first_row, rows), blk.values, blk.lse, Impl::Composite);
      } else {
        sum.narrow(2, blk.first_row, rows).add_(blk.values);
      }
    }
    out.copy_(sum);
    if (out_lse.defined()) out_lse.copy_(lse);
    return;
  }
#ifdef MEGATRON_WITH_CUDA_KERNELS
  cuda::RowBlockCombineArgs a{};
  for (int64_t i = 0; i < count; ++i) {
    const AttentionRows& blk = blocks[size_t(i)];
    cuda::RowBlock& r = a.blocks[i];
    r.values = blk.values.data_ptr();
    r.dtype = storage_type(blk.values);
    r.first_row = blk.first_row, r.rows = blk.values.size(2);
    r.stride_b = blk.values.stride(0), r.stride_h = blk.values.stride(1), r.stride_row = blk.values.stride(2);
    if (weighted) {
      r.lse = blk.lse.data_ptr<float>();
      r.lse_stride_b = blk.lse.stride(0), r.lse_stride_h = blk.lse.stride(1), r.lse_stride_row = blk.lse.stride(2);
    }
  }
  a.count = static_cast<int>(count);
  a.weighted = weighted;
  a.out = out.data_ptr();
  a.out_dtype = storage_type(out);
  a.b = out.size(0), a.heads = out.size(1), a.rows = out.size(2), a.dv = out.size(3);
  a.out_stride_b = out.stride(0), a.out_stride_h = out.stride(1), a.out_stride_row = out.stride(2);
  if (out_lse.defined()) {
    a.out_lse = out_lse.data_ptr<float>();
    a.out_lse_stride_b = out_lse.stride(0), a.out_lse_stride_h = out_lse.stride(1), a.out_lse_stride_row = out_lse.stride(2);
  }
  cuda::combine_row_blocks(a, current_stream());
#endif
}

}  // namespace megatron::kernels
