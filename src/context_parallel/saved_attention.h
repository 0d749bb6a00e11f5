// What the backward of a blockwise attention needs from its forward (ring_attention and
// blockwise_attention save and read it alike): q, k, v, the merged output and log-sum-exp, the
// mask or the blocks' document pieces if there are any, and the softmax scale.
#pragma once

#include <torch/csrc/autograd/custom_function.h>

#include <memory>
#include <vector>

#include "context_parallel/document_blocks.h"

namespace megatron::cp {

// Every block's document pieces, in block order (ctx->saved_data holds IValues only).
struct DocumentPiecesCapsule : torch::CustomClassHolder {
  explicit DocumentPiecesCapsule(std::shared_ptr<const std::vector<BlockDocuments>> p) : pieces(std::move(p)) {}
  std::shared_ptr<const std::vector<BlockDocuments>> pieces;
};

struct SavedAttention {
  at::Tensor q, k, v, out, lse, mask;
  double scale = 1.0;
  std::shared_ptr<const std::vector<BlockDocuments>> pieces;  // null without packed documents

  void save(torch::autograd::AutogradContext* ctx) const {
    ctx->save_for_backward({q, k, v, out, lse});
    if (mask.defined()) ctx->saved_data["mask"] = mask;
    ctx->saved_data["scale"] = scale;
    if (pieces) ctx->saved_data["pieces"] = at::IValue::make_capsule(c10::make_intrusive<DocumentPiecesCapsule>(pieces));
  }
  static SavedAttention load(torch::autograd::AutogradContext* ctx) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    SavedAttention s{saved[0], saved[1], saved[2], saved[3], saved[4], at::Tensor(), ctx->saved_data["scale"].toDouble(), nullptr};
    if (ctx->saved_data.count("mask")) s.mask = ctx->saved_data["mask"].toTensor();
    if (ctx->saved_data.count("pieces")) {
      s.pieces = c10::static_intrusive_pointer_cast<DocumentPiecesCapsule>(ctx->saved_data["pieces"].toCapsule())->pieces;
    }
    return s;
  }
};

}  // namespace megatron::cp
