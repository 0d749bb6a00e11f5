// Launcher of the grouped weight-gradient GEMM that accumulates into main_grad
// (src/kernels/cutlass/, built where CUTLASS's headers are: MEGATRON_WITH_CUTLASS). Plain C++ like
// kernels.h: pointers, sizes and a stream.
//
// An MoE layer's experts are one grouped linear: group g (expert g) owns rows [ends[g-1], ends[g])
// of its input x [rows, in] and of the output's gradient dy [rows, out]. Its weight gradient
// dy_g^T x_g [out, in] goes into main_grad[g] (the experts' main_grads side by side, [groups, out,
// in]) by the GEMM's epilogue, which reads main_grad[g] as its source and writes the sum back:
// one read and one write of main_grad instead of a bf16 gradient written, read back and added.
// Megatron's gradient-accumulation fusion, for the grouped GEMM (ATen's _grouped_mm writes bf16 only).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"

namespace megatron::kernels::cuda {

struct GroupedWgradArgs {
  const void* dy;         // bf16 [rows, out], contiguous
  const void* x;          // bf16 [rows, in], contiguous
  const int32_t* ends;    // device [groups]: the end row of each group (a cumulative sum of counts)
  void* main_grad;        // [groups, out, in], contiguous, fp32 or bf16
  int groups;             // at most kGroupedWgradMaxGroups
  int64_t out, in;
  DType main_grad_dtype;  // Float32 or BFloat16
  bool accumulate;        // false: the step's first gradient overwrites main_grad (empty groups get zeros)
  int sm_count;           // the device's multiprocessors (the kernel is persistent)
};

inline constexpr int kGroupedWgradMaxGroups = 1024;

// Whether the kernel takes these shapes and pointers (sm_90, 16-byte aligned rows and blocks);
// the caller checks the device is an sm_90 one.
bool grouped_wgrad_supported(const GroupedWgradArgs& args);
// Bytes of device workspace grouped_wgrad needs (its per-group arguments and CUTLASS's own).
size_t grouped_wgrad_workspace_bytes(const GroupedWgradArgs& args);
// Capturable in a CUDA graph: no host reads of device data.
void grouped_wgrad(const GroupedWgradArgs& args, void* workspace, size_t workspace_bytes, Stream stream);

}  // namespace megatron::kernels::cuda
