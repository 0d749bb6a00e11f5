// The grouped weight-gradient GEMM of src/kernels/grouped_wgrad.h as a CUTLASS 3 kernel for
// Hopper (sm_90a: TMA loads, warpgroup MMAs, a persistent grouped tile scheduler), instantiated
// once per main_grad type in grouped_wgrad_fp32.cu / grouped_wgrad_bf16.cu.
//
// Group g is the GEMM main_grad[g] (M x N) = dy_g^T (M x K) * x_g (K x N) + beta * main_grad[g],
// M = out, N = in, K = the group's rows. In CUTLASS's terms A = dy_g^T is column-major (dy is
// [rows, out] row-major, so M runs contiguously), B = x_g row-major (N contiguous), C = D =
// main_grad[g] row-major. The groups' shapes and pointers depend on the expert counts, which live
// on the device: a one-block kernel writes them into the workspace, and the kernel reads them
// there (no host copy, so a CUDA graph captures the whole thing).
//
// A group with no rows would leave its accumulators unset (the main loop runs no k-tile and never
// clears them), so it gets no tiles at all (M = 0); where the GEMM would have overwritten, a small
// kernel writes its zeros instead.
#pragma once

#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <stdexcept>
#include <string>

#include "kernels/cuda_common.cuh"
#include "kernels/grouped_wgrad.h"

namespace megatron::kernels::cuda::grouped_wgrad_detail {

using namespace cute;

template <typename ElementD>
struct Config {
  using ElementAB = cutlass::bfloat16_t;
  using LayoutA = cutlass::layout::ColumnMajor;  // dy_g^T: [out, rows_g], out contiguous
  using LayoutB = cutlass::layout::RowMajor;     // x_g: [rows_g, in], in contiguous
  using LayoutD = cutlass::layout::RowMajor;     // main_grad[g]: [out, in]
  static constexpr int kAlignAB = 16 / sizeof(ElementAB);
  static constexpr int kAlignD = 16 / sizeof(ElementD);
  // ATen's tile for its large-shape bf16 grouped GEMMs (the experts' out and in run to thousands).
  using TileShape = Shape<_128, _256, _64>;
  using ClusterShape = Shape<_2, _1, _1>;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,  //
      ElementD, LayoutD*, kAlignD,                                    // C: main_grad, read when accumulating
      ElementD, LayoutD*, kAlignD,                                    // D: main_grad
      cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, ElementD, float>>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,  //
      ElementAB, LayoutA*, kAlignAB, ElementAB, LayoutB*, kAlignAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
};

// The per-group arguments, carved out of the workspace (each array 128-byte aligned: CUTLASS makes
// its placeholder TMA descriptors from the arrays' own addresses).
template <typename ElementD>
struct GroupArrays {
  using C = Config<ElementD>;
  const typename C::ElementAB** a;
  const typename C::ElementAB** b;
  ElementD** d;
  typename C::StrideA* stride_a;
  typename C::StrideB* stride_b;
  typename C::StrideD* stride_d;
  typename C::Shape3* shapes;
  size_t bytes = 0;  // their total, where CUTLASS's workspace starts

  // With a null base, only `bytes` is of use: the layout is computed in integers, never dereferenced.
  GroupArrays(void* base, int groups) {
    auto take = [&](size_t size) {
      const uintptr_t at = reinterpret_cast<uintptr_t>(base) + bytes;
      bytes += (size + 127) / 128 * 128;
      return reinterpret_cast<char*>(at);
    };
    a = reinterpret_cast<const typename C::ElementAB**>(take(groups * sizeof(void*)));
    b = reinterpret_cast<const typename C::ElementAB**>(take(groups * sizeof(void*)));
    d = reinterpret_cast<ElementD**>(take(groups * sizeof(void*)));
    stride_a = reinterpret_cast<typename C::StrideA*>(take(groups * sizeof(typename C::StrideA)));
    stride_b = reinterpret_cast<typename C::StrideB*>(take(groups * sizeof(typename C::StrideB)));
    stride_d = reinterpret_cast<typename C::StrideD*>(take(groups * sizeof(typename C::StrideD)));
    shapes = reinterpret_cast<typename C::Shape3*>(take(groups * sizeof(typename C::Shape3)));
  }
};

template <typename ElementD>
__global__ void prepare_groups(GroupArrays<ElementD> arrays, const typename Config<ElementD>::ElementAB* dy,
                               const typename Config<ElementD>::ElementAB* x, const int32_t* ends, ElementD* main_grad,
                               int groups, int out, int in) {
  using C = Config<ElementD>;
  const int g = threadIdx.x;
  if (g >= groups) return;
  const int begin = g == 0 ? 0 : ends[g - 1];
  const int rows = ends[g] - begin;
  arrays.a[g] = dy + int64_t(begin) * out;
  arrays.b[g] = x + int64_t(begin) * in;
  arrays.d[g] = main_grad + int64_t(g) * out * in;
  arrays.stride_a[g] = cutlass::make_cute_packed_stride(typename C::StrideA{}, {out, rows, 1});
  arrays.stride_b[g] = cutlass::make_cute_packed_stride(typename C::StrideB{}, {in, rows, 1});
  arrays.stride_d[g] = cutlass::make_cute_packed_stride(typename C::StrideD{}, {out, in, 1});
  arrays.shapes[g] = typename C::Shape3(rows > 0 ? out : 0, in, rows);
}

// main_grad[g] = 0 for the groups without rows (the overwriting GEMM gives them no tiles).
template <typename ElementD>
__global__ void zero_empty_groups(const int32_t* ends, ElementD* main_grad, int64_t block_elements) {
  const int g = blockIdx.y;
  const int begin = g == 0 ? 0 : ends[g - 1];
  if (ends[g] != begin) return;
  ElementD* dst = main_grad + g * block_elements;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < block_elements; i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = ElementD(0.f);
  }
}

inline void check(cutlass::Status status, const char* what) {
  if (status != cutlass::Status::kSuccess) {
    throw std::runtime_error(std::string("grouped_wgrad: CUTLASS ") + what + ": " + cutlassGetStatusString(status));
  }
}

template <typename ElementD>
struct Runner {
  using C = Config<ElementD>;

  static typename C::Gemm::Arguments arguments(const GroupedWgradArgs& args, const GroupArrays<ElementD>& arrays) {
    cutlass::KernelHardwareInfo hw;
    hw.sm_count = args.sm_count;
    typename C::Gemm::Arguments a{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {args.groups, arrays.shapes, nullptr},  // shapes on the device only
        {arrays.a, arrays.stride_a, arrays.b, arrays.stride_b},
        {{}, const_cast<const ElementD**>(arrays.d), arrays.stride_d, arrays.d, arrays.stride_d},
        hw};
    a.epilogue.thread.alpha = 1.f;
    a.epilogue.thread.beta = args.accumulate ? 1.f : 0.f;  // beta 0: main_grad is not read
    return a;
  }

  static size_t workspace_bytes(const GroupedWgradArgs& args) {
    const GroupArrays<ElementD> arrays(nullptr, args.groups);
    return arrays.bytes + C::Gemm::get_workspace_size(arguments(args, arrays));
  }

  static void run(const GroupedWgradArgs& args, void* workspace, size_t workspace_bytes, Stream stream) {
    const GroupArrays<ElementD> arrays(workspace, args.groups);
    const typename C::Gemm::Arguments gemm_args = arguments(args, arrays);
    const size_t cutlass_bytes = C::Gemm::get_workspace_size(gemm_args);
    if (arrays.bytes + cutlass_bytes > workspace_bytes) throw std::runtime_error("grouped_wgrad: workspace too small");
    using AB = typename C::ElementAB;
    ElementD* main_grad = static_cast<ElementD*>(args.main_grad);
    prepare_groups<ElementD><<<1, args.groups, 0, stream>>>(arrays, static_cast<const AB*>(args.dy),
                                                            static_cast<const AB*>(args.x), args.ends, main_grad,
                                                            args.groups, int(args.out), int(args.in));
    check_launch("grouped_wgrad: prepare_groups");
    if (!args.accumulate) {
      zero_empty_groups<ElementD><<<dim3(16, args.groups), 256, 0, stream>>>(args.ends, main_grad, args.out * args.in);
      check_launch("grouped_wgrad: zero_empty_groups");
    }
    typename C::Gemm gemm;
    check(gemm.can_implement(gemm_args), "can_implement");
    void* cutlass_workspace = static_cast<char*>(workspace) + arrays.bytes;
    check(gemm.initialize(gemm_args, cutlass_workspace, stream), "initialize");
    check(gemm.run(stream), "run");
    check_launch("grouped_wgrad: the grouped GEMM");
  }
};

}  // namespace megatron::kernels::cuda::grouped_wgrad_detail
