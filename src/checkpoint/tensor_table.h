// The per-tensor table of a checkpoint's state.json: for every model tensor its global shape,
// dtype and the slice each file holds (TP rank of how many, along which dim, gated halves), and
// for every optimizer tensor the flat range of the TP shard each file holds. Every rank
// describes the files it writes; rank 0 merges the descriptions.
//
//   "tensors": {"decoder.layers.0.mlp.linear_fc1.weight": {"shape": [256, 64], "dtype": "F32",
//       "split_dim": 0, "gated": true, "tp_size": 2,
//       "files": [{"file": "model_tp00_pp000.safetensors", "tp_rank": 0}, ...]}, ...},
// (an expert's "tp_size" and "tp_rank" count expert-TP ranks: --expert-tensor-parallel-size)
//   "optimizer_tensors": {"decoder.layers.0.mlp.linear_fc1.weight.exp_avg": {"tp_size": 2,
//       "files": [{"file": "optimizer_tp00_pp000_dp001.safetensors", "tp_rank": 0,
//                  "offset": 4096, "numel": 4096}, ...]}, ...}
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "tensor_parallel/parameters.h"

namespace megatron {

// This rank's files described (model and optimizer files; generator states are left out).
// `params` says how each model tensor splits (the model's parameter table): dense tensors over
// the tp_size TP ranks, experts over the expert-TP ranks (the same as TP where not given).
nlohmann::json describe_files(const std::vector<CheckpointSnapshot::File>& files, const tp::ParamTable& params, int tp_rank,
                              int tp_size, int expert_tp_rank = -1, int expert_tp_size = -1);

// The merged table {"tensors": ..., "optimizer_tensors": ...} from every rank's description.
nlohmann::json merge_file_descriptions(const std::vector<nlohmann::json>& descriptions);

// The file holding TP rank `tp_rank`'s slice of model tensor `name`, per the table of
// state.json `state`, or "" when the table does not list it.
std::string table_file_of(const nlohmann::json& state, const std::string& name, int tp_rank);

}  // namespace megatron
