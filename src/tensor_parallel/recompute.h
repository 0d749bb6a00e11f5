// Activation recomputation (Megatron's --recompute-granularity): a region of the forward runs
// without keeping its activations; only its inputs are saved, and the backward runs the region
// again with autograd on before going back through it. Dropout inside the region draws the
// same masks both times: the default generators' and the model-parallel generator's states at
// the forward are put back for the second run, and the current ones restored after it.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "tensor_parallel/layers.h"

namespace megatron::tp {

// The region: defined tensors in, defined tensors out. It runs twice, so it must not keep
// state between calls (references to caller locals must be copies).
using RecomputedRegion = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// Runs `region` on `inputs` keeping only the inputs for the backward. `draws_random`: the region
// has dropout in effect (then the generator states are recorded; otherwise they are left alone,
// which also keeps a CUDA graph capture free of generator reads). Outside grad mode (evaluation),
// or when no input requires a gradient, this is just region(inputs).
std::vector<at::Tensor> recompute_in_backward(const RecomputedRegion& region, const std::vector<at::Tensor>& inputs,
                                              const TensorParallel& tp, bool draws_random);

// Megatron's CheckpointWithoutOutput (--recompute-modules layernorm / moe_act), for an output its
// consumers keep for their backward (a linear layer keeps its input): once they have run, the
// output's memory is released, and when the gradient of `hook` arrives (a later tensor: every
// backward that reads `output` comes after it) `recompute` makes the values again into the same
// storage. Autograd's graph is untouched; the tensors it saved are whole again before they are
// read. `recompute` must give `output` bit for bit (the same kernels on tensors autograd keeps
// anyway) and must not keep `output` itself. Does nothing outside grad mode, when `hook` needs no
// gradient, or when `output` is not the whole of its storage (a view into a larger buffer).
void discard_output_until_backward(const at::Tensor& output, const at::Tensor& hook, std::function<at::Tensor()> recompute);

}  // namespace megatron::tp
