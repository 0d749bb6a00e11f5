// Inputs, labels and masks of one left-to-right (GPT) sample, as Megatron-Core's GPTDataset
// __getitem__ and _get_ltor_masks_and_position_ids make them, in plain vectors:
//   tokens = text[:-1], labels = text[1:];
//   --eod-mask-loss: loss 0 where the *input* token is EOD (the prediction across a document
//     boundary), not where the label is;
//   --reset-position-ids: positions restart at 0 after every EOD input token;
//   --reset-attention-mask: tokens after an EOD cannot attend to tokens up to it; expressed here as
//     document boundaries (cumulative lengths, the form variable-length attention kernels take).
// Tokens equal to the pad id (Megatron's -1 unless the tokenizer has one) lose their loss and are
// replaced by 0, as Megatron does for padded samples.
#pragma once

#include <cstdint>
#include <vector>

namespace megatron {

struct LtorOptions {
  int64_t eod = 0;
  int64_t pad = -1;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
};

struct LtorSample {
  std::vector<int64_t> tokens;        // [s]
  std::vector<int64_t> labels;        // [s]
  std::vector<float> loss_mask;       // [s] 1 or 0
  std::vector<int64_t> position_ids;  // [s]
  // Document boundaries within the sample: 0 = b_0 < b_1 < ... < b_k = s; query q may attend to key
  // k <= q only within the same [b_j, b_j+1). Just {0, s} without --reset-attention-mask.
  std::vector<int32_t> cu_seqlens;
};

// `text` holds s + 1 token ids (what SampleSource::sample writes).
LtorSample make_ltor_sample(const int64_t* text, int64_t seq_length, const LtorOptions& options);

// Whether query position q may not attend to key position k (Megatron's boolean mask: true =
// masked), from cu_seqlens; for tests and dense-mask attention.
bool ltor_attention_masked(const std::vector<int32_t>& cu_seqlens, int64_t q, int64_t k);

}  // namespace megatron
