// The grouped weight-gradient GEMM into bf16 main_grads (--grad-reduce-in-bf16, or the
// precision-aware optimizer's --main-grads-dtype bf16): one instantiation a file, so the two
// heavy CUTLASS kernels compile side by side.
#include "kernels/cutlass/grouped_wgrad.cuh"

namespace megatron::kernels::cuda::grouped_wgrad_detail {
template struct Runner<cutlass::bfloat16_t>;
}  // namespace megatron::kernels::cuda::grouped_wgrad_detail
