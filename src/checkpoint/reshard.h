// Reading a checkpoint saved under one parallel layout (TP, PP, DP, distributed optimizer or not)
// as whole tensors, so it loads under any other: each parameter is looked up in the pipeline
// stage files that hold it (names are global), model shards are concatenated back along their
// split dimension (tensor_parallel/sharding.h), distributed-optimizer state is reassembled from
// each DP rank's flat slice (its offset is in the file's metadata), and vocabulary rows are
// padded or trimmed to the new padded size. Files are memory-mapped; only what is read is touched.
#pragma once

#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace megatron {

class SafetensorsFile;

class ShardedCheckpointReader {
 public:
  // `layout`: state.json's "parallel" object. Without `with_optimizer` only the model files are
  // opened (and checksummed).
  ShardedCheckpointReader(const std::string& dir, const nlohmann::json& layout, bool swiglu, bool with_optimizer = true);
  ~ShardedCheckpointReader();

  // The whole parameter `name` (all TP shards), with `vocab_rows` rows for the embedding and output layer.
  at::Tensor model(const std::string& name, int64_t vocab_rows) const;
  // The whole optimizer state `field` (master, exp_avg, exp_avg_sq) of parameter `name`.
  at::Tensor optimizer(const std::string& name, const std::string& field, int64_t vocab_rows) const;
  at::Tensor step() const;

 private:
  at::Tensor tp_local_optimizer(int tp_rank, const std::string& name, const std::string& field) const;
  // The file of TP rank `tp_rank` holding `key`, among the stages' files.
  const SafetensorsFile& model_file(int tp_rank, const std::string& key) const;
  std::string dir_;
  bool swiglu_;
  int tp_ = 1, pp_ = 1, dp_ = 1;
  bool distributed_ = false;
  std::vector<std::vector<std::unique_ptr<SafetensorsFile>>> model_files_;      // per TP rank, per PP stage
  std::vector<std::vector<std::unique_ptr<SafetensorsFile>>> optimizer_files_;  // per TP rank: every stage's (and DP shard's)
};

}  // namespace megatron
