// Small open-addressing hash maps for the BPE hot path: byte strings -> uint32 (vocabulary,
// word cache) and uint64 -> uint64 (merge table). std::unordered_map allocates per node and
// (in C++17) cannot look up a std::string_view without building a std::string; these store
// keys in one arena and look up views directly.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace megatron::tok {

inline uint64_t hash_bytes(std::string_view s) {
  // 8 bytes at a time with a multiply-xorshift mix: fast, and good enough for token strings.
  const uint64_t k = 0x9E3779B97F4A7C15ULL;
  uint64_t h = s.size() * k;
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * k;
    h ^= h >> 29;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  h = (h ^ tail) * k;
  h ^= h >> 32;
  return h;
}

class StringMap {
 public:
  static constexpr uint32_t kMissing = 0xFFFFFFFFu;

  size_t size() const { return size_; }
  size_t arena_bytes() const { return arena_.size(); }
  void clear() {
    slots_.assign(slots_.size(), Slot{});
    arena_.clear();
    size_ = 0;
  }

  // Inserts key -> value unless key is present; returns false if it was.
  bool insert(std::string_view key, uint32_t value) { return insert(key, hash_bytes(key), value); }
  bool insert(std::string_view key, uint64_t h, uint32_t value) {
    if ((size_ + 1) * 4 > slots_.size() * 3) grow();
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.len == kEmpty) {
        s.hash = h;
        s.offset = static_cast<uint32_t>(arena_.size());
        s.len = static_cast<uint32_t>(key.size());
        s.value = value;
        arena_.append(key.data(), key.size());
        ++size_;
        return true;
      }
      if (s.hash == h && key_of(s) == key) return false;
    }
  }

  uint32_t find(std::string_view key) const { return find(key, hash_bytes(key)); }
  uint32_t find(std::string_view key, uint64_t h) const {
    if (slots_.empty()) return kMissing;
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.len == kEmpty) return kMissing;
      if (s.hash == h && key_of(s) == key) return s.value;
    }
  }

 private:
  static constexpr uint32_t kEmpty = 0xFFFFFFFFu;
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0;
    uint32_t len = kEmpty;
    uint32_t value = 0;
  };
  std::string_view key_of(const Slot& s) const {
    return std::string_view(arena_.data() + s.offset, s.len);
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? 64 : old.size() * 2, Slot{});
    size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.len == kEmpty) continue;
      size_t i = s.hash & mask;
      while (slots_[i].len != kEmpty) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  std::string arena_;
  size_t size_ = 0;
};

class U64Map {
 public:
  static constexpr uint64_t kMissing = ~0ULL;
  void insert_or_assign(uint64_t key, uint64_t value) {
    if ((size_ + 1) * 2 > keys_.size()) grow();
    size_t mask = keys_.size() - 1;
    for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
      if (keys_[i] == kMissing) {
        keys_[i] = key;
        values_[i] = value;
        ++size_;
        return;
      }
      if (keys_[i] == key) {
        values_[i] = value;  // a repeated merge takes its last rank, as in HF's map
        return;
      }
    }
  }
  uint64_t find(uint64_t key) const {
    if (keys_.empty()) return kMissing;
    size_t mask = keys_.size() - 1;
    for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
      if (keys_[i] == key) return values_[i];
      if (keys_[i] == kMissing) return kMissing;
    }
  }

 private:
  static uint64_t mix(uint64_t x) {
    x *= 0x9E3779B97F4A7C15ULL;
    return x ^ (x >> 31);
  }
  void grow() {
    std::vector<uint64_t> ok = std::move(keys_), ov = std::move(values_);
    size_t n = ok.empty() ? 1024 : ok.size() * 2;
    keys_.assign(n, kMissing);
    values_.assign(n, 0);
    size_ = 0;
    for (size_t i = 0; i < ok.size(); ++i) {
      if (ok[i] != kMissing) insert_or_assign(ok[i], ov[i]);
    }
  }
  std::vector<uint64_t> keys_, values_;
  size_t size_ = 0;
};

}  // namespace megatron::tok
