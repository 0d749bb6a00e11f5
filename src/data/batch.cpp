#include "data/batch.h"

#include <ATen/ATen.h>

#include "core/errors.h"

namespace megatron {

Batch make_batch(const SampleSource& source, int64_t first, int64_t micro_batch, int64_t seq_length,
                 int64_t vocab_size) {
  at::Tensor text = at::empty({micro_batch, seq_length + 1}, at::kLong);  // [b, s + 1]
  for (int64_t i = 0; i < micro_batch; ++i) {
    int64_t* row = text[i].data_ptr<int64_t>();
    source.sample(first + i, row);
    for (int64_t k = 0; k <= seq_length; ++k) {
      if (row[k] < 0 || row[k] >= vocab_size) {
        throw UserError(source.describe() + ": sample " + std::to_string(first + i) + " holds token id " +
                        std::to_string(row[k]) + ", outside the model's vocabulary of " + std::to_string(vocab_size) +
                        ": set --vocab-size to the tokenizer's vocabulary");
      }
    }
  }
  Batch batch;
  batch.tokens = text.narrow(1, 0, seq_length).contiguous();   // [b, s]
  batch.labels = text.narrow(1, 1, seq_length).contiguous();   // [b, s]
  batch.loss_mask = at::ones({micro_batch, seq_length}, at::kFloat);
  return batch;
}

}  // namespace megatron
