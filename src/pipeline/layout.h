// Which decoder layers each pipeline stage (and each of its model chunks, with interleaving)
// owns. Stages own contiguous layer ranges; the first chunk of the first stage also owns the
// embedding (pre-process), the last chunk of the last stage the final norm, output layer and
// loss (post-process). Layer numbers are global, so parameter names are the same under every
// layout (`decoder.layers.7...` on whichever stage holds layer 7).
#pragma once

#include <string>

#include "core/config.h"

namespace megatron::pipeline {

struct ChunkLayers {
  int first_layer = 0;  // global index of the chunk's first decoder layer
  int num_layers = 0;
  bool pre_process = true;   // holds the embedding
  bool post_process = true;  // holds the final norm, output layer and loss
};

// Validates the pipeline flags against the model and resolves
// --num-layers-per-virtual-pipeline-stage into num_virtual_stages_per_pipeline_rank.
// Throws UserError naming the flag.
void check_pipeline_layout(ParallelConfig& p, int num_layers);

// The layers of model chunk `chunk` (0 .. virtual stages - 1) on pipeline rank `pp_rank`.
// Interleaved: chunk v of rank r is virtual stage v * pp + r, holding 1 / chunks of its stage's
// layers (L / pp, or the uneven first / last stage's count).
ChunkLayers chunk_layers(const ParallelConfig& p, int num_layers, int pp_rank, int chunk);

// Whether pipeline rank `pp_rank` holds the parameter `name` (a global Megatron-Core name).
// The last stage holds a copy of the embedding when it is tied to the output layer.
bool stage_holds(const std::string& name, const ParallelConfig& p, const ModelConfig& m, int pp_rank);

}  // namespace megatron::pipeline
