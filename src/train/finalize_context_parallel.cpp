// The checks of context parallelism's flags: what the split of the sequence and the attention
// exchanges need from the model, named by the flags that fix them.
#include <cstdio>
#include <string>

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
  bool ulysses = false;
  for (const std::string& type : m.cp_comm_type) {
    if (type == "a2a+p2p") {
      throw UserError("--cp-comm-type a2a+p2p (hierarchical context parallelism) is not implemented; use p2p, all_gather or a2a");
    }
    if (type != "p2p" && type != "all_gather" && type != "a2a") {
      throw UserError("--cp-comm-type " + type + ": expected p2p, all_gather or a2a");
    }
    ulysses = ulysses || type == "a2a";
  }
  if (cp == 1) return;
  cp::check_sequence_splits(m.seq_length, cp);
  const int64_t local = m.seq_length / cp;
  if (p.sequence_parallel && local % tp != 0) {
    throw UserError("--seq-length " + std::to_string(m.seq_length) + " / --context-parallel-size " + std::to_string(cp) + " = " +
                    std::to_string(local) + " tokens per rank do not split over --tensor-model-parallel-size " + std::to_string(tp) +
                    ", which --sequence-parallel needs");
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
