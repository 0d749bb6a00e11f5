// Labels, loss mask, position ids and document boundaries of a GPT sample; see ltor_masks.h.
#include "data/ltor_masks.h"

#include <algorithm>

namespace megatron {

LtorSample make_ltor_sample(const int64_t* text, int64_t s, const LtorOptions& o) {
  LtorSample out;
  out.tokens.assign(text, text + s);
  out.labels.assign(text + 1, text + s + 1);
  out.loss_mask.assign(static_cast<size_t>(s), 1.0f);
  out.position_ids.resize(static_cast<size_t>(s));
  out.cu_seqlens.push_back(0);
  int64_t start = 0;  // first position of the current document
  for (int64_t i = 0; i < s; ++i) {
    const size_t u = static_cast<size_t>(i);
    out.position_ids[u] = o.reset_position_ids ? i - start : i;
    // Masks come from the inputs: an EOD input is the step that predicts the next document.
    if (out.tokens[u] == o.eod) {
      if (o.eod_mask_loss) out.loss_mask[u] = 0.0f;
      start = i + 1;
      if (o.reset_attention_mask && i + 1 < s) out.cu_seqlens.push_back(static_cast<int32_t>(i + 1));
    }
  }
  out.cu_seqlens.push_back(static_cast<int32_t>(s));
  // Padding (after the EOD checks, which see the pad id itself, as Megatron's order does).
  for (size_t i = 0; i < static_cast<size_t>(s); ++i) {
    if (out.labels[i] == o.pad) {
      out.loss_mask[i] = 0.0f;
      out.labels[i] = 0;
    }
    if (out.tokens[i] == o.pad) out.tokens[i] = 0;
  }
  return out;
}

bool ltor_attention_masked(const std::vector<int32_t>& cu_seqlens, int64_t q, int64_t k) {
  if (k > q) return true;
  // Same document iff no boundary b with k < b <= q.
  auto it = std::upper_bound(cu_seqlens.begin(), cu_seqlens.end(), static_cast<int32_t>(k));
  return it != cu_seqlens.end() && *it <= q;
}

}  // namespace megatron
