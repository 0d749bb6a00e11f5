// The run's numeric formats, decided by the precision flags: the dtype the model computes in, and
// the start-up line that says how weights, gradients and optimizer state are kept.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

#include "core/config.h"

namespace megatron {

// The precision flags' checks and derived fields, part of finalize_config (train/arguments.h):
// --fp16 and loss scaling, --use-precision-aware-optimizer's dtypes, --optimizer-cpu-offload, FP8.
// Throws UserError naming the flag.
void finalize_precision(Config& config);

// The parameters' and activations' dtype: --bf16, --fp16, or fp32.
inline at::ScalarType params_dtype(const TrainConfig& t) { return t.bf16 ? at::kBFloat16 : t.fp16 ? at::kHalf : at::kFloat; }

// E.g. "bf16 (fp32 master weights as bf16 + 16-bit remainders, bf16 gradients, Adam moments
// bf16/bf16)", "fp16 (fp32 master weights and gradients, dynamic loss scale from 4.29497e+09)".
std::string describe_precision(const TrainConfig& t, const ParallelConfig& p);

// The FP8 start-up line ("" without --fp8-format), e.g. "> FP8 GEMMs: hybrid (e4m3 forward,
// e5m2 gradients), delayed scaling (amax history 1024, max, margin 0), layers 0-31".
std::string describe_fp8(const ModelConfig& m);
// Throws UserError when `device` cannot run FP8 GEMMs (a GPU before Ada / Hopper): one tiny FP8
// GEMM is tried. On the CPU they run (as fp32 GEMMs of the FP8 values, for tests): returns the
// notice to print then, else "".
std::string check_fp8_device(const ModelConfig& m, const at::Device& device);

}  // namespace megatron
