// The FP8 grouped GEMMs of an MoE layer's experts (--fp8-format with --num-experts), on torch's
// grouped FP8 GEMM (at::_scaled_grouped_mm: CUTLASS on Hopper). That kernel takes e4m3 operands
// with one scale per row of each operand (for the weight gradient: per row and group) and writes
// bf16; it has no per-tensor, no delayed and no 128-tile form. So the experts scale row-wise
// under every --fp8-recipe, and their output gradients are e4m3 under --fp8-format hybrid too:
// each row's own scale covers the range that e5m2's wider exponent buys a per-tensor scale.
// Scales are powers of two (as DeepSeek-V3's and torchao's MoE recipes take them): the FP8
// values times their scales are exact in bf16 and fp32, so a GEMM of the dequantized operands
// differs from the FP8 GEMM only in summation order. On the CPU (no such kernel) that GEMM, one
// group after another, is what runs: tests and CPU runs see the same operands as the GPU.
#pragma once

#include <ATen/core/Tensor.h>

#include "fp8/quantize.h"

namespace megatron::fp8 {

// Groups of rows start at multiples of this in the weight gradient's operands: the grouped
// GEMM's tensor-memory loads need 16-byte aligned starts along its contraction dimension.
constexpr int64_t kGroupAlign = 16;

// Each row of x [..., rows, cols] cast to e4m3 with the largest power-of-two scale that keeps the
// row's largest magnitude within 448 -> data [..., rows, cols], scale_inv [..., rows] fp32. On
// CUDA one kernel (src/kernels/fp8_group_cast.cu), bit for bit the composite (Impl::Composite).
Quantized cast_rows(const at::Tensor& x, kernels::Impl impl = kernels::Impl::Auto);

// The weight gradient's operand: x [N, cols] holds groups of rows (counts [G] int64, on x's
// device, never read on the host), each group's columns cast with a scale of their own. The
// result is transposed, the groups' rows now columns: data [cols, P] e4m3, group g's rows starting at
// padded_starts[g] (a multiple of kGroupAlign), zeros between groups; scale_inv [G * cols]
// (group-major: g * cols + c); ends [G] int32, the padded groups' ends. P is a static bound
// (N rounded up to kGroupAlign, plus kGroupAlign per group): no wait for the host.
struct GroupColumns {
  Quantized q;
  at::Tensor ends;
};
// On CUDA two kernels (src/kernels/fp8_group_cast.cu), bit for bit the composite (Impl::Composite).
GroupColumns cast_group_columns(const at::Tensor& x, const at::Tensor& counts, kernels::Impl impl = kernels::Impl::Auto);

// y[rows of group g] = a[rows of g] b[g]^T: a [N, k] cast_rows, b [G, n, k] cast_rows, ends [G]
// int32 (group g's rows end at ends[g]) -> [N, n] bf16. Rows past ends[G-1] are not written.
at::Tensor grouped_mm_rows(const Quantized& a, const Quantized& b, const at::Tensor& ends, bool fast_accum);
// dw[g] = a_g b_g^T over group g's columns: a [m, P] and b [n, P] from cast_group_columns with
// the same counts (their ends) -> [G, m, n] bf16; a group without rows gives zeros.
at::Tensor grouped_mm_groups(const GroupColumns& a, const GroupColumns& b);

}  // namespace megatron::fp8
