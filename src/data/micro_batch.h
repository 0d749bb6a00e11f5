// One micro-batch, batch-first as the data loader yields it: the fixed fields every language
// model reads, and named extra fields for what a new model or loss needs (images, per-token
// advantages, reference log-probs, ...). The trainer moves, pins and copies every field the same
// way, so a new field needs no edit in the loop.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace megatron {

struct Batch {
  at::Tensor tokens;          // [b, s] int64
  at::Tensor labels;          // [b, s] int64
  at::Tensor loss_mask;       // [b, s] float
  at::Tensor position_ids;    // [b, s] int64; undefined: 0..s-1 for every sample
  at::Tensor attention_mask;  // [b, s] int32 document ids (packed documents, causal within each; model/document_attention.h)
                              // or [b, 1, s, s] bool, true = may attend; undefined: plain causal
  std::map<std::string, at::Tensor> extra;  // [b, ...] each, by name

  // f(name, tensor) for every field, defined or not: the fixed ones first, then `extra` by name.
  template <typename F>
  void for_each(F&& f) {
    f("tokens", tokens);
    f("labels", labels);
    f("loss mask", loss_mask);
    f("position ids", position_ids);
    f("attention mask", attention_mask);
    for (auto& [name, t] : extra) f(name, t);
  }
  template <typename F>
  void for_each(F&& f) const {
    const_cast<Batch*>(this)->for_each([&](const std::string& name, const at::Tensor& t) { f(name, t); });
  }
  // The field named as for_each names it; an unknown name is an extra field (created undefined).
  at::Tensor& field(const std::string& name) {
    if (name == "tokens") return tokens;
    if (name == "labels") return labels;
    if (name == "loss mask") return loss_mask;
    if (name == "position ids") return position_ids;
    if (name == "attention mask") return attention_mask;
    return extra[name];
  }
};

}  // namespace megatron
