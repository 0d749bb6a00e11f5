#include "context_parallel/document_blocks.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace megatron::cp {

namespace {

constexpr double kNegativeInfinity = -std::numeric_limits<double>::infinity();

// How many of `runs`' positions lie in [first, end).
int64_t overlap(const std::vector<Positions>& runs, int64_t first, int64_t end) {
  int64_t n = 0;
  for (const Positions& r : runs) n += std::max<int64_t>(0, std::min(end, r.first + r.count) - std::max(first, r.first));
  return n;
}

int64_t total(const std::vector<Positions>& runs) {
  int64_t n = 0;
  for (const Positions& r : runs) n += r.count;
  return n;
}

// Rows [first, first + count) of the rows `runs` lists, as runs of positions.
std::vector<Positions> rows_of(const std::vector<Positions>& runs, int64_t first, int64_t count) {
  std::vector<Positions> out;
  for (const Positions& r : runs) {
    const int64_t skip = std::min(first, r.count), take = std::min(count, r.count - skip);
    if (take > 0) out.push_back({r.first + skip, take});
    first -= skip;
    count -= take;
  }
  return out;
}

// Both starts in one pinned buffer, one copy that does not wait for the device (pageable memory
// would: the driver synchronises the stream before copying from it); the views are contiguous.
void upload(BlockDocuments& pieces, const at::Device& device) {
  const int64_t n = int64_t(pieces.query_starts.size());
  at::Tensor host = at::empty({2 * n}, at::TensorOptions().dtype(at::kInt).pinned_memory(true));
  std::memcpy(host.data_ptr<int32_t>(), pieces.query_starts.data(), n * sizeof(int32_t));
  std::memcpy(host.data_ptr<int32_t>() + n, pieces.key_starts.data(), n * sizeof(int32_t));
  const at::Tensor both = host.to(device, /*non_blocking=*/true);
  pieces.device_query_starts = both.narrow(0, 0, n);
  pieces.device_key_starts = both.narrow(0, n, n);
}

// [b, n, s, d] (strided views welcome) -> [b·s, n, d], the variable-length kernel's rows; a view
// where the layout allows (one sample), a copy otherwise.
at::Tensor kernel_rows(const at::Tensor& x) { return x.transpose(1, 2).reshape({x.size(0) * x.size(2), x.size(1), x.size(3)}); }

// The inverse for b samples: [b·s, n, d] -> [b, n, s, d] (a view).
at::Tensor block_layout(const at::Tensor& x, int64_t b) { return x.view({b, x.size(0) / b, x.size(1), x.size(2)}).transpose(1, 2); }

// The kernel takes one head dim for q, k and v: a narrower value head (multi-latent attention's)
// is padded with zeros, whose output columns are zero and dropped.
at::Tensor padded_to(const at::Tensor& x, int64_t d) { return x.size(-1) < d ? at::constant_pad_nd(x, {0, d - x.size(-1)}) : x; }

PartialAttention flash_documents(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const BlockDocuments& pieces,
                                 bool causal, double scale) {
  const int64_t b = q.size(0), heads = q.size(1), sq = q.size(2), d = q.size(3), value_dim = v.size(3);
  auto [out, lse, rng, unused, debug] = at::_flash_attention_forward(
      kernel_rows(q), kernel_rows(k), kernel_rows(padded_to(v, d)), pieces.device_query_starts, pieces.device_key_starts, pieces.longest_queries,
      pieces.longest_keys, /*dropout_p=*/0.0, causal, /*return_debug_mask=*/false, scale);
  // lse comes back [H, b·sq] fp32. The kernel writes +inf for a piece without keys (and zeros
  // for its output): the merge needs -inf there.
  at::Tensor rows_lse = lse.view({heads, b, sq}).permute({1, 0, 2});  // [b, H, sq]
  if (pieces.queries_without_keys) rows_lse = rows_lse.masked_fill(rows_lse.isinf(), kNegativeInfinity);
  return {block_layout(out, b).narrow(3, 0, value_dim), rows_lse};  // out [b, H, sq, dv] in q's dtype
}

BlockGrads flash_documents_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& out, const at::Tensor& lse, const BlockDocuments& pieces, bool causal,
                                    double scale) {
  const int64_t b = q.size(0), heads = q.size(1), sq = q.size(2), d = q.size(3), value_dim = v.size(3);
  const at::Tensor rows_lse = lse.to(at::kFloat).permute({1, 0, 2}).reshape({heads, b * sq}).contiguous();  // [H, b·sq]
  const at::Tensor rng_state = at::zeros({2}, q.options().dtype(at::kLong));                               // no dropout: never read
  // Padded value heads: dout's zero columns meet out's zero columns (rowsum(dout * out) unchanged).
  auto [dq, dk, dv] = at::_flash_attention_backward(
      kernel_rows(padded_to(dout, d)), kernel_rows(q), kernel_rows(k), kernel_rows(padded_to(v, d)), kernel_rows(padded_to(out, d)),
      rows_lse, pieces.device_query_starts, pieces.device_key_starts, pieces.longest_queries, pieces.longest_keys, /*dropout_p=*/0.0,
      causal, rng_state, at::empty({0}, q.options()), scale);
  return {block_layout(dq, b), block_layout(dk, b), block_layout(dv, b).narrow(3, 0, value_dim)};  // q's dtype
}

// The fused kernel for this call: asked for, or where it takes them; never for a block without a
// piece that has both queries and keys (nothing for it to do).
bool runs_fused(const at::Tensor& q, const at::Tensor& v, const BlockDocuments& pieces, BlockKernel kernel) {
  const bool fused = kernel == BlockKernel::Auto ? documents_take_fused_kernel(q, v) : kernel != BlockKernel::Arithmetic;
  return fused && pieces.longest_keys > 0 && pieces.longest_queries > 0;
}

// f(i, sample, first, end) for document i: positions [first, end) of sample `sample`.
template <typename F>
void for_each_document(const PackedDocuments& documents, F&& f) {
  const int64_t seq = documents.seq_length;
  for (size_t i = 0; i + 1 < documents.starts.size(); ++i) {
    const int64_t sample = documents.starts[i] / seq;
    f(i, sample, documents.starts[i] - sample * seq, documents.starts[i + 1] - sample * seq);
  }
}

// Piece i as rows of sample `sample`: its first query row and first key row within the sample.
struct PieceRows {
  int64_t sample, first_query, queries, first_key, keys;
};
PieceRows piece_rows(const BlockDocuments& pieces, size_t i, int64_t sq, int64_t sk) {
  const int64_t q0 = pieces.query_starts[i], k0 = pieces.key_starts[i];
  const int64_t queries = pieces.query_starts[i + 1] - q0, keys = pieces.key_starts[i + 1] - k0;
  // A piece with no queries may sit at a sample's end in the query rows: its sample is its keys'.
  const int64_t sample = queries > 0 ? q0 / sq : k0 / sk;
  return {sample, q0 - sample * sq, queries, k0 - sample * sk, keys};
}

}  // namespace

BlockDocuments block_documents(const PackedDocuments& documents, const std::vector<Positions>& queries,
                               const std::vector<Positions>& keys, const at::Device& device) {
  const int64_t seq = documents.seq_length, sq = total(queries), sk = total(keys);
  BlockDocuments pieces;
  pieces.query_starts = {0};
  pieces.key_starts = {0};
  for_each_document(documents, [&](size_t i, int64_t, int64_t first, int64_t end) {
    TORCH_CHECK(first >= 0 && end <= seq && first < end, "block_documents: document ", i, " [", documents.starts[i], ", ",
                documents.starts[i + 1], ") crosses a sample of ", seq, " tokens");
    const int64_t nq = overlap(queries, first, end), nk = overlap(keys, first, end);
    if (nq == 0 && nk == 0) return;
    pieces.query_starts.push_back(int32_t(pieces.query_starts.back() + nq));
    pieces.key_starts.push_back(int32_t(pieces.key_starts.back() + nk));
    pieces.longest_queries = std::max(pieces.longest_queries, nq);
    pieces.longest_keys = std::max(pieces.longest_keys, nk);
    pieces.queries_without_keys = pieces.queries_without_keys || (nq > 0 && nk == 0);
  });
  TORCH_CHECK(pieces.query_starts.back() == documents.samples * sq && pieces.key_starts.back() == documents.samples * sk,
              "block_documents: the documents cover ", pieces.query_starts.back(), " query and ", pieces.key_starts.back(),
              " key rows of ", documents.samples * sq, " and ", documents.samples * sk);
  pieces.queries = sq;
  pieces.keys = sk;
  if (device.is_cuda()) upload(pieces, device);
  return pieces;
}

BlockDocuments shared_documents(const PackedDocuments& documents, const std::vector<Positions>& queries,
                                const std::vector<Positions>& keys, const at::Device& device) {
  int64_t first_query = total(queries), end_query = 0, first_key = total(keys), end_key = 0;
  for_each_document(documents, [&](size_t, int64_t, int64_t first, int64_t end) {
    const int64_t nq = overlap(queries, first, end), nk = overlap(keys, first, end);
    if (nq == 0 || nk == 0) return;
    // The document's rows: after the block's rows of positions before it.
    const int64_t q0 = overlap(queries, 0, first), k0 = overlap(keys, 0, first);
    first_query = std::min(first_query, q0);
    end_query = std::max(end_query, q0 + nq);
    first_key = std::min(first_key, k0);
    end_key = std::max(end_key, k0 + nk);
  });
  if (end_query == 0) return BlockDocuments{};  // no document on both sides
  BlockDocuments pieces = block_documents(documents, rows_of(queries, first_query, end_query - first_query),
                                          rows_of(keys, first_key, end_key - first_key), device);
  pieces.first_query = first_query;
  pieces.first_key = first_key;
  return pieces;
}

bool documents_take_fused_kernel(const at::Tensor& q, const at::Tensor& v) { return v.size(-1) <= q.size(-1) && fused_kernels_take(q, q); }

std::vector<Positions> rank_row_positions(int rank, int cp, int64_t c, int64_t first, int64_t count) {
  std::vector<Positions> runs;
  const int64_t early = std::min(first + count, c) - std::min(first, c);  // rows in the early chunk
  if (early > 0) runs.push_back({rank * c + first, early});
  if (count > early) runs.push_back({(2 * cp - 1 - rank) * c + std::max<int64_t>(first - c, 0), count - early});
  return runs;
}

PartialAttention attend_documents(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const BlockDocuments& pieces,
                                  bool causal, double scale, BlockKernel kernel) {
  const int64_t b = q.size(0), heads = q.size(1), sq = q.size(2), sk = k.size(2);
  if (runs_fused(q, v, pieces, kernel)) return flash_documents(q, k, v, pieces, causal, scale);
  PartialAttention acc = empty_partial(b, heads, sq, v.size(3), q.options());  // rows of pieces without keys stay empty
  for (size_t i = 0; i + 1 < pieces.query_starts.size(); ++i) {
    const PieceRows p = piece_rows(pieces, i, sq, sk);
    if (p.queries == 0 || p.keys == 0) continue;
    auto rows = [&](const at::Tensor& x, int64_t first, int64_t n) { return x.narrow(0, p.sample, 1).narrow(2, first, n); };
    const PartialAttention part = attend_block(rows(q, p.first_query, p.queries), rows(k, p.first_key, p.keys),
                                               rows(v, p.first_key, p.keys), causal, at::Tensor(), scale, BlockKernel::Arithmetic);
    rows(acc.out, p.first_query, p.queries).copy_(part.out);
    acc.lse.narrow(0, p.sample, 1).narrow(2, p.first_query, p.queries).copy_(part.lse);
  }
  return acc;
}

BlockGrads attend_documents_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& out, const at::Tensor& lse, const BlockDocuments& pieces, bool causal,
                                     double scale, BlockKernel kernel) {
  const int64_t sq = q.size(2), sk = k.size(2);
  if (runs_fused(q, v, pieces, kernel)) return flash_documents_backward(dout, q, k, v, out, lse, pieces, causal, scale);
  const at::TensorOptions f = q.options().dtype(at::kFloat);
  BlockGrads grads{at::zeros(q.sizes(), f), at::zeros(k.sizes(), f), at::zeros(v.sizes(), f)};
  for (size_t i = 0; i + 1 < pieces.query_starts.size(); ++i) {
    const PieceRows p = piece_rows(pieces, i, sq, sk);
    if (p.queries == 0 || p.keys == 0) continue;
    auto rows = [&](const at::Tensor& x, int64_t first, int64_t n) { return x.narrow(0, p.sample, 1).narrow(2, first, n); };
    const BlockGrads part = attend_block_backward(rows(dout, p.first_query, p.queries), rows(q, p.first_query, p.queries),
                                                  rows(k, p.first_key, p.keys), rows(v, p.first_key, p.keys),
                                                  rows(out, p.first_query, p.queries), rows(lse, p.first_query, p.queries),
                                                  causal, at::Tensor(), scale, BlockKernel::Arithmetic);
    rows(grads.dq, p.first_query, p.queries).copy_(part.dq);
    rows(grads.dk, p.first_key, p.keys).copy_(part.dk);
    rows(grads.dv, p.first_key, p.keys).copy_(part.dv);
  }
  return grads;
}

}  // namespace megatron::cp
