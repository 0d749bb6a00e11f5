// Reader of the packed SFT dataset `megatron preprocess --sft` writes (docs/formats.md): pack i
// as one training sample of seq_length positions in the LtorSample shape the GPT path uses:
//   tokens        the pack's first seq_length tokens, then pad_id
//   labels        the next token *of the same packed sample*; pad_id where there is none (the
//                 last token of every packed sample, and padding)
//   loss_mask     1 where the label is a training target (the stored mask of the label token) and
//                 lies in the same sample; so the last token of each packed sample has loss 0
//   position_ids  restarting at 0 at every packed sample (and at the padding)
//   cu_seqlens    0 = b_0 < ... < b_k = seq_length: packed samples, then the padding as a last
//                 segment if any; attention must stay within a segment (varlen attention /
//                 a block-diagonal causal mask: ltor_attention_masked)
// The two indexed datasets are checked against each other and against seq_length when opened,
// so a mismatch fails at startup with a UserError naming the files, never mid-run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"
#include "data/ltor_masks.h"

namespace megatron {

class SftDataset {
 public:
  // prefix: the --output-prefix given to preprocess --sft (P, not P_input_ids_document).
  // seq_length: training --seq-length; every pack must hold at most seq_length + 1 tokens.
  // pad_id: a valid token id for padding (e.g. the tokenizer's pad or EOS token).
  SftDataset(const std::string& prefix, int64_t seq_length, int64_t pad_id);

  size_t size() const { return ids_.num_documents(); }  // packs
  int64_t seq_length() const { return seq_length_; }

  // Pack i as a training sample (all vectors [seq_length]); std::out_of_range if i >= size().
  LtorSample get(size_t i) const;

  // The raw pack: seq_length + 1 tokens padded with pad_id, the stored mask (0 on padding), and
  // the packed samples' lengths. For tests and tools.
  void read_pack(size_t i, std::vector<int64_t>* tokens, std::vector<uint8_t>* mask,
                 std::vector<int64_t>* sample_lengths) const;

 private:
  IndexedDataset ids_, mask_;
  int64_t seq_length_, pad_id_;
};

}  // namespace megatron
