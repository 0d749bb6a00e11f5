// The mixture-of-experts flags read together: which layers are MoE (--moe-layer-freq in either
// of Megatron's forms) and the combinations Megatron accepts, each error naming its flag.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"

namespace megatron::moe {

// --moe-layer-freq as one 0/1 entry per layer: "N" makes layers 0, N, 2N, ... MoE layers;
// a Python list expression of 0/1 ("[1,0,1,1]", "([0]*1+[1]*47)": products and sums of lists)
// gives them one by one and must cover `num_layers` layers. UserError naming the flag otherwise.
std::vector<int> parse_moe_layer_freq(const std::string& value, int num_layers);

// Checks the MoE flags against each other and the parallel layout and fills the derived fields
// (moe_layers, moe_ffn_hidden_size, expert_tensor_parallel_size). A dense model (no
// --num-experts) must not set expert parallelism.
void finalize_moe_config(ModelConfig& model, ParallelConfig& parallel, int world_size);

// What on one process an MoE layer's routed path reads back to the host (which a captured CUDA
// graph cannot replay), running in bf16 or not: "" where nothing does (the token counts on the
// device, the grouped GEMM taking them there, shapes fixed dropless or padded to capacity), else
// why, with the flag that changes it. Training's --cuda-graph-impl and generation's decode graphs
// both ask.
std::string route_reads_host(const ModelConfig& model, bool bf16);

// The start-up lines describing the MoE layers ("> mixture of experts: ..."), "" for a dense model.
std::string describe_moe(const ModelConfig& model);

}  // namespace megatron::moe
