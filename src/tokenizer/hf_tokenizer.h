// The HF tokenizers pipeline for BPE models: added-token extraction, normalizer,
// pre-tokenizer, BPE model, post-processor (BOS/EOS) and decoder. Built from a tokenizer.json
// (hf_tokenizer_json.cpp) or from GPT-2's vocab.json + merges.txt (gpt2_files.cpp).
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace megatron::tok {

struct HfParts {
  std::unique_ptr<Normalizer> normalizer;      // may be null
  std::unique_ptr<PreTokenizer> pre_tokenizer; // may be null
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<Decoder> decoder;            // may be null
  std::vector<AddedToken> added_tokens;
  std::vector<int64_t> prefix_ids, suffix_ids; // what the post-processor wraps a sequence in
  std::optional<int64_t> bos, eos;
};

class HfTokenizer : public Tokenizer {
 public:
  explicit HfTokenizer(HfParts parts);

  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t base_vocab_size() const override { return parts_.model->max_id() + 1; }
  std::optional<int64_t> bos_id() const override { return parts_.bos; }
  std::optional<int64_t> eos_id() const override { return parts_.eos; }
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  std::optional<std::string> id_to_token(int64_t id) const override;

 protected:
  std::vector<int64_t> do_encode(std::string_view text, bool add_special_tokens) const override;

 private:
  void encode_plain(std::string_view text, std::vector<int64_t>* ids) const;
  void encode_normalized(std::string_view text, std::vector<int64_t>* ids) const;

  HfParts parts_;
  AddedTokenMatcher raw_added_;         // normalized=false tokens, matched on the input
  AddedTokenMatcher normalized_added_;  // normalized=true tokens, matched after normalizing
  std::unordered_map<std::string, int64_t> added_by_content_;
  std::unordered_map<int64_t, std::string> added_by_id_;
  int64_t vocab_size_ = 0;
};

// Loads a tokenizer.json (path: the file or a directory holding it, plus tokenizer_config.json
// if present). Throws UserError naming the file and what to do.
std::unique_ptr<HfTokenizer> load_tokenizer_json(const std::string& path);

// GPT-2 style vocab.json + merges.txt (Megatron's GPT2BPETokenizer): GPT-2's regex, byte-level
// BPE, EOS/EOD = <|endoftext|>; "<|endoftext|>" in text is ordinary text there, as in Megatron.
std::unique_ptr<HfTokenizer> load_gpt2_files(const std::string& vocab_file,
                                             const std::string& merge_file);

}  // namespace megatron::tok
