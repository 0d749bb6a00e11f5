#include "core/cuda_device.h"

#ifdef MEGATRON_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace megatron {

int cuda_compute_capability_major(const c10::Device& device) {
#ifdef MEGATRON_WITH_CUDA_KERNELS
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.has_index() ? device.index() : at::cuda::current_device())->major;  // cached by PyTorch
#endif
  return 0;
}

bool cuda_stream_capturing() {
#ifdef MEGATRON_WITH_CUDA_KERNELS
  if (at::cuda::is_available()) return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#endif
  return false;
}

}  // namespace megatron
