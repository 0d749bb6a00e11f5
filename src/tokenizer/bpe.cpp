// BPE model; see bpe.h. The merge order reproduces HF's Word::merge_all exactly: always apply
// the pair of lowest rank, the leftmost one on ties, until no pair has a merge.
#include "tokenizer/bpe.h"

#include <cstdio>
#include <queue>
#include <stdexcept>

#include "tokenizer/unicode.h"

namespace megatron::tok {

namespace {
constexpr size_t kCacheShards = 16;
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kMaxShardWords = 1 << 15;
// Words of at most this many symbols use the quadratic scan, which beats a heap on short words.
constexpr size_t kSmallWord = 40;
}  // namespace

BpeModel::BpeModel(const std::vector<std::pair<std::string, int64_t>>& vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options)
    : options_(std::move(options)), cache_(new CacheShard[kCacheShards]) {
  byte_ids_.fill(-1);
  fallback_ids_.fill(-1);
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
  // Ids index a dense table (and become embedding rows): real vocabularies number their tokens
  // 0..N-1. An id far past the entries (a damaged file's 55555553 among eight) would allocate
  // gigabytes; refused before anything is allocated.
  const int64_t id_limit = 2 * static_cast<int64_t>(vocab.size()) + 1024;
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab) {
    if (id < 0 || id >= id_limit) {
      throw std::invalid_argument("token id " + std::to_string(id) + " of '" + token + "' is out of range: a vocabulary of " +
                                  std::to_string(vocab.size()) + " entries numbers them from 0, below " + std::to_string(id_limit));
    }
    max_id = std::max(max_id, id);
  }
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  std::string bytes;
  for (const auto& [token, id] : vocab) {
    if (id < 0 || id > 0x7FFFFFFF) throw std::invalid_argument("token id out of range: " + token);
    id_to_token_[static_cast<size_t>(id)] = token;
    file_tokens_.insert(token, static_cast<uint32_t>(id));
    if (options_.byte_level) {
      // A key outside the byte alphabet can never be produced by byte-level pre-tokens.
      if (!alphabet.decode(token, &bytes)) continue;
      symbols_.insert(bytes, static_cast<uint32_t>(id));
      if (bytes.size() == 1) byte_ids_[static_cast<unsigned char>(bytes[0])] = static_cast<int32_t>(id);
    } else {
      symbols_.insert(token, static_cast<uint32_t>(id));
    }
  }
  if (options_.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      uint32_t id = file_tokens_.find(name);
      if (id != StringMap::kMissing) fallback_ids_[b] = static_cast<int32_t>(id);
    }
  }
  if (!options_.unk_token.empty()) {
    uint32_t id = file_tokens_.find(options_.unk_token);
    if (id == StringMap::kMissing) {
      throw std::invalid_argument("unk_token '" + options_.unk_token + "' is not in the vocabulary");
    }
    unk_id_ = static_cast<int32_t>(id);
  }
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    uint32_t ia = file_tokens_.find(a), ib = file_tokens_.find(b);
    uint32_t im = file_tokens_.find(a + b);
    for (const std::string* t : {&a, &b}) {
      if (file_tokens_.find(*t) == StringMap::kMissing) {
        throw std::invalid_argument("merge " + std::to_string(rank) + " ('" + a + "' '" + b +
                                    "') uses '" + *t + "', which is not in the vocabulary");
      }
    }
    if (im == StringMap::kMissing) {
      throw std::invalid_argument("merge " + std::to_string(rank) + " ('" + a + "' '" + b +
                                  "') makes '" + a + b + "', which is not in the vocabulary");
    }
    merges_.insert_or_assign(static_cast<uint64_t>(ia) << 32 | ib,
                             static_cast<uint64_t>(rank) << 32 | im);
  }
}

BpeModel::~BpeModel() = default;

int64_t BpeModel::token_to_id(std::string_view token) const {
  uint32_t id = file_tokens_.find(token);
  return id == StringMap::kMissing ? -1 : static_cast<int64_t>(id);
}

const std::string* BpeModel::id_to_token(int64_t id) const {
  if (id < 0 || id >= static_cast<int64_t>(id_to_token_.size())) return nullptr;
  const std::string& t = id_to_token_[static_cast<size_t>(id)];
  return t.empty() ? nullptr : &t;
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>* ids) const {
  if (options_.byte_level) {
    // Without an id for a byte (never the case in real byte-level files), HF drops it.
    for (unsigned char b : word) {
      if (byte_ids_[b] >= 0) ids->push_back(byte_ids_[b]);
    }
    return;
  }
  // One symbol per code point; unknown ones become <0xHH> tokens or (fused) unk, as HF.
  bool pending_unk = false;
  size_t i = 0;
  while (i < word.size()) {
    size_t start = i;
    next_code_point(word, &i);
    std::string_view ch = word.substr(start, i - start);
    uint32_t id = symbols_.find(ch);
    if (id != StringMap::kMissing) {
      if (pending_unk) ids->push_back(unk_id_), pending_unk = false;
      ids->push_back(static_cast<int32_t>(id));
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (unsigned char b : ch) all = all && fallback_ids_[b] >= 0;
      if (all) {
        if (pending_unk) ids->push_back(unk_id_), pending_unk = false;
        for (unsigned char b : ch) ids->push_back(fallback_ids_[b]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk && !options_.fuse_unk) ids->push_back(unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) ids->push_back(unk_id_);
}

void BpeModel::merge_small(std::vector<int32_t>* ids) const {
  std::vector<int32_t>& s = *ids;
  // rank_of[i]: packed merge of (s[i], s[i+1]); compare packed values, whose high half is the rank.
  uint64_t merge_at[kSmallWord];
  size_t n = s.size();
  for (size_t i = 0; i + 1 < n; ++i) merge_at[i] = merge_of(s[i], s[i + 1]);
  while (n > 1) {
    size_t best = 0;
    uint64_t best_merge = U64Map::kMissing;
    for (size_t i = 0; i + 1 < n; ++i) {
      if (merge_at[i] < best_merge) best_merge = merge_at[i], best = i;
    }
    if (best_merge == U64Map::kMissing) break;
    s[best] = static_cast<int32_t>(best_merge & 0xFFFFFFFFu);
    for (size_t i = best + 1; i + 1 < n; ++i) s[i] = s[i + 1];
    for (size_t i = best + 1; i + 2 < n; ++i) merge_at[i] = merge_at[i + 1];
    --n;
    if (best > 0) merge_at[best - 1] = merge_of(s[best - 1], s[best]);
    if (best + 1 < n) merge_at[best] = merge_of(s[best], s[best + 1]);
  }
  s.resize(n);
}

void BpeModel::merge_large(std::vector<int32_t>* ids) const {
  // HF's algorithm: a min-heap of (rank, position), symbols in a linked list, stale heap
  // entries skipped when the pair at that position no longer makes the same token.
  const size_t n = ids->size();
  std::vector<Symbol> sym(n);
  for (size_t i = 0; i < n; ++i) {
    sym[i] = Symbol{(*ids)[i], static_cast<int32_t>(i) - 1,
                    i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
  }
  using Entry = std::pair<uint64_t, int32_t>;  // (rank << 32 | new_id, position)
  auto later = [](const Entry& x, const Entry& y) {
    uint64_t rx = x.first >> 32, ry = y.first >> 32;
    return rx != ry ? rx > ry : x.second > y.second;
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(later)> heap(later);
  for (size_t i = 0; i + 1 < n; ++i) {
    uint64_t m = merge_of(sym[i].id, sym[i + 1].id);
    if (m != U64Map::kMissing) heap.emplace(m, static_cast<int32_t>(i));
  }
  std::vector<bool> removed(n, false);
  while (!heap.empty()) {
    auto [m, pos] = heap.top();
    heap.pop();
    if (removed[pos] || sym[pos].next < 0) continue;
    int32_t right = sym[pos].next;
    if (merge_of(sym[pos].id, sym[right].id) != m) continue;
    sym[pos].id = static_cast<int32_t>(m & 0xFFFFFFFFu);
    removed[right] = true;
    sym[pos].next = sym[right].next;
    if (sym[pos].next >= 0) sym[sym[pos].next].prev = pos;
    if (sym[pos].prev >= 0) {
      uint64_t pm = merge_of(sym[sym[pos].prev].id, sym[pos].id);
      if (pm != U64Map::kMissing) heap.emplace(pm, sym[pos].prev);
    }
    if (sym[pos].next >= 0) {
      uint64_t nm = merge_of(sym[pos].id, sym[sym[pos].next].id);
      if (nm != U64Map::kMissing) heap.emplace(nm, pos);
    }
  }
  ids->clear();
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = sym[i].next) ids->push_back(sym[i].id);
}

void BpeModel::encode_word(std::string_view word, std::vector<int64_t>* out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    uint32_t id = symbols_.find(word);
    if (id != StringMap::kMissing) {
      out->push_back(id);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  uint64_t h = 0;
  CacheShard* shard = nullptr;
  if (cacheable) {
    h = hash_bytes(word);
    shard = &cache_[(h >> 56) % kCacheShards];
    std::lock_guard<std::mutex> lock(shard->mutex);
    uint32_t off = shard->index.find(word, h);
    if (off != StringMap::kMissing) {
      const int32_t* p = shard->pool.data() + off;
      out->insert(out->end(), p + 1, p + 1 + p[0]);
      return;
    }
  }
  thread_local std::vector<int32_t> ids;
  ids.clear();
  initial_symbols(word, &ids);
  if (ids.size() <= kSmallWord) {
    merge_small(&ids);
  } else {
    merge_large(&ids);
  }
  out->insert(out->end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard->mutex);
    if (shard->index.size() >= kMaxShardWords) {
      shard->index.clear();
      shard->pool.clear();
    }
    if (shard->index.insert(word, h, static_cast<uint32_t>(shard->pool.size()))) {
      shard->pool.push_back(static_cast<int32_t>(ids.size()));
      shard->pool.insert(shard->pool.end(), ids.begin(), ids.end());
    }
  }
}

}  // namespace megatron::tok
