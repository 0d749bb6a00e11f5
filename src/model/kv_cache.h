// The key/value cache of generation (Megatron-Core's inference context). Each sequence being
// generated holds a slot; each attention layer keeps, per slot, one row per token the sequence
// has seen of whatever its attention block needs again: the keys and values after RoPE for
// self-attention, the key latent and the rotated shared key for multi-latent attention. The
// tensors are made at a layer's first write, so the block decides their shapes and dtype.
//
// A forward over the cache (GPTModel::forward_cached) feeds b sequences s new tokens each. Its
// KvCacheStep says where the new rows go, the positions of the new tokens, and which rows each
// new token sees (every row of its own sequence up to itself).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace megatron {

// The newer decode-step kernels a step may take (EngineOptions::decode_kernels; the commands turn on
// RoPE in the GEMV and the attention kernel where it measured faster on one GPU: docs/inference.md):
struct DecodeKernels {
  // Attention of a decode step over the cache read in place with the one-launch kernel
  // (kernels::decode_attention) where it takes the step, instead of FA2 (--attention-backend decode).
  bool attention = false;
  // --attention-backend auto: that kernel for the steps where it measured faster than FA2 (2 to 16
  // sequences attending to at most 512 keys, one sequence to 129-512: decode_attention_chosen),
  // FA2 for the rest.
  bool attention_where_faster = false;
  // The RMSNorms in front of QKV, fc1 and the output layer computed in their GEMVs at batch 1,
  // instead of a launch each (--decode-norms-in-gemv): prepared by the GEMV before each where it
  // can (kernels::gemv_into_norm) and finished by the one after, else computed by the one after
  // from the residual sum (kernels::gemv_after_norm: the first layer's input norm).
  bool norms_in_gemv = false;
  // Set in decode_kernels_run() only (no option of its own: norms_in_gemv asks for it): a GEMV
  // before a norm (the attention's output projection, fc2) added the residual and did the norm's
  // first half in its epilogue (kernels::gemv_into_norm), for the GEMV after it to finish.
  bool norms_prepared_in_epilogues = false;
  // RoPE of a batch-1 decode step in the epilogue of the QKV GEMV, which writes the rotated
  // queries, keys and values where the RoPE-into-cache kernel would (kernels::gemv_rope_into_cache;
  // --decode-rope-in-gemv).
  bool rope_in_gemv = false;
};

class KvCache {
 public:
  // layers: the model's decoder layers (indices into the chunk's layers); slots: the sequences
  // held at once; capacity: the tokens one sequence may hold.
  KvCache(int64_t layers, int64_t slots, int64_t capacity);

  int64_t slots() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t capacity() const { return capacity_; }
  int64_t length(int64_t slot) const { return lengths_.at(static_cast<size_t>(slot)); }
  // The slot holds nothing any more (its rows are overwritten by the next sequence).
  void clear(int64_t slot) { lengths_.at(static_cast<size_t>(slot)) = 0; }
  // Which of the newer decode kernels the steps over this cache use: the engine's choice.
  void use_decode_kernels(const DecodeKernels& kernels) { decode_kernels_ = kernels; }
  const DecodeKernels& decode_kernels() const { return decode_kernels_; }
  // Which of them a step has run: the layers mark each as they choose it (on the host: for a
  // CUDA graph at its capture), so the commands can say whether what was asked for ran.
  const DecodeKernels& decode_kernels_run() const { return decode_kernels_run_; }
  DecodeKernels& decode_kernels_run() { return decode_kernels_run_; }
  // int32 zeros on `device`, at least `count` of them: the decode attention kernel's tickets, which
  // it leaves zero, shared by every layer and step (they run one after another on one stream).
  // Made at the first call with room for every slot, so a CUDA graph's capture rarely makes them.
  const at::Tensor& attention_tickets(int64_t count, const at::Device& device);

 private:
  friend class KvCacheStep;
  DecodeKernels decode_kernels_, decode_kernels_run_;
  at::Tensor attention_tickets_;
  int64_t capacity_;
  std::vector<std::vector<at::Tensor>> parts_;  // [layer][part]: [slots, capacity, ...], made at the first write
  std::vector<int64_t> lengths_;                // [slot] tokens held
};

class KvCacheStep;

// One layer's view of a step: what an attention block receives.
struct LayerKvCache {
  KvCacheStep* step;
  int64_t layer;
  // rows: [s, b, ...] this step's rows of the layer's cached tensor `part` -> [L, b, ...] every
  // row of the batch's sequences after the step (L: the longest; rows past a shorter sequence's
  // end hold zeros or an earlier sequence's rows, and the mask hides them).
  at::Tensor extend(size_t part, const at::Tensor& rows) const;
  // [b, 1, s, L] bool, true = may attend; undefined when plain causal attention is the same (one
  // sequence starting from nothing).
  const at::Tensor& attention_mask() const;
  // For attention that reads the cache where it lies (no gather): writes this step's rows and
  // returns the layer's whole store of `part`, [slots, capacity, ...]; see KvCacheStep for where
  // each sequence's rows are in it.
  at::Tensor write(size_t part, const at::Tensor& rows) const;
  // For a caller that writes this step's rows itself (at KvCacheStep::store_rows()): the layer's
  // store of `part`, [slots, capacity, row_shape...], made (zeros) at the first call; and the
  // store once made.
  at::Tensor store(size_t part, at::IntArrayRef row_shape, const at::TensorOptions& options) const;
  const at::Tensor& stored(size_t part) const;
};

class KvCacheStep {
 public:
  // Sequences in `slots` (distinct), each adding `new_tokens` after what it holds; a UserError
  // when one would pass the cache's capacity. With `kept` ([b], each from 1 to new_tokens) sequence
  // j keeps only its first kept[j] new tokens: the rows after them are padding (prompts of
  // different lengths in one forward), computed and written past its end like any row, but seen
  // by none of its real tokens (causal) and overwritten by its next ones.
  KvCacheStep(KvCache& cache, std::vector<int64_t> slots, int64_t new_tokens, const at::Device& device,
              std::vector<int64_t> kept = {});
  // A decode step (one new token per sequence) of a fixed `batch`, for replay from a CUDA graph:
  // its device tensors keep their addresses, assign() refills them before each replay, and it
  // attends up to `longest` keys (0: the cache's capacity) with the real lengths read on the
  // device, so attention must read the cache in place (extend() refuses); assign() takes only
  // sequences whose next token is within `longest`. Rows past the sequences assigned decode the
  // cache's `scratch_slot`, which no sequence may hold.
  static std::unique_ptr<KvCacheStep> fixed_decode(KvCache& cache, int64_t batch, int64_t scratch_slot, const at::Device& device,
                                                   int64_t longest = 0);
  // A fixed decode step's sequences for its next run: at most its batch, distinct; a UserError when
  // one is full. Copies what it says to the device (on the current stream); non_blocking: from pinned
  // memory, without waiting for the stream's earlier work.
  void assign(const std::vector<int64_t>& slots, bool non_blocking = false);

  LayerKvCache layer(int64_t index) { return {this, index}; }
  // Attention may read this step's cache in place (CoreAttention::forward_over_cache) rather than
  // gathering it: the engine's choice (EngineOptions::cuda_graphs); always so for a fixed step.
  void allow_reading_in_place() { in_place_ = true; }
  bool reads_in_place() const { return in_place_; }
  int64_t batch() const { return static_cast<int64_t>(slots_.size()); }
  int64_t new_tokens() const { return new_tokens_; }
  // Whether some sequence keeps fewer than new_tokens() (the rest padding), and how many each keeps.
  bool padded() const { return !kept_.empty(); }
  int64_t kept(int64_t j) const { return kept_.empty() ? new_tokens_ : kept_.at(static_cast<size_t>(j)); }
  // [1, b, ...] each sequence's row at its last kept token, of `rows` [s, b, ...] (the step's rows).
  at::Tensor last_kept_rows(const at::Tensor& rows) const;
  // [b, s] int64: the positions of the new tokens (the rows of RoPE they take).
  const at::Tensor& position_ids() const { return position_ids_; }
  // The largest position any sequence reaches, plus one (a fixed step: the bound it was made with).
  int64_t longest() const { return longest_; }
  int64_t capacity() const { return cache_.capacity(); }  // the positions a sequence may reach
  const at::Tensor& attention_mask() const { return attention_mask_; }
  at::Tensor extend(int64_t layer, size_t part, const at::Tensor& rows);
  at::Tensor write(int64_t layer, size_t part, const at::Tensor& rows);
  at::Tensor store(int64_t layer, size_t part, at::IntArrayRef row_shape, const at::TensorOptions& options);
  const at::Tensor& stored(int64_t layer, size_t part) const;
  // [b s] int64 on the device, sequence-major: where each new row goes in a store flattened to
  // [slots * capacity, ...] (slot * capacity + position).
  const at::Tensor& store_rows() const { return store_rows_; }
  // Where the batch's rows are in a store flattened to [slots * capacity, ...], as variable-length
  // attention kernels take them (int32 on the device, made at the first call):
  // [b + 1] where each sequence's new tokens begin among the b * s query rows (sequence-major);
  const at::Tensor& query_starts();
  // [b + 1] where each sequence's rows begin in the store (slot * capacity; the last entry is the
  // store's end, not a row count: key_counts() says how many rows each sequence has);
  const at::Tensor& key_starts();
  // [b] the rows each sequence holds once this step's are written.
  const at::Tensor& key_counts();
  // The sequences hold their new tokens from now on: once, after the forward has run.
  void commit();
  // The cache's choice of decode kernels and the attention kernel's tickets (KvCache above).
  const DecodeKernels& decode_kernels() const { return cache_.decode_kernels(); }
  DecodeKernels& decode_kernels_run() { return cache_.decode_kernels_run(); }
  const at::Tensor& attention_tickets(int64_t count) { return cache_.attention_tickets(count, position_ids_.device()); }

 private:
  struct Fixed {};  // tells fixed_decode's constructor from the other (a braced slot list converts to int64_t)
  KvCacheStep(Fixed, KvCache& cache, int64_t batch, int64_t scratch_slot, const at::Device& device, int64_t longest);
  void check_room(int64_t slot) const;  // UserError when the slot cannot take new_tokens_ more

  KvCache& cache_;
  std::vector<int64_t> slots_;  // a fixed step: the assigned slots, then the scratch slot
  size_t assigned_ = 0;         // the real sequences among slots_ (the first ones)
  int64_t new_tokens_;
  std::vector<int64_t> kept_;  // empty: every sequence keeps new_tokens_
  int64_t longest_ = 0;
  int64_t scratch_slot_ = -1;   // >= 0: a fixed decode step
  bool committed_ = false;
  bool in_place_ = false;
  at::Tensor fixed_longs_, fixed_ints_;  // a fixed step's device buffers, views of which are below
  at::Tensor slot_ids_;      // [b] int64 on the device
  at::Tensor row_slots_;     // [b s]: the slot of each new row
  at::Tensor row_positions_; // [b s]: its position in the slot
  at::Tensor store_rows_;    // [b s]: its row in the flattened store
  at::Tensor position_ids_;  // [b, s]
  at::Tensor attention_mask_;
  at::Tensor query_starts_, key_starts_, key_counts_;  // made by make_varlen_offsets()
  void make_varlen_offsets();
};

}  // namespace megatron
