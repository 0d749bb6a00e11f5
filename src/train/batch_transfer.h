// Moving micro-batches to the device: page-locked host copies (so host-to-device copies run
// asynchronously), the move itself, and the copy into a captured step's fixed-address inputs.
// Every field of a Batch, extra ones too, is treated alike.
#pragma once

#include <ATen/core/Tensor.h>

#include "data/micro_batch.h"

namespace megatron {

// Page-locked copies, so that to_device's copies run asynchronously (from pageable memory a
// host-to-device copy waits for the stream, stalling the host once per micro-batch).
Batch pinned(const Batch& b);

// Non-blocking copies on `device` (the batch itself on the CPU).
Batch to_device(Batch b, const at::Device& device);

// Copies `from` (host) into the device tensors of `into`, allocating them the first time: the
// fixed-address inputs a captured step reads. UserError when a field changed shape.
void copy_batch(const Batch& from, Batch& into, const at::Device& device);

}  // namespace megatron
