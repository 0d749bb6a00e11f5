#include "distributed/parallel_state.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

namespace megatron::dist {

std::vector<std::vector<int>> layout_groups(const std::vector<LayoutDim>& order, const std::vector<std::string>& along) {
  int world = 1;
  for (const auto& d : order) world *= d.size;
  // The group key of a rank: its coordinates in the dimensions not in `along`.
  std::map<std::vector<int>, std::vector<int>> by_key;
  for (int r = 0; r < world; ++r) {
    std::vector<int> key;
    int rest = r;
    for (const auto& d : order) {
      const int coordinate = rest % d.size;
      rest /= d.size;
      if (std::find(along.begin(), along.end(), d.name) == along.end()) key.push_back(coordinate);
    }
    by_key[key].push_back(r);
  }
  std::vector<std::vector<int>> groups;
  for (auto& [key, ranks] : by_key) groups.push_back(ranks);
  return groups;
}

std::vector<LayoutDim> with_context_levels(const std::vector<LayoutDim>& order, int a2a, int p2p) {
  std::vector<LayoutDim> levels;
  for (const LayoutDim& d : order) {
    if (d.name != "cp") {
      levels.push_back(d);
      continue;
    }
    TORCH_CHECK(a2a * p2p == d.size, "hierarchical context parallelism: ", a2a, " x ", p2p, " ranks, CP is ", d.size);
    levels.push_back({"cp_a2a", a2a});  // fastest: adjacent CP ranks
    levels.push_back({"cp_p2p", p2p});
  }
  return levels;
}

ParallelState ParallelState::single() { return ParallelState(); }

Group group_holding(World& world, int rank, const std::vector<LayoutDim>& layout, const std::vector<std::string>& along) {
  for (const auto& g : layout_groups(layout, along)) {
    if (std::find(g.begin(), g.end(), rank) != g.end()) return world.group(g);
  }
  TORCH_CHECK(false, "rank ", rank, " is in no group along ", along.front(), "...");
}

ParallelState ParallelState::build(World& world, const ParallelConfig& c) {
  ParallelState ps;
  ps.rank = world.rank();
  ps.world_size = world.size();
  const std::vector<LayoutDim> order = {{"tp", c.tensor_model_parallel_size},
                                        {"cp", c.context_parallel_size},
                                        {"ep", 1},  // the dense decoder's layout; experts get their own with MoE
                                        {"dp", c.data_parallel_size},
                                        {"pp", c.pipeline_model_parallel_size}};
  int product = 1;
  for (const auto& d : order) product *= d.size;
  TORCH_CHECK(product == world.size(), "parallel layout covers ", product, " ranks, the world has ", world.size());
  auto mine = [&](const std::vector<std::string>& along) { return group_holding(world, ps.rank, order, along); };
  // Every rank creates its groups in this same order (group creation is collective).
  ps.world = world.everyone();
  ps.tp = mine({"tp"});
  ps.cp = mine({"cp"});
  if (c.hierarchical_context_parallel_sizes.size() == 2) {
    // The CP dimension laid out as two, the a2a level fastest (Megatron's order: adjacent CP
    // ranks form the first level).
    const int a2a = c.hierarchical_context_parallel_sizes[0], p2p = c.hierarchical_context_parallel_sizes[1];
    const std::vector<LayoutDim> levels = with_context_levels(order, a2a, p2p);
    ps.cp_a2a = group_holding(world, ps.rank, levels, {"cp_a2a"});
    ps.cp_p2p = group_holding(world, ps.rank, levels, {"cp_p2p"});
  }
  ps.dp = mine({"dp"});
  // Without context parallelism the same ranks as dp: no second communicator for them.
  ps.dp_cp = c.context_parallel_size > 1 ? mine({"dp", "cp"}) : ps.dp;
  // The expert layout over the same ranks (MoE): expert TP x EP x expert DP x PP.
  const int etp = c.expert_tensor_parallel_size > 0 ? c.expert_tensor_parallel_size : c.tensor_model_parallel_size;
  const int ep = c.expert_model_parallel_size;
  TORCH_CHECK(world.size() % (etp * ep * c.pipeline_model_parallel_size) == 0, "expert layout: ", etp, " x ", ep, " x ",
              c.pipeline_model_parallel_size, " does not divide the world of ", world.size());
  const std::vector<LayoutDim> experts = {{"tp", etp},
                                          {"cp", 1},
                                          {"ep", ep},
                                          {"dp", world.size() / (etp * ep * c.pipeline_model_parallel_size)},
                                          {"pp", c.pipeline_model_parallel_size}};
  auto mine_in_experts = [&](const std::vector<std::string>& along) { return group_holding(world, ps.rank, experts, along); };
  if (ep == 1 && etp == c.tensor_model_parallel_size) {
    ps.ep = Group();
    ps.expert_tp = ps.tp;
    ps.expert_dp = ps.dp_cp;  // the expert layout's "dp" spans the CP ranks too
  } else {
    ps.ep = mine_in_experts({"ep"});
    ps.expert_tp = etp == c.tensor_model_parallel_size ? ps.tp : mine_in_experts({"tp"});
    ps.expert_dp = mine_in_experts({"dp"});
  }
  ps.pp = mine({"pp"});
  ps.model_parallel = mine({"tp", "pp"});
  // Each pipeline group's first and last rank; every rank creates all of them in the same order.
  for (const auto& stages : layout_groups(order, {"pp"})) {
    if (stages.size() < 2) break;
    const std::vector<int> ends = {stages.front(), stages.back()};
    if (std::find(ends.begin(), ends.end(), ps.rank) != ends.end()) ps.embedding = world.group(ends);
  }
  return ps;
}

}  // namespace megatron::dist
