#include "kernels/grouped_wgrad_ops.h"

#include <ATen/ATen.h>

#ifdef MEGATRON_WITH_CUTLASS
#include "kernels/cuda_dispatch.h"
#include "kernels/grouped_wgrad.h"
#endif

namespace megatron::kernels {

bool built_with_grouped_wgrad() {
#ifdef MEGATRON_WITH_CUTLASS
  return true;
#else
  return false;
#endif
}

#ifdef MEGATRON_WITH_CUTLASS
namespace {

// The kernel's arguments, or nothing where it does not take these tensors.
std::optional<cuda::GroupedWgradArgs> arguments(const at::Tensor& main_grads, const at::Tensor& dy, const at::Tensor& x,
                                                const at::Tensor& ends, bool accumulate) {
  const bool shapes = main_grads.dim() == 3 && dy.dim() == 2 && x.dim() == 2 && ends.dim() == 1 &&
                      dy.size(0) == x.size(0) && main_grads.size(0) == ends.size(0) &&
                      main_grads.size(1) == dy.size(1) && main_grads.size(2) == x.size(1);
  if (!shapes || !main_grads.is_cuda() || !dy.is_cuda() || !x.is_cuda() || !ends.is_cuda()) return std::nullopt;
  if (dy.scalar_type() != at::kBFloat16 || x.scalar_type() != at::kBFloat16 || ends.scalar_type() != at::kInt ||
      (main_grads.scalar_type() != at::kFloat && main_grads.scalar_type() != at::kBFloat16) || !dy.is_contiguous() ||
      !x.is_contiguous() || !main_grads.is_contiguous() || !ends.is_contiguous()) {
    return std::nullopt;
  }
  const cudaDeviceProp* device = at::cuda::getDeviceProperties(main_grads.device().index());
  if (device->major != 9 || device->minor != 0) return std::nullopt;  // built for sm_90a alone
  cuda::GroupedWgradArgs args;
  args.dy = dy.data_ptr();
  args.x = x.data_ptr();
  args.ends = ends.data_ptr<int32_t>();
  args.main_grad = main_grads.data_ptr();
  args.groups = int(main_grads.size(0));
  args.out = main_grads.size(1);
  args.in = main_grads.size(2);
  args.main_grad_dtype = storage_type(main_grads);
  args.accumulate = accumulate;
  args.sm_count = device->multiProcessorCount;
  if (!cuda::grouped_wgrad_supported(args)) return std::nullopt;
  return args;
}

}  // namespace
#endif

bool grouped_weight_grad_supported(const at::Tensor& main_grads, const at::Tensor& dy, const at::Tensor& x,
                                   const at::Tensor& ends) {
#ifdef MEGATRON_WITH_CUTLASS
  return arguments(main_grads, dy, x, ends, false).has_value();
#else
  (void)main_grads, (void)dy, (void)x, (void)ends;
  return false;
#endif
}

void grouped_weight_grad_into(const at::Tensor& main_grads, const at::Tensor& dy, const at::Tensor& x,
                              const at::Tensor& ends, bool accumulate) {
#ifdef MEGATRON_WITH_CUTLASS
  const std::optional<cuda::GroupedWgradArgs> args = arguments(main_grads, dy, x, ends, accumulate);
  TORCH_CHECK(args.has_value(), "grouped_weight_grad_into: tensors the kernel does not take (ask grouped_weight_grad_supported)");
  // From the caching allocator: stream-ordered, and a captured step keeps its own.
  const at::Tensor workspace =
      at::empty({int64_t(cuda::grouped_wgrad_workspace_bytes(*args))}, main_grads.options().dtype(at::kByte));
  cuda::grouped_wgrad(*args, workspace.data_ptr(), size_t(workspace.numel()), current_stream());
#else
  (void)main_grads, (void)dy, (void)x, (void)ends, (void)accumulate;
  TORCH_CHECK(false, "grouped_weight_grad_into: this build has no CUTLASS kernels");
#endif
}

}  // namespace megatron::kernels
