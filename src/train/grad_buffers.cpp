#include "train/grad_buffers.h"

#include <algorithm>

namespace megatron {

std::vector<ParamAndGradBuffer*> GradBuffers::all() const {
  std::vector<ParamAndGradBuffer*> out;
  if (dense) out.push_back(dense.get());
  if (experts) out.push_back(experts.get());
  return out;
}

GradBuffers make_grad_buffers(const std::vector<GPTModel*>& chunks, const Config& c, const dist::ParallelState& ps,
                              bool on_cuda) {
  const ParallelConfig& p = c.parallel;
  std::vector<NamedTensor> dense, experts;  // kept apart: reduced over different groups
  for (size_t v = 0; v < chunks.size(); ++v) {
    for (const auto& item : chunks[v]->named_parameters()) {
      const tp::ParamInfo& info = chunks[v]->parameter_table().at(item.key());
      if (!info.trainable) continue;  // model state (an expert bias): no gradient, no optimizer
      (info.grad_group == tp::GradGroup::ExpertDataParallel ? experts : dense).push_back({item.key(), item.value(), int(v), info});
    }
  }
  GradBufferOptions options;
  options.bucket_size = p.ddp_bucket_size > 0 ? p.ddp_bucket_size : std::max<int64_t>(40000000, 1000000LL * ps.dp_cp.size());
  options.overlap_grad_reduce = p.overlap_grad_reduce;
  options.distributed_optimizer = p.use_distributed_optimizer;
  options.overlap_param_gather = p.overlap_param_gather && p.use_distributed_optimizer;
  options.gradient_accumulation_fusion = p.gradient_accumulation_fusion;
  options.grad_reduce_in_bf16 = p.grad_reduce_in_bf16;
  options.overlap_optimizer_step = c.train.overlap_optimizer_step && on_cuda;
  // The first and last stage both hold the word embedding: for a tied output layer, or for MTP.
  options.tied_embedding_across_stages = ps.pp.size() > 1 && c.model.output_uses_word_embeddings();
  GradBuffers buffers;
  buffers.dense = std::make_unique<ParamAndGradBuffer>(dense, ps, options);
  if (!experts.empty()) {
    GradBufferOptions expert_options = options;
    expert_options.grad_group = tp::GradGroup::ExpertDataParallel;
    expert_options.tied_embedding_across_stages = false;  // experts are never the tied embedding
    buffers.experts = std::make_unique<ParamAndGradBuffer>(experts, ps, expert_options);
  }
  return buffers;
}

}  // namespace megatron
