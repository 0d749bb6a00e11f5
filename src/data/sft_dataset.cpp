// Packed SFT dataset: validation of the id / loss-mask pair and pack -> LtorSample.
#include "data/sft_dataset.h"

#include <algorithm>
#include <stdexcept>

#include "core/errors.h"
#include "data/sft_preprocess.h"

namespace megatron {

SftDataset::SftDataset(const std::string& prefix, int64_t seq_length, int64_t pad_id)
    : ids_(sft_input_ids_prefix(prefix)), mask_(sft_loss_mask_prefix(prefix)), seq_length_(seq_length),
      pad_id_(pad_id) {
  const std::string what = sft_input_ids_prefix(prefix) + " / " + sft_loss_mask_prefix(prefix);
  if (seq_length < 1) throw UserError("SFT dataset: --seq-length must be positive");
  if (!token_dtype_is_integer(ids_.dtype())) throw UserError(what + ": token ids are not integers");
  if (mask_.dtype() != TokenDType::kUInt8) throw UserError(sft_loss_mask_prefix(prefix) + ": loss mask is not uint8");
  if (ids_.num_sequences() != mask_.num_sequences() || ids_.num_documents() != mask_.num_documents()) {
    throw UserError(what + ": the datasets disagree on the number of samples or packs; preprocess again");
  }
  const auto ids_len = ids_.sequence_lengths(), mask_len = mask_.sequence_lengths();
  for (size_t s = 0; s < ids_len.size(); ++s) {
    if (ids_len[s] != mask_len[s]) {
      throw UserError(what + ": sample " + std::to_string(s) + " has different lengths; preprocess again");
    }
  }
  const auto ids_doc = ids_.document_indices(), mask_doc = mask_.document_indices();
  for (size_t d = 0; d + 1 < ids_doc.size(); ++d) {
    if (ids_doc[d + 1] != mask_doc[d + 1]) throw UserError(what + ": pack " + std::to_string(d) + " differs");
    int64_t total = 0;
    for (int64_t s = ids_doc[d]; s < ids_doc[d + 1]; ++s) total += ids_len[static_cast<size_t>(s)];
    if (total > seq_length + 1) {
      throw UserError(what + ": pack " + std::to_string(d) + " holds " + std::to_string(total) +
                      " tokens, more than --seq-length + 1 = " + std::to_string(seq_length + 1) +
                      "; train with the --seq-length given to preprocess --sft (see its _sft.json) or "
                      "preprocess again");
    }
  }
}

void SftDataset::read_pack(size_t i, std::vector<int64_t>* tokens, std::vector<uint8_t>* mask,
                           std::vector<int64_t>* sample_lengths) const {
  if (i >= size()) throw std::out_of_range("SftDataset: pack " + std::to_string(i) + " of " + std::to_string(size()));
  const size_t n = static_cast<size_t>(seq_length_) + 1;
  tokens->assign(n, pad_id_);
  mask->assign(n, 0);
  sample_lengths->clear();
  std::vector<int64_t> m;
  const auto docs = ids_.document_indices();
  size_t at = 0;
  for (int64_t s = docs[i]; s < docs[i + 1]; ++s) {
    const size_t seq = static_cast<size_t>(s);
    const size_t len = static_cast<size_t>(ids_.sequence_length(seq));
    ids_.read_tokens(seq, 0, len, tokens->data() + at);
    m.resize(len);
    mask_.read_tokens(seq, 0, len, m.data());
    for (size_t t = 0; t < len; ++t) (*mask)[at + t] = m[t] != 0 ? 1 : 0;
    sample_lengths->push_back(static_cast<int64_t>(len));
    at += len;
  }
}

LtorSample SftDataset::get(size_t i) const {
  std::vector<int64_t> text, lengths;
  std::vector<uint8_t> stored;
  read_pack(i, &text, &stored, &lengths);
  const int64_t s = seq_length_;
  LtorSample out;
  out.tokens.assign(text.begin(), text.begin() + s);
  out.labels.assign(static_cast<size_t>(s), pad_id_);
  out.loss_mask.assign(static_cast<size_t>(s), 0.0f);
  out.position_ids.assign(static_cast<size_t>(s), 0);
  out.cu_seqlens = {0};
  int64_t begin = 0;
  for (int64_t len : lengths) {
    const int64_t end = begin + len;  // the sample is [begin, end) of the pack
    for (int64_t j = begin; j < std::min(end, s); ++j) {
      out.position_ids[static_cast<size_t>(j)] = j - begin;
      if (j + 1 < end) {  // the label stays inside the sample
        out.labels[static_cast<size_t>(j)] = text[static_cast<size_t>(j + 1)];
        out.loss_mask[static_cast<size_t>(j)] = stored[static_cast<size_t>(j + 1)] ? 1.0f : 0.0f;
      }
    }
    if (std::min(end, s) > out.cu_seqlens.back()) out.cu_seqlens.push_back(static_cast<int32_t>(std::min(end, s)));
    begin = end;
  }
  for (int64_t j = begin; j < s; ++j) out.position_ids[static_cast<size_t>(j)] = j - begin;  // padding
  if (out.cu_seqlens.back() < s) out.cu_seqlens.push_back(static_cast<int32_t>(s));
  return out;
}

}  // namespace megatron
