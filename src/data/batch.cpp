#include "data/batch.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "core/errors.h"

namespace megatron {

LtorOptions ltor_options(const Config& c) {
  LtorOptions o;
  o.eod = c.data.eod_id;
  o.reset_position_ids = c.data.reset_position_ids;
  o.reset_attention_mask = c.data.reset_attention_mask;
  o.eod_mask_loss = c.data.eod_mask_loss;
  return o;
}

Batch make_batch(const SampleSource& source, int64_t first, int64_t micro_batch, int64_t seq_length,
                 int64_t vocab_size, const LtorOptions& options) {
  const int64_t s = seq_length;
  at::Tensor tokens = at::empty({micro_batch, s}, at::kLong);      // [b, s]
  at::Tensor labels = at::empty({micro_batch, s}, at::kLong);      // [b, s]
  at::Tensor loss_mask = at::empty({micro_batch, s}, at::kFloat);  // [b, s]
  at::Tensor positions = at::empty({micro_batch, s}, at::kLong);   // [b, s]
  // Packed documents: each token's document ([b, s] int32, the attention mask's compact form;
  // model/document_attention.h), not the dense [b, 1, s, s] mask (S² bytes a sample).
  const bool packed = source.packed();
  at::Tensor documents;
  if (options.reset_attention_mask || packed) documents = at::empty({micro_batch, s}, at::kInt);
  for (int64_t i = 0; i < micro_batch; ++i) {
    LtorSample sample = source.ltor_sample(first + i, s, options);
    for (int64_t k = 0; k < s; ++k) {
      for (int64_t id : {sample.tokens[k], sample.labels[k]}) {
        if (id < 0 || id >= vocab_size) {
          throw UserError(source.describe() + ": sample " + std::to_string(first + i) + " holds token id " +
                          std::to_string(id) + ", outside the model's vocabulary of " + std::to_string(vocab_size) +
                          ": use the tokenizer the data was made with");
        }
      }
    }
    std::copy(sample.tokens.begin(), sample.tokens.end(), tokens[i].data_ptr<int64_t>());
    std::copy(sample.labels.begin(), sample.labels.end(), labels[i].data_ptr<int64_t>());
    std::copy(sample.loss_mask.begin(), sample.loss_mask.end(), loss_mask[i].data_ptr<float>());
    std::copy(sample.position_ids.begin(), sample.position_ids.end(), positions[i].data_ptr<int64_t>());
    if (documents.defined()) {
      int32_t* id = documents[i].data_ptr<int32_t>();
      for (size_t d = 0; d + 1 < sample.cu_seqlens.size(); ++d) {
        std::fill(id + sample.cu_seqlens[d], id + sample.cu_seqlens[d + 1], int32_t(d));
      }
    }
  }
  Batch batch{tokens, labels, loss_mask, {}, documents};
  if (options.reset_position_ids || packed) batch.position_ids = positions;
  return batch;
}

}  // namespace megatron
