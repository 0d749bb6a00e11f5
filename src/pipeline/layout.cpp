#include "pipeline/layout.h"

#include <string>

#include "core/errors.h"
#include "model/parameter_names.h"

namespace megatron::pipeline {
namespace {

std::string str(int v) { return std::to_string(v); }

}  // namespace

void check_pipeline_layout(ParallelConfig& p, int num_layers) {
  const int pp = p.pipeline_model_parallel_size;
  const int first = p.decoder_first_pipeline_num_layers, last = p.decoder_last_pipeline_num_layers;
  if (first < 0 || last < 0) throw UserError("--decoder-first/last-pipeline-num-layers must be >= 0");
  if (p.num_virtual_stages_per_pipeline_rank < 1) throw UserError("--num-virtual-stages-per-pipeline-rank must be at least 1");
  if (p.num_layers_per_virtual_pipeline_stage < 0) throw UserError("--num-layers-per-virtual-pipeline-stage must be positive");
  if (pp == 1) {
    if (first > 0 || last > 0 || p.num_layers_per_virtual_pipeline_stage > 0 || p.num_virtual_stages_per_pipeline_rank > 1) {
      throw UserError("--decoder-first/last-pipeline-num-layers and virtual pipeline stages need --pipeline-model-parallel-size > 1");
    }
    return;
  }
  if (p.num_layers_per_virtual_pipeline_stage > 0 && p.num_virtual_stages_per_pipeline_rank > 1) {
    throw UserError("pass one of --num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank, not both");
  }
  const bool uneven = first > 0 || last > 0;
  if (uneven) {
    if (p.num_layers_per_virtual_pipeline_stage > 0) {
      throw UserError("with --decoder-first/last-pipeline-num-layers stages differ in size: give the virtual stages as "
                      "--num-virtual-stages-per-pipeline-rank instead of --num-layers-per-virtual-pipeline-stage");
    }
    const int middle_stages = pp - (first > 0) - (last > 0);
    const int rest = num_layers - first - last;
    if (rest < 0 || (middle_stages == 0 && rest != 0) || (middle_stages > 0 && (rest <= 0 || rest % middle_stages != 0))) {
      throw UserError("--num-layers " + str(num_layers) + " minus --decoder-first-pipeline-num-layers " + str(first) +
                      " and --decoder-last-pipeline-num-layers " + str(last) + " leaves " + str(rest) +
                      " layers, which do not split evenly (at least one each) over the other " + str(middle_stages) + " stage(s)");
    }
    // Interleaved: every stage splits its own layers evenly over its chunks (Megatron-Core's rule).
    const int chunks = p.num_virtual_stages_per_pipeline_rank;
    for (auto [flag, layers] : {std::pair<const char*, int>{"--decoder-first-pipeline-num-layers", first},
                                {"--decoder-last-pipeline-num-layers", last},
                                {"the middle stages' share", middle_stages > 0 ? rest / middle_stages : 0}}) {
      if (layers % chunks != 0) {
        throw UserError(std::string(flag) + " (" + str(layers) + " layers) is not divisible by "
                        "--num-virtual-stages-per-pipeline-rank " + str(chunks));
      }
    }
    return;
  }
  if (num_layers % pp != 0) {
    throw UserError("--num-layers " + str(num_layers) + " is not divisible by --pipeline-model-parallel-size " + str(pp) +
                    ": use --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers for an uneven split");
  }
  const int per_stage = num_layers / pp;
  if (p.num_layers_per_virtual_pipeline_stage > 0) {
    if (per_stage % p.num_layers_per_virtual_pipeline_stage != 0) {
      throw UserError("--num-layers-per-virtual-pipeline-stage " + str(p.num_layers_per_virtual_pipeline_stage) +
                      " does not divide the " + str(per_stage) + " layers of each pipeline stage");
    }
    p.num_virtual_stages_per_pipeline_rank = per_stage / p.num_layers_per_virtual_pipeline_stage;
  } else if (per_stage % p.num_virtual_stages_per_pipeline_rank != 0) {
    throw UserError("--num-virtual-stages-per-pipeline-rank " + str(p.num_virtual_stages_per_pipeline_rank) +
                    " does not divide the " + str(per_stage) + " layers of each pipeline stage");
  }
}

ChunkLayers chunk_layers(const ParallelConfig& p, int num_layers, int pp_rank, int chunk) {
  const int pp = p.pipeline_model_parallel_size;
  const int chunks = p.num_virtual_stages_per_pipeline_rank;
  ChunkLayers c;
  c.pre_process = pp_rank == 0 && chunk == 0;
  c.post_process = pp_rank == pp - 1 && chunk == chunks - 1;
  // Layers of each stage: L / pp, or the first / last stage's own count and the rest split evenly.
  const int first = p.decoder_first_pipeline_num_layers, last = p.decoder_last_pipeline_num_layers;
  const int middle_stages = pp - (first > 0) - (last > 0);
  const int middle = middle_stages > 0 ? (num_layers - first - last) / middle_stages : 0;
  auto stage_size = [&](int r) { return r == 0 && first > 0 ? first : r == pp - 1 && last > 0 ? last : middle; };
  // Chunk v of rank r is virtual stage v * pp + r, holding stage_size(r) / chunks layers; the
  // virtual stages hold consecutive layers in that order.
  for (int v = 0; v <= chunk; ++v) {
    for (int r = 0; r < pp && (v < chunk || r < pp_rank); ++r) c.first_layer += stage_size(r) / chunks;
  }
  c.num_layers = stage_size(pp_rank) / chunks;
  return c;
}

bool stage_holds(const std::string& name, const ParallelConfig& p, const ModelConfig& m, int pp_rank) {
  const int pp = p.pipeline_model_parallel_size;
  const std::string layers = "decoder.layers.";
  if (name.rfind(layers, 0) == 0) {
    const int layer = std::stoi(name.substr(layers.size()));
    for (int chunk = 0; chunk < p.num_virtual_stages_per_pipeline_rank; ++chunk) {
      const ChunkLayers c = chunk_layers(p, m.num_layers, pp_rank, chunk);
      if (layer >= c.first_layer && layer < c.first_layer + c.num_layers) return true;
    }
    return false;
  }
  // The last stage holds a copy for a tied output layer, or for multi-token prediction.
  if (name == kWordEmbeddings) return pp_rank == 0 || (pp_rank == pp - 1 && m.output_uses_word_embeddings());
  if (name.rfind("embedding.", 0) == 0) return pp_rank == 0;
  return pp_rank == pp - 1;  // final norm, output layer, multi-token prediction
}

}  // namespace megatron::pipeline
