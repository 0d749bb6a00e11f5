// Every process group of a job, built once from the parallel flags and passed explicitly
// (no globals). Ranks are laid out in Megatron's order tp-cp-ep-dp-pp: tensor-parallel peers
// are adjacent ranks (one node's fast links), pipeline stages the farthest apart.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "distributed/process_group.h"
#include "distributed/world.h"

namespace megatron::dist {

struct ParallelState {
  int rank = 0;
  int world_size = 1;
  Group world;
  Group tp;              // tensor (and sequence) parallel peers
  Group cp;              // context parallel: each holds 2 of the sequence's 2 x cp chunks
  // --hierarchical-context-parallel-sizes A P (cp = A x P; --cp-comm-type a2a+p2p): the A adjacent
  // CP ranks that trade heads for sequence (all-to-all), and the P ranks, one of each such group at
  // the same place in it, that pass keys and values around a ring. Trivial without.
  Group cp_a2a;
  Group cp_p2p;
  Group dp;              // data-parallel replicas: each reads its own samples
  // Expert parallelism (MoE layers) lays the same ranks out a second time, in Megatron's order
  // etp-ep-edp-pp: `ep` holds the ranks with the other experts (carved out of dp, so its
  // members hold different data), `expert_tp` the ranks splitting each expert (= tp), and
  // `expert_dp` the replicas of this rank's experts, where expert gradients are averaged
  // (= dp without expert parallelism).
  Group ep;
  Group expert_tp;
  Group expert_dp;
  Group pp;              // pipeline stages
  // The replicas of this rank's (dense) parameters, dp x cp: gradients are averaged and the
  // distributed optimizer's state sharded here, as Megatron's data-parallel group "with context
  // parallel". The dp group itself when cp is 1.
  Group dp_cp;
  Group model_parallel;  // tp x pp: one full model; norms and losses are reduced here
  // The first and last pipeline stage (same tp/dp position): tied embedding and output weights
  // have their gradients summed here. Trivial without a pipeline and on the middle stages.
  Group embedding;

  bool is_first_stage() const { return pp.rank() == 0; }
  bool is_last_stage() const { return pp.rank() == pp.size() - 1; }
  // Megatron prints the training log from the last rank (it holds the last stage's loss).
  bool is_last_rank() const { return rank == world_size - 1; }

  // One process: every group trivial.
  static ParallelState single();
  // Creates this rank's groups; every rank of `world` must call it with the same config.
  static ParallelState build(World& world, const ParallelConfig& config);
};

// The rank groups of a layout: dimension sizes in `order` (e.g. {"tp", 2}, {"cp", 1}, ...,
// fastest-varying first); each group holds the ranks that differ only in the dimensions
// `along` names. Sorted; every rank is in exactly one group.
struct LayoutDim {
  std::string name;
  int size;
};
std::vector<std::vector<int>> layout_groups(const std::vector<LayoutDim>& order, const std::vector<std::string>& along);

// Rank `rank`'s group of layout_groups(layout, along), made in `world` (collective over its members).
Group group_holding(World& world, int rank, const std::vector<LayoutDim>& layout, const std::vector<std::string>& along);

// `order` with its "cp" dimension laid out as two, "cp_a2a" (a2a ranks, fastest: adjacent CP
// ranks) then "cp_p2p" (p2p ranks), as --hierarchical-context-parallel-sizes a2a p2p asks.
std::vector<LayoutDim> with_context_levels(const std::vector<LayoutDim>& order, int a2a, int p2p);

}  // namespace megatron::dist
