#include "checkpoint/reshard.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "core/errors.h"
#include "tensor_parallel/sharding.h"

namespace megatron {
namespace fs = std::filesystem;
namespace {

bool is_vocab_parallel(const std::string& name) {
  return name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
}

// Rows past the tokenizer's vocabulary are padding: zero-filled when growing, dropped when shrinking.
at::Tensor with_rows(const at::Tensor& t, int64_t rows) {
  if (t.size(0) == rows) return t;
  if (t.size(0) > rows) return t.narrow(0, 0, rows);
  return at::cat({t, at::zeros({rows - t.size(0), t.size(1)}, t.options())}, 0);
}

}  // namespace

ShardedCheckpointReader::ShardedCheckpointReader(const std::string& dir, const nlohmann::json& layout, bool swiglu,
                                                 bool with_optimizer)
    : dir_(dir), swiglu_(swiglu) {
  tp_ = layout.value("tensor_model_parallel_size", 1);
  pp_ = layout.value("pipeline_model_parallel_size", 1);
  dp_ = layout.value("data_parallel_size", 1);
  distributed_ = layout.value("use_distributed_optimizer", false);
  const bool single = tp_ * pp_ * dp_ == 1;
  auto open = [&](const std::string& path) {
    auto f = std::make_unique<SafetensorsFile>(path);
    f->verify_checksum();
    return f;
  };
  for (int t = 0; t < tp_; ++t) {
    model_files_.emplace_back();
    optimizer_files_.emplace_back();
    for (int p = 0; p < pp_; ++p) {
      model_files_.back().push_back(open(dir + "/" + (single ? "model.safetensors" : checkpoint_part_name("model", t, p))));
      const int shards = !with_optimizer ? 0 : distributed_ ? dp_ : 1;
      for (int d = 0; d < shards; ++d) {
        const std::string path =
            dir + "/" + (single ? "optimizer.safetensors" : checkpoint_part_name("optimizer", t, p, distributed_ ? d : -1));
        if (!fs::exists(path)) continue;  // weights-only checkpoints have none
        optimizer_files_.back().push_back(open(path));
      }
    }
  }
}

ShardedCheckpointReader::~ShardedCheckpointReader() = default;

const SafetensorsFile& ShardedCheckpointReader::model_file(int tp_rank, const std::string& key) const {
  for (const auto& f : model_files_[tp_rank]) {
    if (f->contains(key)) return *f;
  }
  throw UserError(dir_ + ": no model file of tensor-parallel rank " + std::to_string(tp_rank) + " holds '" + key +
                  "' (a file is missing, or the checkpoint is of another model)");
}

at::Tensor ShardedCheckpointReader::model(const std::string& name, int64_t vocab_rows) const {
  std::vector<at::Tensor> parts;
  for (int t = 0; t < tp_; ++t) parts.push_back(model_file(t, name).view(name));
  at::Tensor full = tp::unshard(parts, tp::shard_spec(name, swiglu_));
  return is_vocab_parallel(name) ? with_rows(full, vocab_rows) : full;
}

at::Tensor ShardedCheckpointReader::tp_local_optimizer(int tp_rank, const std::string& name, const std::string& field) const {
  const auto& files = optimizer_files_[tp_rank];
  if (files.empty()) throw UserError(dir_ + " has no optimizer state: load with --no-load-optim or --finetune");
  const std::string key = name + "." + field;
  const at::Tensor shape_of = model_file(tp_rank, name).view(name);
  // Each DP rank's file holds a flat slice of the TP-local parameter, at the offset its
  // metadata names; without the distributed optimizer one file holds all of it. A tied
  // embedding is held by two stages alike: the first stage's slices are taken.
  at::Tensor flat = at::zeros({shape_of.numel()}, at::kFloat);
  int64_t covered = 0;
  for (const auto& f : files) {
    if (!f->contains(key)) continue;
    const at::Tensor slice = f->view(key).reshape({-1});
    if (!distributed_) return slice.view(shape_of.sizes());
    auto it = f->metadata().find("offset/" + name);
    const int64_t offset = it == f->metadata().end() ? 0 : std::stoll(it->second);
    flat.narrow(0, offset, slice.numel()).copy_(slice);
    covered += slice.numel();
    if (covered == flat.numel()) break;
  }
  if (covered != flat.numel()) {
    throw UserError(dir_ + ": the optimizer state of '" + key + "' covers " + std::to_string(covered) + " of " +
                    std::to_string(flat.numel()) + " elements (a shard file is missing?)");
  }
  return flat.view(shape_of.sizes());
}

at::Tensor ShardedCheckpointReader::optimizer(const std::string& name, const std::string& field, int64_t vocab_rows) const {
  std::vector<at::Tensor> parts;
  for (int t = 0; t < tp_; ++t) parts.push_back(tp_local_optimizer(t, name, field));
  at::Tensor full = tp::unshard(parts, tp::shard_spec(name, swiglu_));
  return is_vocab_parallel(name) ? with_rows(full, vocab_rows) : full;
}

at::Tensor ShardedCheckpointReader::step() const {
  for (const auto& files : optimizer_files_) {
    for (const auto& f : files) {
      if (f->contains("step")) return f->load("step");
    }
  }
  throw UserError(dir_ + " has no optimizer step: load with --no-load-optim or --finetune");
}

}  // namespace megatron
