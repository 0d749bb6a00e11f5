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
#include <vector>

namespace megatron {

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

 private:
  friend class KvCacheStep;
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
};

class KvCacheStep {
 public:
  // Sequences in `slots` (distinct), each adding `new_tokens` after what it holds; a UserError
  // when one would pass the cache's capacity.
  KvCacheStep(KvCache& cache, std::vector<int64_t> slots, int64_t new_tokens, const at::Device& device);

  LayerKvCache layer(int64_t index) { return {this, index}; }
  int64_t batch() const { return static_cast<int64_t>(slots_.size()); }
  int64_t new_tokens() const { return new_tokens_; }
  // [b, s] int64: the positions of the new tokens (the rows of RoPE they take).
  const at::Tensor& position_ids() const { return position_ids_; }
  // The largest position any sequence reaches, plus one.
  int64_t longest() const { return longest_; }
  const at::Tensor& attention_mask() const { return attention_mask_; }
  at::Tensor extend(int64_t layer, size_t part, const at::Tensor& rows);
  // The sequences hold their new tokens from now on: once, after the forward has run.
  void commit();

 private:
  KvCache& cache_;
  std::vector<int64_t> slots_;
  int64_t new_tokens_;
  int64_t longest_ = 0;
  bool committed_ = false;
  at::Tensor slot_ids_;      // [b] int64 on the device
  at::Tensor row_slots_;     // [b s]: the slot of each new row
  at::Tensor row_positions_; // [b s]: its position in the slot
  at::Tensor position_ids_;  // [b, s]
  at::Tensor attention_mask_;
};

}  // namespace megatron
