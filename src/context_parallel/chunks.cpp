#include "context_parallel/chunks.h"

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "core/errors.h"

namespace megatron::cp {

void check_sequence_splits(int64_t seq_length, int context_parallel_size) {
  const int64_t chunks = 2 * int64_t(context_parallel_size);
  if (seq_length % chunks != 0) {
    throw UserError("--seq-length " + std::to_string(seq_length) + " does not cut into 2 x --context-parallel-size = " +
                    std::to_string(chunks) + " equal chunks (each rank holds two, one early and one late, for balanced "
                    "causal attention); use a --seq-length divisible by " + std::to_string(chunks));
  }
}

namespace {

// Chunk indices of every rank's rows, rank by rank: {0, 2cp-1, 1, 2cp-2, ...}.
std::vector<int64_t> chunk_order(int cp) {
  std::vector<int64_t> order;
  for (int r = 0; r < cp; ++r) {
    order.push_back(r);
    order.push_back(2 * cp - 1 - r);
  }
  return order;
}

}  // namespace

at::Tensor rank_positions(int64_t seq_length, int cp, int rank, const at::TensorOptions& options) {
  const int64_t c = seq_length / (2 * cp);
  const at::TensorOptions o = options.dtype(at::kLong);
  return at::cat({at::arange(rank * c, (rank + 1) * c, o), at::arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c, o)});
}

at::Tensor rank_rows(const at::Tensor& x, int64_t dim, int cp, int rank) {
  const int64_t c = x.size(dim) / (2 * cp);
  return at::cat({x.narrow(dim, rank * c, c), x.narrow(dim, (2 * cp - 1 - rank) * c, c)}, dim);
}

at::Tensor rows_in_sequence_order(const at::Tensor& x, int64_t dim, int cp) {
  const std::vector<int64_t> order = chunk_order(cp);  // the chunk at each held block
  std::vector<at::Tensor> blocks = x.chunk(2 * cp, dim);
  std::vector<at::Tensor> ordered(blocks.size());
  for (size_t b = 0; b < blocks.size(); ++b) ordered[size_t(order[b])] = blocks[b];
  return at::cat(ordered, dim);
}

Batch rank_batch(const Batch& batch, int cp, int rank) {
  Batch out = batch;
  const int64_t b = batch.tokens.size(0), seq = batch.tokens.size(1);
  out.tokens = rank_rows(batch.tokens, 1, cp, rank);
  out.labels = rank_rows(batch.labels, 1, cp, rank);
  out.loss_mask = rank_rows(batch.loss_mask, 1, cp, rank);
  out.position_ids = batch.position_ids.defined() ? rank_rows(batch.position_ids, 1, cp, rank)
                                                  : rank_positions(seq, cp, rank, batch.tokens.options()).expand({b, -1}).contiguous();
  return out;
}

}  // namespace megatron::cp
