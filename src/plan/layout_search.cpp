#include "plan/layout_search.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "core/errors.h"
#include "model/family.h"
#include "train/arguments.h"

namespace megatron::plan {
namespace {

// The flags that choose a layout; those the command line or recipe gives are kept.
const char* const kLayoutFlags[] = {"tensor-model-parallel-size", "pipeline-model-parallel-size", "context-parallel-size",
                                    "expert-model-parallel-size", "expert-tensor-parallel-size",
                                    "num-layers-per-virtual-pipeline-stage", "num-virtual-stages-per-pipeline-rank",
                                    "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers"};

// Whether the command line or recipe gave `flag`.
bool given_flag(const Config& parsed, const char* flag) { return parsed.explicit_flags.count(flag) > 0; }

std::vector<int> divisors_up_to(int64_t n, int64_t limit) {
  std::vector<int> out;
  for (int64_t d = 1; d <= std::min(n, limit); ++d) {
    if (n % d == 0) out.push_back(int(d));
  }
  return out;
}

std::vector<int> powers_of_two_up_to(int64_t limit) {
  std::vector<int> out;
  for (int64_t v = 1; v <= limit; v *= 2) out.push_back(int(v));
  return out;
}

// finalize_config's message with its numbers taken out, so that the layouts it refuses for one
// reason count together ("--num-query-groups 8 is not divisible by ... 16" and "... 32").
std::string reason_of(const std::string& message) {
  std::string out;
  for (size_t i = 0; i < message.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(message[i]))) {
      if (out.empty() || out.back() != 'N') out += 'N';
      while (i + 1 < message.size() && (std::isdigit(static_cast<unsigned char>(message[i + 1])) || message[i + 1] == '.')) ++i;
    } else {
      out += message[i];
    }
  }
  return out;
}

// One layout to judge: the parallel sizes, and the pipeline's shape (chunks 0: as the flags give).
struct LayoutChoice {
  int tp = 1, pp = 1, cp = 1, ep = 1, etp = 1, chunks = 1;
  int first_layers = 0, last_layers = 0;  // an uneven pipeline's first and last stages (0: even)
};

// Every combination of sizes whose product divides the GPUs; the flags given fix theirs.
std::vector<LayoutChoice> layout_choices(const Config& parsed, const Cluster& cluster) {
  const int world = cluster.num_gpus;
  const ParallelConfig& given = parsed.parallel;
  const ModelConfig& m = parsed.model;
  auto kept = [&](const char* flag) { return given_flag(parsed, flag); };
  auto or_given = [&](const char* flag, int value, std::vector<int> searched) { return kept(flag) ? std::vector<int>{value} : searched; };
  const std::vector<int> tps = or_given("tensor-model-parallel-size", given.tensor_model_parallel_size,
                                        divisors_up_to(std::min(world, cluster.gpus_per_node), cluster.gpus_per_node));
  // Stage counts that divide the layers, and powers of two that do not (first and last stages
  // then take fewer: they also hold the embedding and the output layer).
  std::vector<int> stage_counts = divisors_up_to(m.num_layers, world);
  for (int pp : powers_of_two_up_to(std::min<int64_t>(world, m.num_layers / 2))) {
    if (m.num_layers % pp != 0) stage_counts.push_back(pp);
  }
  const std::vector<int> pps = or_given("pipeline-model-parallel-size", given.pipeline_model_parallel_size, stage_counts);
  const bool uneven_kept = kept("decoder-first-pipeline-num-layers") || kept("decoder-last-pipeline-num-layers");
  const bool virtual_kept = kept("num-layers-per-virtual-pipeline-stage") || kept("num-virtual-stages-per-pipeline-rank");
  const std::vector<int> cps = or_given("context-parallel-size", given.context_parallel_size, powers_of_two_up_to(world));
  const std::vector<int> eps = m.num_experts > 0 ? or_given("expert-model-parallel-size", given.expert_model_parallel_size,
                                                            divisors_up_to(m.num_experts, world))
                                                 : std::vector<int>{1};
  std::vector<LayoutChoice> out;
  for (int tp : tps) {
    for (int pp : pps) {
      for (int cp : cps) {
        if (world % (int64_t(tp) * pp * cp) != 0) continue;
        LayoutChoice l;
        l.tp = tp, l.pp = pp, l.cp = cp;
        // An uneven split: the middle stages ceil(L / PP) layers, the first and last the rest.
        if (pp > 1 && m.num_layers % pp != 0 && !uneven_kept) {
          const int middle = (m.num_layers + pp - 1) / pp, rest = m.num_layers - middle * (pp - 2);
          l.first_layers = rest / 2;
          l.last_layers = rest - l.first_layers;
          if (l.first_layers < 1) continue;
        }
        // Interleaving: as many model chunks a stage as divide its layers, up to 8.
        std::vector<int> chunk_counts = {virtual_kept ? 0 : 1};
        if (!virtual_kept && pp > 1 && m.num_layers % pp == 0) {
          for (int v : divisors_up_to(m.num_layers / pp, 8)) {
            if (v > 1) chunk_counts.push_back(v);
          }
        }
        // Experts split over TP as the dense layers (ETP = TP), or whole on each rank (ETP = 1).
        std::vector<int> etps = {tp};
        if (kept("expert-tensor-parallel-size")) {
          etps = {given.expert_tensor_parallel_size};
        } else if (m.num_experts > 0 && tp > 1) {
          etps.push_back(1);
        }
        for (int chunks : chunk_counts) {
          for (int ep : eps) {
            for (int etp : etps) {
              l.chunks = chunks, l.ep = ep, l.etp = etp;
              out.push_back(l);
            }
          }
        }
      }
    }
  }
  return out;
}

// `parsed` with `l`'s layout, sequence parallelism and the distributed optimizer (overlapped).
Config with_layout(const Config& parsed, const LayoutChoice& l) {
  Config c = parsed;
  ParallelConfig& p = c.parallel;
  p.tensor_model_parallel_size = l.tp;
  p.pipeline_model_parallel_size = l.pp;
  p.context_parallel_size = l.cp;
  p.expert_model_parallel_size = l.ep;
  p.expert_tensor_parallel_size = c.model.num_experts > 0 ? l.etp : 0;
  if (l.first_layers > 0) {
    p.decoder_first_pipeline_num_layers = l.first_layers;
    p.decoder_last_pipeline_num_layers = l.last_layers;
  }
  if (l.chunks > 0) {
    p.num_virtual_stages_per_pipeline_rank = l.chunks;
    p.num_layers_per_virtual_pipeline_stage = 0;
  }
  p.sequence_parallel = l.tp > 1;
  p.use_distributed_optimizer = true;
  p.overlap_grad_reduce = true;
  p.overlap_param_gather = true;
  return c;
}

void judge(Candidate& c, const ParameterCensus& census, const Cluster& cluster, double flops_per_token) {
  c.memory = estimate_memory(census, c.config);
  c.step = estimate_step(c.config, cluster, flops_per_token, c.memory.parameters);
  c.fits = c.memory.total() <= cluster.gpu.memory_gib * kGiB;
}

}  // namespace

std::string Candidate::flags() const {
  const ParallelConfig& p = config.parallel;
  const ModelConfig& m = config.model;
  std::ostringstream out;
  out << "--tensor-model-parallel-size " << p.tensor_model_parallel_size;
  if (p.sequence_parallel) out << " --sequence-parallel";
  out << " --pipeline-model-parallel-size " << p.pipeline_model_parallel_size;
  if (p.decoder_first_pipeline_num_layers > 0) out << " --decoder-first-pipeline-num-layers " << p.decoder_first_pipeline_num_layers;
  if (p.decoder_last_pipeline_num_layers > 0) out << " --decoder-last-pipeline-num-layers " << p.decoder_last_pipeline_num_layers;
  if (p.num_virtual_stages_per_pipeline_rank > 1) out << " --num-virtual-stages-per-pipeline-rank " << p.num_virtual_stages_per_pipeline_rank;
  if (p.context_parallel_size > 1) out << " --context-parallel-size " << p.context_parallel_size << " --cp-comm-type " << m.cp_comm_type_of(0);
  if (m.num_experts > 0) {
    out << " --expert-model-parallel-size " << p.expert_model_parallel_size;
    if (p.expert_tensor_parallel_size != p.tensor_model_parallel_size) out << " --expert-tensor-parallel-size " << p.expert_tensor_parallel_size;
  }
  if (p.use_distributed_optimizer) out << " --use-distributed-optimizer";
  if (p.overlap_grad_reduce) out << " --overlap-grad-reduce";
  if (p.overlap_param_gather) out << " --overlap-param-gather";
  if (m.recompute_granularity == "full") {
    out << " --recompute-granularity full --recompute-method " << m.recompute_method << " --recompute-num-layers " << m.recompute_num_layers;
  }
  return out.str();
}

Plan search_layouts(const Config& parsed, const Cluster& cluster) {
  const int world = cluster.num_gpus;
  if (world < 1) throw UserError("--num-gpus must be at least 1 (got " + std::to_string(world) + ")");
  Plan plan;
  auto kept = [&](const char* flag) { return given_flag(parsed, flag); };
  for (const char* flag : kLayoutFlags) {
    if (kept(flag)) plan.kept_flags.push_back(flag);
  }

  // The model once, on one rank, for its parameters and FLOPs.
  Config single = parsed;
  single.parallel = ParallelConfig();
  single.parallel.distributed_backend = parsed.parallel.distributed_backend;
  finalize_config(single, 1);
  const ParameterCensus census(single.model);
  plan.parameters = census.total();
  plan.active_parameters = census.active_per_token(single.model);
  plan.flops_per_token = family_of(single.model).flops_per_token(single.model, census.total());

  for (const LayoutChoice& choice : layout_choices(parsed, cluster)) {
    Candidate c;
    c.config = with_layout(parsed, choice);
    const Config before_finalize = c.config;
    try {
      finalize_config(c.config, world);
    } catch (const UserError& e) {
      ++plan.rejections[reason_of(e.what())];
      continue;
    }
    judge(c, census, cluster, plan.flops_per_token);
    if (!c.fits && parsed.model.recompute_granularity.empty()) {
      // Whole layers recomputed, one at a time: the least memory recomputation gives.
      Candidate r;
      r.config = before_finalize;
      r.config.model.recompute_granularity = "full";
      r.config.model.recompute_method = "uniform";
      r.config.model.recompute_num_layers = 1;
      try {
        finalize_config(r.config, world);
        judge(r, census, cluster, plan.flops_per_token);
        if (r.fits) c = std::move(r);
      } catch (const UserError&) {
        // Recomputation this configuration refuses (train would too): the layout stays as it was.
      }
    }
    plan.candidates.push_back(std::move(c));
  }
  std::stable_sort(plan.candidates.begin(), plan.candidates.end(), [](const Candidate& a, const Candidate& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.fits) return a.step.tokens_per_second_per_gpu > b.step.tokens_per_second_per_gpu;
    return a.memory.total() < b.memory.total();
  });
  return plan;
}

}  // namespace megatron::plan
