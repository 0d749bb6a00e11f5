// The BPE model of HF tokenizers (and GPT-2's encoder): splits one pre-token into initial
// symbols, applies the ranked merges, and maps the result to ids; with a word cache, because
// natural text repeats a small set of words. Byte-level vocabularies (GPT-2, Llama 3, Qwen)
// are stored as raw bytes so pre-tokens never need the byte->char mapping on the hot path.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/flat_map.h"

namespace megatron::tok {

struct BpeOptions {
  bool byte_level = false;   // pre-tokens are raw bytes; vocab keys use GPT-2's byte alphabet
  bool ignore_merges = false;
  bool byte_fallback = false;
  bool fuse_unk = false;
  std::string unk_token;     // empty: none
};

class BpeModel {
 public:
  // vocab: (token as written in the file, id); merges: pairs of tokens, rank = index.
  // Throws std::invalid_argument when a merge refers to a token missing from the vocabulary.
  BpeModel(const std::vector<std::pair<std::string, int64_t>>& vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);
  ~BpeModel();

  // Appends the ids of one pre-token (raw bytes in byte-level mode, else UTF-8 text).
  void encode_word(std::string_view word, std::vector<int64_t>* out) const;

  // Token strings as written in the file (byte-level form for byte-level vocabularies).
  int64_t token_to_id(std::string_view token) const;  // -1 if absent
  const std::string* id_to_token(int64_t id) const;   // nullptr if absent
  int64_t max_id() const { return static_cast<int64_t>(id_to_token_.size()) - 1; }
  bool byte_level() const { return options_.byte_level; }

 private:
  struct Symbol {
    int32_t id;
    int32_t prev, next;
  };
  void initial_symbols(std::string_view word, std::vector<int32_t>* ids) const;
  void merge_small(std::vector<int32_t>* ids) const;
  void merge_large(std::vector<int32_t>* ids) const;
  // (rank << 32 | new_id) for the pair (a, b), or U64Map::kMissing.
  uint64_t merge_of(int32_t a, int32_t b) const {
    return merges_.find(static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 |
                        static_cast<uint32_t>(b));
  }

  BpeOptions options_;
  StringMap symbols_;                  // model-side key (raw bytes if byte-level) -> id
  std::vector<std::string> id_to_token_;
  StringMap file_tokens_;              // key as written in the file -> id
  U64Map merges_;
  std::array<int32_t, 256> byte_ids_;  // byte-level: id of each single byte, -1 if none
  std::array<int32_t, 256> fallback_ids_;  // byte_fallback: id of "<0xHH>", -1 if none
  int32_t unk_id_ = -1;

  // Word cache: 16 shards, each a map word -> offset into a pool of [count, ids...].
  struct CacheShard {
    std::mutex mutex;
    StringMap index;
    std::vector<int32_t> pool;
  };
  std::unique_ptr<CacheShard[]> cache_;
};

}  // namespace megatron::tok
