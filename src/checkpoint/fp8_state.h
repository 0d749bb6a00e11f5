// The FP8 delayed recipe's state in checkpoints (Transformer Engine keeps it in each layer's
// `_extra_state`): per FP8 linear layer its amax history [L, 3] and scales [3] (input, weight,
// output gradient), under the layer's module name (`decoder.layers.3.mlp.linear_fc1.fp8_amax_history`,
// `....fp8_scale`). After the step's all-reduce the state is the same on every TP and DP rank, so
// the first of them writes its pipeline stage's into fp8_ppPPP.safetensors; a load reads every
// stage's file and takes its layers by name, so any layout resumes any other.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/safetensors.h"

namespace megatron {

class GPTModel;

// This rank's layers' state (CPU copies); empty without the delayed recipe or before the first step.
std::vector<SafetensorsEntry> fp8_state_tensors(const std::vector<GPTModel*>& chunks);
// The file name of pipeline stage `pp_rank`'s state.
std::string fp8_state_file(int pp_rank);
// Sets the layers' state from the fp8_pp*.safetensors files of iteration directory `dir`;
// returns how many FP8 layers found none (they start afresh: empty history, scale 1), which
// `report` prints as a note.
int load_fp8_state(const std::string& dir, const std::vector<GPTModel*>& chunks, bool report);

}  // namespace megatron
