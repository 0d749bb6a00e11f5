// The grouped weight-gradient GEMM into fp32 main_grads (Megatron's default), and the launcher's
// entry points (src/kernels/grouped_wgrad.h), which pick the instantiation by main_grad's type.
#include "kernels/cutlass/grouped_wgrad.cuh"

namespace megatron::kernels::cuda {
namespace grouped_wgrad_detail {
template struct Runner<float>;
extern template struct Runner<cutlass::bfloat16_t>;  // grouped_wgrad_bf16.cu
}  // namespace grouped_wgrad_detail

bool grouped_wgrad_supported(const GroupedWgradArgs& args) {
  const bool fp32 = args.main_grad_dtype == DType::Float32;
  if (!fp32 && args.main_grad_dtype != DType::BFloat16) return false;
  const int64_t d_align = fp32 ? 4 : 8;  // elements in 16 bytes
  // TMA moves 16-byte-aligned rows: every group's first row and every row stride.
  return args.groups > 0 && args.groups <= kGroupedWgradMaxGroups && args.out > 0 && args.in > 0 &&
         args.out % 8 == 0 && args.in % 8 == 0 && args.in % d_align == 0 && args.out < (int64_t(1) << 31) &&
         args.in < (int64_t(1) << 31) && aligned16(args.dy) && aligned16(args.x) && aligned16(args.main_grad) &&
         args.sm_count > 0;
}

size_t grouped_wgrad_workspace_bytes(const GroupedWgradArgs& args) {
  using namespace grouped_wgrad_detail;
  return args.main_grad_dtype == DType::Float32 ? Runner<float>::workspace_bytes(args)
                                                : Runner<cutlass::bfloat16_t>::workspace_bytes(args);
}

void grouped_wgrad(const GroupedWgradArgs& args, void* workspace, size_t workspace_bytes, Stream stream) {
  using namespace grouped_wgrad_detail;
  if (!grouped_wgrad_supported(args)) throw std::runtime_error("grouped_wgrad: unsupported shapes, types or alignment");
  if (args.main_grad_dtype == DType::Float32) {
    Runner<float>::run(args, workspace, workspace_bytes, stream);
  } else {
    Runner<cutlass::bfloat16_t>::run(args, workspace, workspace_bytes, stream);
  }
}

}  // namespace megatron::kernels::cuda
