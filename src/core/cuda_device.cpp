#include "core/cuda_device.h"

#ifdef MEGATRON_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#endif

namespace megatron {

int cuda_compute_capability_major(const c10::Device& device) {
#ifdef MEGATRON_WITH_CUDA_KERNELS
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.has_index() ? device.index() : at::cuda::current_device())->major;  // cached by PyTorch
#endif
  return 0;
}

}  // namespace megatron
