#include "fp8/grouped.h"

#include <ATen/ATen.h>

#include <vector>

#include "kernels/cuda_dispatch.h"

namespace megatron::fp8 {
namespace {

constexpr at::ScalarType kE4m3 = at::kFloat8_e4m3fn;

// The largest power of two that maps amax (fp32, any shape) within e4m3's range; 1 where amax is
// 0 or not finite. (448 / amax is a positive normal fp32: amax is at most fp32's largest.)
at::Tensor power_of_two_scale(const at::Tensor& amax) {
  return power_of_two_floor(scale_from_amax(amax.to(at::kFloat), max_finite(kE4m3)));
}

// x times scale (broadcast), cast to e4m3. The scale is a power of two, so the product is exact
// in x's own dtype and within 448 in magnitude: no saturation, one rounding (the cast's).
at::Tensor cast_scaled(const at::Tensor& x, const at::Tensor& scale) {
  return (x * scale.to(x.scalar_type())).to(kE4m3);
}

std::vector<int64_t> host_ints(const at::Tensor& t) {
  const at::Tensor h = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(h.data_ptr<int64_t>(), h.data_ptr<int64_t>() + h.numel());
}

at::Tensor dequantized_rows(const at::Tensor& data, const at::Tensor& scale_inv) {
  return data.to(at::kFloat) * scale_inv.unsqueeze(-1);
}

}  // namespace

Quantized cast_rows(const at::Tensor& x, kernels::Impl impl) {
  TORCH_CHECK(x.dim() >= 2, "cast_rows: x must be [..., rows, cols], got ", x.sizes());
#ifdef MEGATRON_WITH_CUDA_KERNELS
  if (kernels::uses_kernel(x, impl)) {
    const at::Tensor xc = x.contiguous();
    const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : xc.numel() / cols;
    const std::vector<int64_t> row_shape(x.sizes().begin(), x.sizes().end() - 1);
    const at::Tensor data = at::empty(x.sizes(), x.options().dtype(kE4m3));
    const at::Tensor scale_inv = at::ones(row_shape, x.options().dtype(at::kFloat));  // rows of no columns keep 1
    if (cols > 0) {
      kernels::cuda::fp8_row_cast(xc.data_ptr(), rows, cols, kernels::storage_type(xc), data.data_ptr(), scale_inv.data_ptr<float>(),
                                  kernels::current_stream());
    }
    return {data, scale_inv};
  }
#endif
  (void)impl;
  const at::Tensor scale = power_of_two_scale(x.abs().amax(-1, /*keepdim=*/true));  // [..., rows, 1]
  return {cast_scaled(x, scale).contiguous(), scale.reciprocal().squeeze(-1).contiguous()};
}

GroupColumns cast_group_columns(const at::Tensor& x, const at::Tensor& counts, kernels::Impl impl) {
  TORCH_CHECK(x.dim() == 2 && counts.dim() == 1, "cast_group_columns: x [N, cols] and counts [G], got ", x.sizes(), " and ",
              counts.sizes());
  const int64_t n = x.size(0), cols = x.size(1), groups = counts.size(0);
  const at::Tensor lengths = counts.to(at::kLong);
  // Row r of group g moves to padded_start[g] + (r - start[g]).
  const at::Tensor padded = (lengths + (kGroupAlign - 1)).div(kGroupAlign, "floor") * kGroupAlign;  // [G]
  const at::Tensor padded_ends = padded.cumsum(0), ends = lengths.cumsum(0);
  const at::Tensor shift = (padded_ends - padded) - (ends - lengths);  // [G]: padded start - start
  const int64_t bound = (n + kGroupAlign - 1) / kGroupAlign * kGroupAlign + kGroupAlign * groups;
  GroupColumns out;
  out.ends = padded_ends.to(at::kInt);
#ifdef MEGATRON_WITH_CUDA_KERNELS
  if (kernels::uses_kernel(x, impl)) {
    const at::Tensor xc = x.contiguous(), ends32 = ends.to(at::kInt);
    const at::Tensor amax = at::zeros({groups, cols}, x.options().dtype(at::kFloat));
    kernels::cuda::fp8_group_column_amax(xc.data_ptr(), n, cols, kernels::storage_type(xc), ends32.data_ptr<int>(), int(groups),
                                         reinterpret_cast<unsigned*>(amax.data_ptr<float>()), kernels::current_stream());
    const at::Tensor scale = power_of_two_scale(amax).contiguous();  // [G, cols]
    const at::Tensor data = at::zeros({cols, bound}, x.options().dtype(at::kByte));  // [cols, P]
    kernels::cuda::fp8_group_column_cast(xc.data_ptr(), n, cols, kernels::storage_type(xc), ends32.data_ptr<int>(), int(groups),
                                         scale.data_ptr<float>(), shift.contiguous().data_ptr<int64_t>(), bound, data.data_ptr(),
                                         kernels::current_stream());
    out.q = {data.view(kE4m3), scale.reciprocal().reshape({-1}).contiguous()};
    return out;
  }
#endif
  (void)impl;
  // Each group's largest magnitude per column: [G, cols] (0 for a group without rows).
  const at::Tensor amax = at::segment_reduce(x.abs(), "max", lengths, std::nullopt, std::nullopt, /*axis=*/0,
                                             /*unsafe=*/true, /*initial=*/0);
  const at::Tensor scale = power_of_two_scale(amax);  // [G, cols]
  const at::Tensor group_of_row =
      at::repeat_interleave(at::arange(groups, lengths.options()), lengths, /*dim=*/0, /*output_size=*/n);  // [N]
  // Each row's scales in x's dtype (powers of two: exact), half the bytes of fp32 at bf16.
  const at::Tensor q = cast_scaled(x, scale.to(x.scalar_type()).index_select(0, group_of_row));  // [N, cols]
  const at::Tensor destination = at::arange(n, lengths.options()) + shift.index_select(0, group_of_row);
  // Moved as bytes: index_copy and zeros take every integer type on every device.
  const at::Tensor bytes = at::zeros({bound, cols}, x.options().dtype(at::kByte)).index_copy_(0, destination, q.view(at::kByte));
  out.q = {bytes.t().contiguous().view(kE4m3), scale.reciprocal().reshape({-1}).contiguous()};  // [cols, P], [G * cols]
  return out;
}

at::Tensor grouped_mm_rows(const Quantized& a, const Quantized& b, const at::Tensor& ends, bool fast_accum) {
  TORCH_CHECK(a.data.dim() == 2 && b.data.dim() == 3 && a.data.size(1) == b.data.size(2), "grouped_mm_rows: a ",
              a.data.sizes(), " and b ", b.data.sizes(), " must be [N, k] and [G, n, k]");
  if (a.data.is_cuda()) {
    // b^T as the column-major [G, k, n] operand the kernel wants.
    return at::_scaled_grouped_mm(a.data, b.data.transpose(1, 2), a.scale_inv, b.scale_inv, ends.to(at::kInt), std::nullopt,
                                  std::nullopt, at::kBFloat16, fast_accum);
  }
  at::Tensor y = at::zeros({a.data.size(0), b.data.size(1)}, a.data.options().dtype(at::kBFloat16));  // [N, n]
  int64_t begin = 0;
  const std::vector<int64_t> end = host_ints(ends);
  for (size_t g = 0; g < end.size(); ++g) {
    const int64_t rows = end[g] - begin;
    if (rows > 0) {
      const at::Tensor ag = dequantized_rows(a.data.narrow(0, begin, rows), a.scale_inv.narrow(0, begin, rows));
      const at::Tensor bg = dequantized_rows(b.data[int64_t(g)], b.scale_inv[int64_t(g)]);
      y.narrow(0, begin, rows).copy_(at::mm(ag, bg.t()));
    }
    begin = end[g];
  }
  return y;
}

at::Tensor grouped_mm_groups(const GroupColumns& a, const GroupColumns& b) {
  const at::Tensor &da = a.q.data, &db = b.q.data;
  TORCH_CHECK(da.dim() == 2 && db.dim() == 2 && da.size(1) == db.size(1), "grouped_mm_groups: a ", da.sizes(), " and b ",
              db.sizes(), " must be [m, P] and [n, P]");
  const int64_t m = da.size(0), n = db.size(0), groups = a.ends.size(0);
  if (da.is_cuda()) {
    return at::_scaled_grouped_mm(da, db.t(), a.q.scale_inv, b.q.scale_inv, a.ends, std::nullopt, std::nullopt,
                                  at::kBFloat16, /*use_fast_accum=*/false);
  }
  at::Tensor dw = at::zeros({groups, m, n}, da.options().dtype(at::kBFloat16));
  int64_t begin = 0;
  const std::vector<int64_t> end = host_ints(a.ends);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t len = end[size_t(g)] - begin;
    if (len > 0) {
      const at::Tensor ag = dequantized_rows(da.narrow(1, begin, len), a.q.scale_inv.narrow(0, g * m, m));  // [m, len]
      const at::Tensor bg = dequantized_rows(db.narrow(1, begin, len), b.q.scale_inv.narrow(0, g * n, n));  // [n, len]
      dw[g].copy_(at::mm(ag, bg.t()));
    }
    begin = end[size_t(g)];
  }
  return dw;
}

}  // namespace megatron::fp8
