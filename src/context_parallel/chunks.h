// Which tokens a context-parallel rank holds. The sequence of S tokens is cut into 2·CP chunks
// of c = S / (2·CP); rank i holds chunks i and 2·CP−1−i, back to back ([2c] rows). Under causal
// attention the early chunks are cheap and the late ones dear, so pairing one of each gives every
// rank the same work (Megatron-Core's load balancing for context parallelism).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "data/micro_batch.h"

namespace megatron::cp {

// Refuses a sequence that does not cut into 2·CP equal chunks, naming the flags.
void check_sequence_splits(int64_t seq_length, int context_parallel_size);

// The true positions of rank `rank`'s rows: [2c] int64, chunk i then chunk 2·CP−1−i.
at::Tensor rank_positions(int64_t seq_length, int cp, int rank, const at::TensorOptions& options);

// x with dimension `dim` (of length S) cut to rank `rank`'s rows (a copy: [.., 2c, ..]).
at::Tensor rank_rows(const at::Tensor& x, int64_t dim, int cp, int rank);

// The inverse over every rank: x [.., cp·2c, ..] holding rank 0's rows, then rank 1's, ... along
// `dim` -> the sequence in true order [.., S, ..].
at::Tensor rows_in_sequence_order(const at::Tensor& x, int64_t dim, int cp);

// A micro-batch [b, S] cut to rank `rank`'s rows: tokens, labels, loss mask and positions
// [b, 2c] (positions made explicit where the batch had none, so RoPE and learned positions see
// the true ones). The attention mask (packed documents' ids [b, S], or a dense [b, 1, S, S]),
// when there is one, stays whole: context-parallel attention reads every rank's documents. Extra
// fields stay whole.
Batch rank_batch(const Batch& batch, int cp, int rank);

}  // namespace megatron::cp
