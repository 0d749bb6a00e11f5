#include "fp8/quantize.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "kernels/cuda_dispatch.h"

namespace megatron::fp8 {
namespace {

constexpr int64_t kBlock = 128;

// The values a blockwise scale_inv applies to, one per element of a [rows, cols] matrix.
at::Tensor expand_blocks(const at::Tensor& scale_inv, int64_t rows, int64_t cols) {
  at::Tensor s = scale_inv.repeat_interleave(kBlock, 1).narrow(1, 0, cols);  // [rows or rows/128, cols]
  if (s.size(0) != rows) s = s.repeat_interleave(kBlock, 0).narrow(0, 0, rows);
  return s;
}

at::Tensor dequantized_mm(const Quantized& a, const Quantized& b, at::ScalarType out_dtype) {
  // FP8 values times powers of two are exact in bf16 (and fp32): the products are the FP8 GEMM's.
  const at::ScalarType compute = a.data.is_cuda() ? at::kBFloat16 : at::kFloat;
  const at::Tensor da = dequantize(a).to(compute), db = dequantize(b).to(compute);
  if (a.data.is_cuda() && out_dtype == at::kFloat) return at::mm(da, db.t(), at::kFloat);
  return at::mm(da, db.t()).to(out_dtype);
}

}  // namespace

double max_finite(at::ScalarType fp8) {
  switch (fp8) {
    case at::kFloat8_e4m3fn: return 448.0;
    case at::kFloat8_e5m2: return 57344.0;
    default: TORCH_CHECK(false, "not an FP8 type: ", fp8);
  }
}

at::Tensor amax(const at::Tensor& x) {
  if (x.numel() == 0) return at::zeros({}, x.options().dtype(at::kFloat));
  // One reduction pass: the infinity norm is max |x|, exact in x's own dtype.
  return at::linalg_vector_norm(x, std::numeric_limits<double>::infinity()).to(at::kFloat);
}

namespace {

// fp8_max / 2^margin / amax where that is a usable scale, else the fallback (1 when undefined).
template <typename Max>
at::Tensor scale_where_usable(const at::Tensor& amax, const Max& fp8_max, int margin, const at::Tensor& fallback) {
  const at::Tensor scale = (fp8_max / std::ldexp(1.0, margin)) / amax;
  const at::Tensor usable = (amax > 0).logical_and(at::isfinite(amax)).logical_and(at::isfinite(scale));
  const at::Tensor otherwise = fallback.defined() ? fallback : at::ones_like(scale);
  return at::where(usable, scale, otherwise);
}

}  // namespace

at::Tensor scale_from_amax(const at::Tensor& amax, double fp8_max, int margin, const at::Tensor& fallback) {
  return scale_where_usable(amax, fp8_max, margin, fallback);
}

at::Tensor scale_from_amax(const at::Tensor& amax, const at::Tensor& fp8_max, int margin, const at::Tensor& fallback) {
  return scale_where_usable(amax, fp8_max, margin, fallback);
}

namespace {

#ifdef MEGATRON_WITH_CUDA_KERNELS
unsigned* amax_bits(const at::Tensor& amax) {
  TORCH_CHECK(amax.scalar_type() == at::kFloat && amax.numel() == 1, "an amax is one fp32 value");
  return reinterpret_cast<unsigned*>(amax.data_ptr<float>());
}

// The cast kernel's launch for x [rows, cols] (contiguous): the outputs allocated, scale_inv
// written by the kernel.
Cast launch_cast(const at::Tensor& xc, kernels::cuda::Fp8Scaling scaling, at::ScalarType fp8, bool rowwise, bool transposed) {
  const int64_t rows = xc.size(0), cols = xc.size(1);
  const at::TensorOptions options = xc.options().dtype(fp8);
  const at::Tensor scale_inv = at::empty({}, xc.options().dtype(at::kFloat));
  scaling.scale_inv = scale_inv.data_ptr<float>();
  Cast out;
  if (rowwise) out.rowwise = {at::empty({rows, cols}, options), scale_inv};
  if (transposed) out.transposed = {at::empty({cols, rows}, options), scale_inv};
  if (rows == 0 || cols == 0) {
    scale_inv.fill_(1.0);  // nothing cast: the kernel does not run
    return out;
  }
  kernels::cuda::fp8_cast(xc.data_ptr(), rows, cols, kernels::storage_type(xc), scaling,
                          fp8 == at::kFloat8_e5m2 ? kernels::cuda::Fp8Format::E5M2 : kernels::cuda::Fp8Format::E4M3,
                          rowwise ? out.rowwise.data.data_ptr() : nullptr,
                          transposed ? out.transposed.data.data_ptr() : nullptr, kernels::current_stream());
  return out;
}
#endif

Cast composite_cast(const at::Tensor& xc, const at::Tensor& scale, at::ScalarType fp8, bool rowwise, bool transposed) {
  const at::Tensor scale_inv = scale.reciprocal();
  const double limit = max_finite(fp8);
  const at::Tensor q = (xc.to(at::kFloat) * scale).clamp(-limit, limit).to(fp8);  // [rows, cols]
  Cast out;
  if (rowwise) out.rowwise = {q, scale_inv};
  if (transposed) out.transposed = {q.t().contiguous(), scale_inv};
  return out;
}

}  // namespace

Cast cast_tensorwise(const at::Tensor& x, const at::Tensor& scale, at::ScalarType fp8, bool rowwise, bool transposed,
                     kernels::Impl impl, const at::Tensor& pool_amax) {
  TORCH_CHECK(x.dim() == 2, "cast_tensorwise: x must be [rows, cols], got ", x.sizes());
  const at::Tensor xc = x.contiguous();
#ifdef MEGATRON_WITH_CUDA_KERNELS
  if (kernels::uses_kernel(xc, impl) && (!pool_amax.defined() || pool_amax.is_contiguous())) {
    const at::Tensor scale32 = scale.to(at::kFloat).contiguous();
    kernels::cuda::Fp8Scaling scaling;
    scaling.scale = scale32.data_ptr<float>();
    if (pool_amax.defined()) scaling.pool_amax = amax_bits(pool_amax);
    return launch_cast(xc, scaling, fp8, rowwise, transposed);
  }
#endif
  (void)impl;
  if (pool_amax.defined()) pool_amax.copy_(at::maximum(pool_amax, fp8::amax(xc)));
  return composite_cast(xc, scale, fp8, rowwise, transposed);
}

Cast cast_current_scaling(const at::Tensor& x, at::ScalarType fp8, bool rowwise, bool transposed, kernels::Impl impl) {
  TORCH_CHECK(x.dim() == 2, "cast_current_scaling: x must be [rows, cols], got ", x.sizes());
  const at::Tensor xc = x.contiguous();
#ifdef MEGATRON_WITH_CUDA_KERNELS
  if (kernels::uses_kernel(xc, impl)) {
    const at::Tensor amax = at::zeros({}, xc.options().dtype(at::kFloat));
    kernels::cuda::fp8_amax(xc.data_ptr(), xc.numel(), kernels::storage_type(xc), amax_bits(amax), kernels::current_stream());
    kernels::cuda::Fp8Scaling scaling;
    scaling.amax = amax_bits(amax);
    scaling.fp8_max = float(max_finite(fp8));
    return launch_cast(xc, scaling, fp8, rowwise, transposed);
  }
#endif
  (void)impl;
  return composite_cast(xc, scale_from_amax(fp8::amax(xc), max_finite(fp8)), fp8, rowwise, transposed);
}

Quantized cast_blockwise(const at::Tensor& x, at::ScalarType fp8, int64_t tile_rows) {
  TORCH_CHECK(x.dim() == 2, "cast_blockwise: x must be [rows, cols], got ", x.sizes());
  TORCH_CHECK(tile_rows == 1 || tile_rows == kBlock, "cast_blockwise: tiles of 1 or 128 rows");
  const int64_t rows = x.size(0), cols = x.size(1);
  TORCH_CHECK(cols % kBlock == 0 && rows % tile_rows == 0, "blockwise FP8 needs whole ", tile_rows, " x 128 tiles; got a [",
              rows, ", ", cols, "] matrix");
  const at::Tensor tiles = x.to(at::kFloat).reshape({rows / tile_rows, tile_rows, cols / kBlock, kBlock});
  const at::Tensor tile_amax = tiles.abs().amax({1, 3});  // [rows / tile_rows, cols / 128]
  const double limit = max_finite(fp8);
  // The largest power of two that keeps the tile's largest magnitude within the format.
  const at::Tensor scale = power_of_two_floor(scale_from_amax(tile_amax, limit));
  const at::Tensor q = (tiles * scale.unsqueeze(1).unsqueeze(3)).clamp(-limit, limit).to(fp8).reshape({rows, cols});
  return {q, scale.reciprocal()};
}

at::Tensor power_of_two_floor(const at::Tensor& scale) {
  TORCH_CHECK(scale.scalar_type() == at::kFloat, "power_of_two_floor takes fp32 scales");
  return at::bitwise_and(scale.contiguous().view(at::kInt), 0x7f800000).view(at::kFloat);
}

at::Tensor dequantize(const Quantized& q) {
  const at::Tensor values = q.data.to(at::kFloat);
  if (q.scale_inv.dim() == 0) return values * q.scale_inv;
  return values * expand_blocks(q.scale_inv, q.data.size(0), q.data.size(1));
}

at::Tensor scaled_mm(const Quantized& a, const Quantized& b, at::ScalarType out_dtype, bool fast_accum, const at::Tensor& out) {
  TORCH_CHECK(a.data.dim() == 2 && b.data.dim() == 2 && a.data.size(1) == b.data.size(1), "scaled_mm: a ", a.data.sizes(),
              " and b ", b.data.sizes(), " must be [m, k] and [n, k]");
  // b^T as the column-major [k, n] operand cuBLAS's FP8 GEMM wants.
  const at::Tensor b_t = b.data.t();
  auto gemm = [&](const at::Tensor& sa, const at::Tensor& sb) {
    if (out.defined()) return at::_scaled_mm_out(const_cast<at::Tensor&>(out), a.data, b_t, sa, sb, std::nullopt, std::nullopt, out_dtype, fast_accum);
    return at::_scaled_mm(a.data, b_t, sa, sb, std::nullopt, std::nullopt, out_dtype, fast_accum);
  };
  auto into_out = [&](const at::Tensor& result) {
    if (out.defined()) return out.copy_(result);
    return result;
  };
  if (a.scale_inv.dim() == 0 && b.scale_inv.dim() == 0) {
    if (a.data.is_cuda()) return gemm(a.scale_inv, b.scale_inv);
    // ATen's CPU FP8 GEMM is a scalar reference loop (seconds for a tiny model's step). The FP8
    // values are exact in fp32 and so are their products: an fp32 GEMM of them, scaled after the
    // sum as the FP8 GEMM scales its accumulator, is the same computation.
    return into_out((at::mm(a.data.to(at::kFloat), b.data.to(at::kFloat).t()) * (a.scale_inv * b.scale_inv)).to(out_dtype));
  }
  // Blockwise scales: the GEMM of the dequantized values. at::_scaled_mm's blockwise cuBLAS path
  // (torch 2.11, H200) was tried and is not used: it refuses the weight gradient's pair of 1 x 128
  // operands ("only row-major x column-major"), and with 128 x 128 weight scales two tiles wide (a
  // stride of 8 bytes) it returned wrong products without an error (docs/training.md).
  return into_out(dequantized_mm(a, b, out_dtype));
}

}  // namespace megatron::fp8
