// FP8 tensors and the scaled GEMMs that read them: what Transformer Engine's quantizers do for
// Megatron's FP8 recipes, on at::_scaled_mm and the cast kernel of src/kernels/fp8_cast.cu.
//
// A quantized matrix is its FP8 values and the reciprocal scales (`scale_inv`) that turn them
// back into the values they stand for: v ≈ data * scale_inv. Scales come in three granularities:
//   tensor-wise   scale_inv []: one for the whole matrix (the tensorwise and delayed recipes)
//   1 x 128       scale_inv [rows, cols / 128]: per row and 128 consecutive columns (blockwise
//                 recipe, activations and gradients: DeepSeek-V3's tiles)
//   128 x 128     scale_inv [rows / 128, cols / 128] (blockwise recipe, weights)
// Blockwise scales are powers of two, as Transformer Engine's blockwise recipe takes them.
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/ops.h"

namespace megatron::fp8 {

struct Quantized {
  at::Tensor data;       // [rows, cols] FP8 (e4m3 or e5m2), row-major
  at::Tensor scale_inv;  // fp32: [], [rows, cols / 128] or [rows / 128, cols / 128]
};

// The largest finite value of an FP8 dtype: 448 (e4m3fn), 57344 (e5m2).
double max_finite(at::ScalarType fp8);

// max |x| as a [] fp32 tensor on x's device (0 for an empty x).
at::Tensor amax(const at::Tensor& x);
// The scale that maps `amax` onto fp8_max / 2^margin ([] fp32); where amax is 0 or not finite,
// `fallback` (Transformer Engine keeps the previous scale there) or 1 when undefined.
at::Tensor scale_from_amax(const at::Tensor& amax, double fp8_max, int margin = 0, const at::Tensor& fallback = {});
// The same for many tensors at once: amax and fp8_max [n] (each tensor's format), fallback [n].
at::Tensor scale_from_amax(const at::Tensor& amax, const at::Tensor& fp8_max, int margin, const at::Tensor& fallback);

// The largest power of two not above each value of `scale` (positive normal fp32), from its
// exponent bits: exact on every device, where exp2(floor(log2(s))) is not (log2 rounds an s just
// below a power of two up to it, and a cast with that scale leaves the format's range).
at::Tensor power_of_two_floor(const at::Tensor& scale);

// x [rows, cols] (any float dtype) cast to `fp8` with the tensor-wide `scale` ([] fp32): row-wise
// into .data when `rowwise`, and the transposed copy [cols, rows] into `transposed` when asked,
// both in one pass on CUDA. scale_inv = 1 / scale for both. `pool_amax` ([] fp32, e.g. a slot of
// the delayed recipe's history), when given, becomes max(pool_amax, max |x|), in the same pass on CUDA.
struct Cast {
  Quantized rowwise;
  Quantized transposed;
};
Cast cast_tensorwise(const at::Tensor& x, const at::Tensor& scale, at::ScalarType fp8, bool rowwise,
                     bool transposed, kernels::Impl impl = kernels::Impl::Auto, const at::Tensor& pool_amax = {});
// The tensorwise recipe's cast (current scaling): the scale from x's own amax,
// scale_from_amax(amax(x), max_finite(fp8)). On CUDA an amax kernel and the cast, which computes
// the scale itself (no small ATen kernels between them).
Cast cast_current_scaling(const at::Tensor& x, at::ScalarType fp8, bool rowwise, bool transposed,
                          kernels::Impl impl = kernels::Impl::Auto);

// x [rows, cols] cast with a power-of-two scale per tile of tile_rows x 128 (tile_rows 1 or 128):
// the largest magnitude of each tile lands at most at fp8_max. cols (and rows, for 128-row tiles)
// must be multiples of 128.
Quantized cast_blockwise(const at::Tensor& x, at::ScalarType fp8, int64_t tile_rows);

// The values a quantized matrix stands for, in fp32 [rows, cols].
at::Tensor dequantize(const Quantized& q);

// a [m, k] times b^T, b given row-major as [n, k] (the weight's layout in a linear layer), with
// fp32 accumulation -> [m, n] in out_dtype, written into `out` ([m, n] contiguous, out_dtype) when
// given. Tensor-wise scales: the FP8 GEMM of at::_scaled_mm (cuBLAS) on CUDA (`fast_accum`:
// Hopper's faster, less exact accumulation, which Transformer Engine takes for the forward GEMM
// only), and on the CPU, whose at::_scaled_mm is a slow reference loop, an fp32 GEMM of the FP8
// values, exact products scaled after the sum. Blockwise scales: a GEMM of the dequantized values,
// which are exact in bf16 (FP8 values times powers of two), so only the summation order differs
// from an FP8 GEMM's, but at bf16 speed (see scaled_mm's definition for why).
at::Tensor scaled_mm(const Quantized& a, const Quantized& b, at::ScalarType out_dtype, bool fast_accum = false,
                     const at::Tensor& out = {});

}  // namespace megatron::fp8
