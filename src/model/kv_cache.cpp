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

at::Tensor LayerKvCache::write(size_t part, const at::Tensor& rows) const { return step->write(layer, part, rows); }

at::Tensor LayerKvCache::store(size_t part, at::IntArrayRef row_shape, const at::TensorOptions& options) const {
  return step->store(layer, part, row_shape, options);
}

const at::Tensor& LayerKvCache::stored(size_t part) const { return step->stored(layer, part); }

KvCacheStep::KvCacheStep(KvCache& cache, std::vector<int64_t> slots, int64_t new_tokens, const at::Device& device, std::vector<int64_t> kept)
    : cache_(cache), slots_(std::move(slots)), assigned_(slots_.size()), new_tokens_(new_tokens), kept_(std::move(kept)) {
  TORCH_CHECK(!slots_.empty() && new_tokens_ >= 1, "KvCacheStep: need at least one sequence and one new token");
  TORCH_CHECK(std::set<int64_t>(slots_.begin(), slots_.end()).size() == slots_.size(), "KvCacheStep: a slot appears twice");
  TORCH_CHECK(kept_.empty() || kept_.size() == slots_.size(), "KvCacheStep: ", kept_.size(), " kept counts for ", slots_.size(), " sequences");
  for (int64_t k : kept_) TORCH_CHECK(k >= 1 && k <= new_tokens_, "KvCacheStep: a sequence keeps ", k, " of ", new_tokens_, " new tokens");
  if (std::all_of(kept_.begin(), kept_.end(), [&](int64_t k) { return k == new_tokens_; })) kept_.clear();
  const int64_t b = batch(), s = new_tokens_;
  std::vector<int64_t> lengths;
  bool all_empty = true;
  for (int64_t slot : slots_) {
    TORCH_CHECK(slot >= 0 && slot < cache_.slots(), "KvCacheStep: slot ", slot, " is not one of the cache's ", cache_.slots());
    check_room(slot);
    const int64_t held = cache_.length(slot);
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
  store_rows_ = row_slots_ * cache_.capacity() + row_positions_;
  // New token i of sequence j (at position held_j + i) sees rows 0 ..= held_j + i. With every
  // sequence starting from nothing that is plain causal attention, which SDPA has fast paths for.
  if (!all_empty) {
    attention_mask_ = at::arange(longest_, on_device).view({1, 1, 1, longest_}) <= position_ids_.view({b, 1, s, 1});  // [b, 1, s, L]
  }
}

void KvCacheStep::check_room(int64_t slot) const {
  const int64_t held = cache_.length(slot);
  if (held + new_tokens_ > cache_.capacity()) {
    throw UserError("generation: a sequence would hold " + std::to_string(held + new_tokens_) + " tokens, more than the " +
                    std::to_string(cache_.capacity()) + " the key/value cache keeps per sequence (the model's " +
                    "maximum length); shorten the prompt or ask for fewer new tokens");
  }
}

const at::Tensor& KvCache::attention_tickets(int64_t count, const at::Device& device) {
  if (!attention_tickets_.defined() || attention_tickets_.numel() < count || attention_tickets_.device() != device) {
    constexpr int64_t kGroupsPerSlot = 64;  // KV groups a rank's layer has, at most, in most models
    attention_tickets_ = at::zeros({std::max(count, slots() * kGroupsPerSlot)}, at::TensorOptions().dtype(at::kInt).device(device));
  }
  return attention_tickets_;
}

std::unique_ptr<KvCacheStep> KvCacheStep::fixed_decode(KvCache& cache, int64_t batch, int64_t scratch_slot, const at::Device& device,
                                                       int64_t longest) {
  return std::unique_ptr<KvCacheStep>(new KvCacheStep(Fixed{}, cache, batch, scratch_slot, device, longest));
}

KvCacheStep::KvCacheStep(Fixed, KvCache& cache, int64_t batch, int64_t scratch_slot, const at::Device& device, int64_t longest)
    : cache_(cache), slots_(static_cast<size_t>(batch), scratch_slot), new_tokens_(1),
      longest_(longest > 0 ? longest : cache.capacity()), scratch_slot_(scratch_slot), in_place_(true) {
  TORCH_CHECK(batch >= 1 && scratch_slot >= 0 && scratch_slot < cache.slots(), "KvCacheStep::fixed_decode: batch ", batch,
              ", scratch slot ", scratch_slot, " of ", cache.slots());
  TORCH_CHECK(longest_ <= cache.capacity(), "KvCacheStep::fixed_decode: ", longest_, " keys, the cache holds ", cache.capacity());
  const int64_t b = batch;
  fixed_longs_ = at::zeros({3 * b}, at::TensorOptions().dtype(at::kLong).device(device));     // [slots | held | store rows], b each
  fixed_ints_ = at::zeros({2 * b + 1}, at::TensorOptions().dtype(at::kInt).device(device));  // [key starts (b + 1) | key counts (b)]
  slot_ids_ = fixed_longs_.narrow(0, 0, b);
  position_ids_ = fixed_longs_.narrow(0, b, b).view({b, 1});  // one new token each, at the position after what it holds
  row_slots_ = slot_ids_;
  row_positions_ = fixed_longs_.narrow(0, b, b);
  store_rows_ = fixed_longs_.narrow(0, 2 * b, b);
  key_starts_ = fixed_ints_.narrow(0, 0, b + 1);
  key_counts_ = fixed_ints_.narrow(0, b + 1, b);
  query_starts_ = at::arange(b + 1, at::TensorOptions().dtype(at::kInt).device(device));
  assign({});
}

void KvCacheStep::assign(const std::vector<int64_t>& slots, bool non_blocking) {
  TORCH_CHECK(scratch_slot_ >= 0, "KvCacheStep::assign: only a fixed decode step is reassigned");
  const int64_t b = batch();
  TORCH_CHECK(static_cast<int64_t>(slots.size()) <= b, "KvCacheStep::assign: ", slots.size(), " sequences for a step of ", b);
  TORCH_CHECK(std::set<int64_t>(slots.begin(), slots.end()).size() == slots.size(), "KvCacheStep::assign: a slot appears twice");
  std::vector<int64_t> longs(static_cast<size_t>(3 * b));
  std::vector<int32_t> ints(static_cast<size_t>(2 * b + 1));
  for (int64_t i = 0; i < b; ++i) {
    const bool real = i < static_cast<int64_t>(slots.size());
    const int64_t slot = real ? slots[size_t(i)] : scratch_slot_;
    TORCH_CHECK(slot >= 0 && slot < cache_.slots() && (slot != scratch_slot_ || !real), "KvCacheStep::assign: slot ", slot,
                " (the scratch slot is ", scratch_slot_, ")");
    if (real) check_room(slot);
    const int64_t held = real ? cache_.length(slot) : 0;  // the scratch rows: row 0 written, row 0 read
    TORCH_CHECK(held < longest_, "KvCacheStep::assign: slot ", slot, " holds ", held, " rows; this step attends to ", longest_, " keys");
    slots_[size_t(i)] = slot;
    longs[size_t(i)] = slot;
    longs[size_t(b + i)] = held;
    longs[size_t(2 * b + i)] = slot * cache_.capacity() + held;
    ints[size_t(i)] = static_cast<int32_t>(slot * cache_.capacity());
    ints[size_t(b + 1 + i)] = static_cast<int32_t>(held + 1);
  }
  ints[size_t(b)] = static_cast<int32_t>(cache_.slots() * cache_.capacity());
  // Non-blocking copies come from pinned memory, which the host allocator keeps until they ran.
  const auto staged = [non_blocking](at::Tensor host) { return non_blocking ? host.pin_memory() : host; };
  fixed_longs_.copy_(staged(at::tensor(longs, at::kLong)), non_blocking);
  fixed_ints_.copy_(staged(at::tensor(ints, at::kInt)), non_blocking);
  assigned_ = slots.size();
  committed_ = false;
}

at::Tensor KvCacheStep::extend(int64_t layer, size_t part, const at::Tensor& rows) {
  TORCH_CHECK(scratch_slot_ < 0, "KvCacheStep: a fixed decode step needs attention that reads the cache in place");
  const at::Tensor held = write(layer, part, rows).narrow(1, 0, longest_);  // [slots, L, ...]
  // One sequence: a view of its slot; several: their slots gathered.
  const at::Tensor mine = batch() == 1 ? held.narrow(0, slots_[0], 1) : held.index_select(0, slot_ids_);  // [b, L, ...]
  return mine.transpose(0, 1);                                                                           // [L, b, ...]
}

at::Tensor KvCacheStep::store(int64_t layer, size_t part, at::IntArrayRef row_shape, const at::TensorOptions& options) {
  TORCH_CHECK(!committed_, "KvCacheStep: written after commit()");
  std::vector<at::Tensor>& parts = cache_.parts_.at(static_cast<size_t>(layer));
  if (parts.size() <= part) parts.resize(part + 1);
  at::Tensor& store = parts[part];
  if (!store.defined()) {
    std::vector<int64_t> shape = {cache_.slots(), cache_.capacity()};
    shape.insert(shape.end(), row_shape.begin(), row_shape.end());
    store = at::zeros(shape, options);  // [slots, capacity, ...]
  }
  TORCH_CHECK(store.sizes().slice(2) == row_shape && store.scalar_type() == options.dtype() && store.device() == options.device(),
              "KvCacheStep: layer ", layer, " part ", part, " was cached as ", store.sizes(), " ", store.scalar_type(),
              ", now written as rows of ", row_shape, " ", options.dtype());
  return store;
}

const at::Tensor& KvCacheStep::stored(int64_t layer, size_t part) const {
  const std::vector<at::Tensor>& parts = cache_.parts_.at(static_cast<size_t>(layer));
  TORCH_CHECK(part < parts.size() && parts[part].defined(), "KvCacheStep: layer ", layer, " part ", part, " has no store yet");
  return parts[part];
}

at::Tensor KvCacheStep::write(int64_t layer, size_t part, const at::Tensor& rows) {
  TORCH_CHECK(rows.dim() >= 2 && rows.size(0) == new_tokens_ && rows.size(1) == batch(), "KvCacheStep: rows of shape ",
              rows.sizes(), " for ", new_tokens_, " new tokens of ", batch(), " sequences");
  const at::IntArrayRef rest = rows.sizes().slice(2);  // what one row is
  at::Tensor held = store(layer, part, rest, rows.options());
  const int64_t b = batch(), s = new_tokens_;
  std::vector<int64_t> flat_shape = {b * s};
  flat_shape.insert(flat_shape.end(), rest.begin(), rest.end());
  held.index_put_({row_slots_, row_positions_}, rows.transpose(0, 1).reshape(flat_shape));
  return held;
}

void KvCacheStep::make_varlen_offsets() {
  const int64_t b = batch();
  // One host tensor, one copy to the device: [query starts (b + 1) | key starts (b + 1) | key counts (b)].
  std::vector<int32_t> offsets;
  offsets.reserve(static_cast<size_t>(3 * b + 2));
  for (int64_t i = 0; i <= b; ++i) offsets.push_back(static_cast<int32_t>(i * new_tokens_));
  for (int64_t slot : slots_) offsets.push_back(static_cast<int32_t>(slot * cache_.capacity()));
  offsets.push_back(static_cast<int32_t>(cache_.slots() * cache_.capacity()));
  for (int64_t slot : slots_) offsets.push_back(static_cast<int32_t>(cache_.length(slot) + new_tokens_));
  const at::Tensor all = at::tensor(offsets, at::kInt).to(slot_ids_.device());
  query_starts_ = all.narrow(0, 0, b + 1);
  key_starts_ = all.narrow(0, b + 1, b + 1);
  key_counts_ = all.narrow(0, 2 * b + 2, b);
}

const at::Tensor& KvCacheStep::query_starts() {
  if (!query_starts_.defined()) make_varlen_offsets();
  return query_starts_;
}

const at::Tensor& KvCacheStep::key_starts() {
  if (!key_starts_.defined()) make_varlen_offsets();
  return key_starts_;
}

const at::Tensor& KvCacheStep::key_counts() {
  if (!key_counts_.defined()) make_varlen_offsets();
  return key_counts_;
}

void KvCacheStep::commit() {
  TORCH_CHECK(!committed_, "KvCacheStep: committed twice");
  committed_ = true;
  for (size_t i = 0; i < assigned_; ++i) cache_.lengths_[static_cast<size_t>(slots_[i])] += kept(int64_t(i));
}

at::Tensor KvCacheStep::last_kept_rows(const at::Tensor& rows) const {
  TORCH_CHECK(rows.size(0) == new_tokens_ && rows.size(1) == batch(), "KvCacheStep::last_kept_rows: rows ", rows.sizes(), " for a step of ",
              batch(), " x ", new_tokens_);
  if (!padded()) return rows.narrow(0, new_tokens_ - 1, 1);
  std::vector<int64_t> last;
  for (int64_t k : kept_) last.push_back(k - 1);
  std::vector<int64_t> shape = rows.sizes().vec();
  shape[0] = 1;
  at::Tensor index = at::tensor(last, at::kLong).to(rows.device());  // [b]
  for (size_t d = 2; d < shape.size(); ++d) index = index.unsqueeze(-1);
  return rows.gather(0, index.unsqueeze(0).expand(shape));  // [1, b, ...]
}

}  // namespace megatron
