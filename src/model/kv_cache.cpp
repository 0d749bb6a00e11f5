#include "model/kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <set>
#include <string>

#include "core/errors.h"

namespace megatron {

KvCache::KvCache(int64_t layers, int64_t slots, int64_t capacity)
    : capacity_(capacity), parts_(static_cast<size_t>(layers)), lengths_(static_cast<size_t>(slots), 0) {
  TORCH_CHECK(layers >= 0 && slots >= 1 && capacity >= 1, "KvCache: need slots >= 1 and capacity >= 1");
}

at::Tensor LayerKvCache::extend(size_t part, const at::Tensor& rows) const { return step->extend(layer, part, rows); }

const at::Tensor& LayerKvCache::attention_mask() const { return step->attention_mask(); }

KvCacheStep::KvCacheStep(KvCache& cache, std::vector<int64_t> slots, int64_t new_tokens, const at::Device& device)
    : cache_(cache), slots_(std::move(slots)), new_tokens_(new_tokens) {
  TORCH_CHECK(!slots_.empty() && new_tokens_ >= 1, "KvCacheStep: need at least one sequence and one new token");
  TORCH_CHECK(std::set<int64_t>(slots_.begin(), slots_.end()).size() == slots_.size(), "KvCacheStep: a slot appears twice");
  const int64_t b = batch(), s = new_tokens_;
  std::vector<int64_t> lengths;
  bool all_empty = true;
  for (int64_t slot : slots_) {
    TORCH_CHECK(slot >= 0 && slot < cache_.slots(), "KvCacheStep: slot ", slot, " is not one of the cache's ", cache_.slots());
    const int64_t held = cache_.length(slot);
    if (held + s > cache_.capacity()) {
      throw UserError("generation: a sequence would hold " + std::to_string(held + s) + " tokens, more than the " +
                      std::to_string(cache_.capacity()) + " the key/value cache keeps per sequence (the model's " +
                      "maximum length); shorten the prompt or ask for fewer new tokens");
    }
    lengths.push_back(held);
    all_empty = all_empty && held == 0;
    longest_ = std::max(longest_, held + s);
  }
  const at::TensorOptions on_device = at::TensorOptions().dtype(at::kLong).device(device);
  slot_ids_ = at::tensor(slots_, at::kLong).to(device);                           // [b]
  const at::Tensor held = at::tensor(lengths, at::kLong).to(device).view({b, 1});  // [b, 1]
  position_ids_ = held + at::arange(s, on_device).view({1, s});                   // [b, s]
  row_slots_ = slot_ids_.view({b, 1}).expand({b, s}).reshape({b * s});
  row_positions_ = position_ids_.reshape({b * s});
  // New token i of sequence j (at position held_j + i) sees rows 0 ..= held_j + i. With every
  // sequence starting from nothing that is plain causal attention, which SDPA has fast paths for.
  if (!all_empty) {
    attention_mask_ = at::arange(longest_, on_device).view({1, 1, 1, longest_}) <= position_ids_.view({b, 1, s, 1});  // [b, 1, s, L]
  }
}

at::Tensor KvCacheStep::extend(int64_t layer, size_t part, const at::Tensor& rows) {
  TORCH_CHECK(!committed_, "KvCacheStep: written after commit()");
  TORCH_CHECK(rows.dim() >= 2 && rows.size(0) == new_tokens_ && rows.size(1) == batch(), "KvCacheStep: rows of shape ",
              rows.sizes(), " for ", new_tokens_, " new tokens of ", batch(), " sequences");
  std::vector<at::Tensor>& parts = cache_.parts_.at(static_cast<size_t>(layer));
  if (parts.size() <= part) parts.resize(part + 1);
  at::Tensor& store = parts[part];
  const at::IntArrayRef rest = rows.sizes().slice(2);  // what one row is
  if (!store.defined()) {
    std::vector<int64_t> shape = {cache_.slots(), cache_.capacity()};
    shape.insert(shape.end(), rest.begin(), rest.end());
    store = at::zeros(shape, rows.options());  // [slots, capacity, ...]
  }
  TORCH_CHECK(store.sizes().slice(2) == rest && store.scalar_type() == rows.scalar_type() && store.device() == rows.device(),
              "KvCacheStep: layer ", layer, " part ", part, " was cached as ", store.sizes(), " ", store.scalar_type(),
              ", now written as ", rows.sizes(), " ", rows.scalar_type());
  const int64_t b = batch(), s = new_tokens_;
  std::vector<int64_t> flat_shape = {b * s};
  flat_shape.insert(flat_shape.end(), rest.begin(), rest.end());
  store.index_put_({row_slots_, row_positions_}, rows.transpose(0, 1).reshape(flat_shape));
  const at::Tensor held = store.narrow(1, 0, longest_);  // [slots, L, ...]
  // One sequence: a view of its slot; several: their slots gathered.
  const at::Tensor mine = b == 1 ? held.narrow(0, slots_[0], 1) : held.index_select(0, slot_ids_);  // [b, L, ...]
  return mine.transpose(0, 1);                                                                         // [L, b, ...]
}

void KvCacheStep::commit() {
  TORCH_CHECK(!committed_, "KvCacheStep: committed twice");
  committed_ = true;
  for (int64_t slot : slots_) cache_.lengths_[static_cast<size_t>(slot)] += new_tokens_;
}

}  // namespace megatron
