// The host side of cuda_common.cuh's launch helpers.
#include "kernels/cuda_common.cuh"

namespace megatron::kernels::cuda {

bool overlapping_launch_supported() {
  constexpr int kDevices = 64;
  static int major[kDevices] = {};  // 0: not asked yet (every CUDA device has major >= 1)
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) return false;
  if (major[device] == 0) cudaDeviceGetAttribute(&major[device], cudaDevAttrComputeCapabilityMajor, device);
  return major[device] >= 9;
}

}  // namespace megatron::kernels::cuda
