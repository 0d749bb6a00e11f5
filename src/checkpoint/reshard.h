// Reading a checkpoint saved under one parallel layout (TP, PP, DP, distributed optimizer or not)
// as whole tensors, so it loads under any other: each parameter is looked up in the pipeline
// stage files that hold it (names are global), model shards are concatenated back along their
// split dimension (as each parameter's description says: tensor_parallel/parameters.h), distributed-optimizer state is reassembled from
// each DP rank's flat slice (its offset is in the file's metadata), and vocabulary rows are
// padded or trimmed to the new padded size. Files are memory-mapped and opened on first use;
// a rank reads (and checksums) only the files holding slices it needs.
#pragma once

#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tensor_parallel/parameters.h"

namespace megatron {

class SafetensorsFile;

class ShardedCheckpointReader {
 public:
  // `state`: the directory's state.json (its "parallel" layout and tensor table); `params`: how
  // each parameter splits (the model's parameter table, or describe_model's). Without
  // `with_optimizer` only model files are read.
  ShardedCheckpointReader(const std::string& dir, const nlohmann::json& state, tp::ParamTable params,
                          bool with_optimizer = true);
  ~ShardedCheckpointReader();

  // Tensor-parallel rank `tp_rank` of `tp_size`'s shard of parameter `name` (the whole
  // parameter by default), with `vocab_rows` rows in all for the embedding and output layer.
  // Only the saved shards overlapping it are read, and of those only the overlapping rows or
  // columns (views of memory-mapped files).
  at::Tensor model(const std::string& name, int64_t vocab_rows, int tp_rank = 0, int tp_size = 1) const;
  // Elements [offset, offset + numel) of the flattened TP shard (as model()) of the optimizer
  // state `field` (master, exp_avg, exp_avg_sq) of `name`: what one distributed-optimizer rank
  // steps. Under the saved TP layout only the DP slices overlapping the range are read.
  at::Tensor optimizer(const std::string& name, const std::string& field, int64_t vocab_rows, int tp_rank, int tp_size,
                       int64_t offset, int64_t numel) const;
  at::Tensor step() const;

 private:
  // The name of the file of TP rank `tp_rank` holding `key`: as state.json's table lists it,
  // else found among the stages' files.
  std::string model_file(int tp_rank, const std::string& key) const;
  // How many TP parts model tensor `name` was saved in: state.json's table says (experts: their
  // expert-TP size); older tables without it, the TP size.
  int saved_parts(const std::string& name) const;
  // A file of the checkpoint, opened (memory-mapped) on first use; with `verified` its
  // checksum is checked too, once: for every file this rank reads data from, and only those.
  const SafetensorsFile& file(const std::string& name, bool verified) const;
  // Flat elements [begin, end) of saved TP rank `tp_rank`'s shard of `field`, from the DP
  // slices that overlap them.
  at::Tensor saved_optimizer_range(int tp_rank, const std::string& name, const std::string& field, int64_t begin,
                                   int64_t end) const;
  std::string dir_;
  tp::ParamTable params_;
  nlohmann::json state_;  // state.json: its tensor table says which file holds which slice
  int tp_ = 1, pp_ = 1, dp_ = 1;
  bool distributed_ = false;
  std::vector<std::vector<std::string>> model_names_;      // per TP rank, per PP stage
  std::vector<std::vector<std::string>> optimizer_names_;  // per TP rank: every stage's (and DP shard's) that exist
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
  mutable std::set<std::string> verified_;
};

}  // namespace megatron
