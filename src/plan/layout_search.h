// `megatron plan`: every parallel layout of a model on a cluster that `megatron train` would
// accept, each with its memory and step-time estimates, best first.
//
// A layout is TP x CP x DP x PP (x EP over the data-parallel ranks for MoE), with interleaving;
// each is judged by finalize_config itself, so the planner never proposes what train refuses
// (and counts, by reason, what it refused). The layout flags the command line or recipe sets are
// kept; the others are searched. SP and the distributed optimizer are always on (Megatron's
// advice at scale); full recomputation is tried for layouts that do not fit without it, unless
// the flags choose a recomputation.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "plan/memory_estimate.h"
#include "plan/step_estimate.h"

namespace megatron::plan {

struct Candidate {
  Config config;  // finalized for the cluster's world size
  MemoryEstimate memory;
  StepEstimate step;
  bool fits = false;  // memory.total() within the GPU's memory
  // The flags that choose this layout (parallel sizes, SP, distributed optimizer, overlaps, recompute).
  std::string flags() const;
};

struct Plan {
  std::vector<Candidate> candidates;          // fitting first, then by tokens/s per GPU
  std::map<std::string, int64_t> rejections;  // finalize_config's reason -> layouts it refused
  std::vector<std::string> kept_flags;        // layout flags taken as given
  int64_t parameters = 0, active_parameters = 0;
  double flops_per_token = 0;
};

// `parsed`: the model as model_for_plan read it (plan/model_for_plan.h); `cluster.num_gpus` the
// world size.
Plan search_layouts(const Config& parsed, const Cluster& cluster);

}  // namespace megatron::plan
