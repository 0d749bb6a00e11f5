// The checks of context parallelism's flags: what the split of the sequence and the attention
// exchanges need from the model, named by the flags that fix them.
#include <cstdio>
#include <string>
#include <vector>

#include "context_parallel/chunks.h"
#include "core/errors.h"
#include "train/arguments.h"

namespace megatron {

void check_context_parallel(const Config& c) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const int cp = p.context_parallel_size, tp = p.tensor_model_parallel_size;
  if (m.cp_comm_type.size() != 1 && m.cp_comm_type.size() != size_t(m.num_layers)) {
    throw UserError("--cp-comm-type: " + std::to_string(m.cp_comm_type.size()) + " values for " + std::to_string(m.num_layers) +
                    " layers; give one for every layer, or one per layer");
  }
  bool ulysses = false, hierarchical = false;
  for (const std::string& type : m.cp_comm_type) {
    if (type != "p2p" && type != "all_gather" && type != "a2a" && type != "a2a+p2p") {
      throw UserError("--cp-comm-type " + type + ": expected p2p, all_gather, a2a or a2a+p2p");
    }
    ulysses = ulysses || type == "a2a";
    hierarchical = hierarchical || type == "a2a+p2p";
  }
  const std::vector<int>& levels = p.hierarchical_context_parallel_sizes;
  int product = 1;
  for (int size : levels) {
    if (size < 1) throw UserError("--hierarchical-context-parallel-sizes: " + std::to_string(size) + " is not a size (1 or more)");
    product *= size;
  }
  if (!levels.empty() && product != cp) {
    throw UserError("--hierarchical-context-parallel-sizes: the sizes multiply to " + std::to_string(product) +
                    ", not --context-parallel-size " + std::to_string(cp));
  }
  if (hierarchical && levels.size() != 2) {
    throw UserError("--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes A P (two sizes, A x P = --context-parallel-size " +
                    std::to_string(cp) + "): all-to-all among A adjacent CP ranks, the ring among P" +
                    (levels.empty() ? std::string() : "; got " + std::to_string(levels.size()) + " sizes"));
  }
  if (cp == 1) return;
  cp::check_sequence_splits(m.seq_length, cp);
  const int64_t local = m.seq_length / cp;
  if (p.sequence_parallel && local % tp != 0) {
    throw UserError("--seq-length " + std::to_string(m.seq_length) + " / --context-parallel-size " + std::to_string(cp) + " = " +
                    std::to_string(local) + " tokens per rank do not split over --tensor-model-parallel-size " + std::to_string(tp) +
                    ", which --sequence-parallel needs");
  }
  if (hierarchical && (m.num_attention_heads / tp) % levels[0] != 0) {
    throw UserError("--cp-comm-type a2a+p2p trades heads for sequence among the first level's ranks: --num-attention-heads " +
                    std::to_string(m.num_attention_heads) + " / --tensor-model-parallel-size " + std::to_string(tp) + " = " +
                    std::to_string(m.num_attention_heads / tp) + " heads per rank do not divide over --hierarchical-context-parallel-sizes' " +
                    std::to_string(levels[0]) + "; choose a first size that divides them");
  }
  if (ulysses && (m.num_attention_heads / tp) % cp != 0) {
    throw UserError("--cp-comm-type a2a trades heads for sequence: --num-attention-heads " + std::to_string(m.num_attention_heads) +
                    " / --tensor-model-parallel-size " + std::to_string(tp) + " = " + std::to_string(m.num_attention_heads / tp) +
                    " heads per rank do not divide over --context-parallel-size " + std::to_string(cp) +
                    "; use --cp-comm-type p2p or all_gather, or another CP size");
  }
  if (m.attention_dropout > 0) {
    char dropout[32];
    std::snprintf(dropout, sizeof(dropout), "%g", m.attention_dropout);
    throw UserError(std::string("--attention-dropout ") + dropout +
                    ": context-parallel attention has no dropout; give --attention-dropout 0 with --context-parallel-size " +
                    std::to_string(cp));
  }
}

}  // namespace megatron
