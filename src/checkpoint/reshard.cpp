#include "checkpoint/reshard.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <tuple>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_table.h"
#include "core/errors.h"
#include "tensor_parallel/sharding.h"

namespace megatron {
namespace fs = std::filesystem;
namespace {

// Elements [begin, end) along `dim` of a tensor saved as `count` equal parts along that dim
// (part(s) gives saved part s, read lazily), `saved_length` long in all; positions at or past
// saved_length are zero (vocabulary padding grown). Only overlapping parts are touched.
at::Tensor read_range(const std::function<at::Tensor(int)>& part, int count, int64_t saved_length, int dim, int64_t begin,
                      int64_t end) {
  const int64_t per_part = saved_length / count;
  std::vector<at::Tensor> pieces;
  for (int s = 0; s < count; ++s) {
    const int64_t from = std::max(begin, s * per_part), to = std::min(end, (s + 1) * per_part);
    if (from < to) pieces.push_back(part(s).narrow(dim, from - s * per_part, to - from));
  }
  if (end > saved_length) {
    TORCH_CHECK(!pieces.empty() || begin >= saved_length, "read_range: nothing to pad from");
    const at::Tensor like = pieces.empty() ? part(count - 1) : pieces[0];
    std::vector<int64_t> shape = like.sizes().vec();
    shape[dim] = end - std::max(begin, saved_length);
    pieces.push_back(at::zeros(shape, like.options()));
  }
  return pieces.size() == 1 ? pieces[0] : at::cat(pieces, dim);
}

// Target TP rank `rank` of `size`'s shard of a tensor saved as `count` TP parts (spec says how
// it is split); `target_length` is its full length along the split dim (vocab rows may differ).
at::Tensor target_shard(const std::function<at::Tensor(int)>& part, int count, const tp::ShardSpec& spec, int64_t saved_local,
                        int64_t target_length, int rank, int size) {
  if (spec.replicated()) return part(0);
  if (!spec.gated) {
    const int64_t per_rank = target_length / size;
    return read_range(part, count, saved_local * count, spec.dim, rank * per_rank, (rank + 1) * per_rank);
  }
  // [gate; up] halves, each split over the ranks on its own.
  std::vector<at::Tensor> halves;
  for (int h = 0; h < 2; ++h) {
    auto half = [&](int s) { return part(s).narrow(0, h * (saved_local / 2), saved_local / 2); };
    const int64_t per_rank = target_length / 2 / size;
    halves.push_back(read_range(half, count, saved_local / 2 * count, 0, rank * per_rank, (rank + 1) * per_rank));
  }
  return at::cat(halves, 0);
}

// A parallel size state.json records (`fallback` when absent): a count of ranks, at least 1 and
// at most 2^20 (each is a file name or a division here), else an error naming the field.
int saved_size(const nlohmann::json& j, const char* key, int fallback, const std::string& where) {
  if (!j.contains(key)) return fallback;
  const nlohmann::json& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 20)) {
    throw UserError(where + "." + key + " must be a number of ranks from 1, got " + v.dump() + ": the checkpoint is damaged");
  }
  return v.get<int>();
}

}  // namespace

ShardedCheckpointReader::ShardedCheckpointReader(const std::string& dir, const nlohmann::json& state, tp::ParamTable params,
                                                 bool with_optimizer)
    : dir_(dir), params_(std::move(params)), state_(state) {
  const nlohmann::json layout = state.value("parallel", nlohmann::json::object());
  const std::string where = dir + "/state.json: parallel";
  tp_ = saved_size(layout, "tensor_model_parallel_size", 1, where);
  pp_ = saved_size(layout, "pipeline_model_parallel_size", 1, where);
  dp_ = saved_size(layout, "data_parallel_size", 1, where);
  distributed_ = layout.value("use_distributed_optimizer", false);
  const int ep = saved_size(layout, "expert_model_parallel_size", 1, where);
  // Each size is bounded alone; their product is the count of file names listed below.
  if (int64_t(tp_) * pp_ * (dp_ + ep) > (1 << 20)) {
    throw UserError(where + ": tensor " + std::to_string(tp_) + " x pipeline " + std::to_string(pp_) + " x (data " +
                    std::to_string(dp_) + " + expert " + std::to_string(ep) +
                    ") parallel ranks is more than 2^20 files: the checkpoint is damaged");
  }
  const bool single = tp_ * pp_ * dp_ == 1;
  for (int t = 0; t < tp_; ++t) {
    model_names_.emplace_back();
    optimizer_names_.emplace_back();
    for (int p = 0; p < pp_; ++p) {
      const std::string model = single ? "model.safetensors" : checkpoint_part_name("model", t, p);
      model_names_.back().push_back(model);
      for (int e = 0; e < ep && ep > 1; ++e) {  // each expert-parallel rank's experts
        model_names_.back().push_back(checkpoint_part_name("model", t, p, -1, e));
        const std::string state = checkpoint_part_name("optimizer", t, p, -1, e);
        if (with_optimizer && !distributed_ && fs::exists(dir + "/" + state)) optimizer_names_.back().push_back(state);
      }
      const int shards = !with_optimizer ? 0 : distributed_ ? dp_ : 1;
      for (int d = 0; d < shards; ++d) {
        const std::string name = single ? "optimizer.safetensors" : checkpoint_part_name("optimizer", t, p, distributed_ ? d : -1);
        if (fs::exists(dir + "/" + name)) optimizer_names_.back().push_back(name);  // weights-only checkpoints have none
      }
    }
  }
}

ShardedCheckpointReader::~ShardedCheckpointReader() = default;

const SafetensorsFile& ShardedCheckpointReader::file(const std::string& name, bool verified) const {
  auto it = files_.find(name);
  if (it == files_.end()) {
    const std::string path = dir_ + "/" + name;
    if (!fs::exists(path)) throw UserError(path + " is missing: the checkpoint is incomplete");
    it = files_.emplace(name, std::make_unique<SafetensorsFile>(path)).first;
  }
  if (verified && verified_.insert(name).second) it->second->verify_checksum();
  return *it->second;
}

std::string ShardedCheckpointReader::model_file(int tp_rank, const std::string& key) const {
  const std::string listed = table_file_of(state_, key, tp_rank);
  if (!listed.empty()) {
    if (!file(listed, false).contains(key)) throw UserError(dir_ + "/" + listed + " lacks '" + key + "', which state.json says it holds");
    return listed;
  }
  for (const auto& name : tp_rank < int(model_names_.size()) ? model_names_[size_t(tp_rank)] : std::vector<std::string>()) {
    if (file(name, false).contains(key)) return name;
  }
  throw UserError(dir_ + ": no model file of tensor-parallel rank " + std::to_string(tp_rank) + " holds '" + key +
                  "' (a file is missing, or the checkpoint is of another model)");
}

int ShardedCheckpointReader::saved_parts(const std::string& name) const {
  auto tensors = state_.find("tensors");
  if (tensors != state_.end() && tensors->contains(name)) {
    return saved_size((*tensors)[name], "tp_size", tp_, dir_ + "/state.json: tensors[\"" + name + "\"]");
  }
  return tp_;
}

at::Tensor ShardedCheckpointReader::model(const std::string& name, int64_t vocab_rows, int tp_rank, int tp_size) const {
  const tp::ParamInfo& info = params_.at(name);
  const tp::ShardSpec& spec = info.split;
  const int parts = saved_parts(name);
  // Shapes from the headers; data (and checksums) only from the files a slice is taken from.
  const at::Tensor shape_of = file(model_file(0, name), false).view_floating(name);
  auto part = [&](int s) {
    const std::string f = model_file(s, name);
    return file(f, true).view_floating(name);
  };
  const int64_t saved_local = spec.replicated() ? 0 : shape_of.size(spec.dim);
  const int64_t target_length = info.vocab_rows ? vocab_rows : saved_local * parts;
  return target_shard(part, parts, spec, saved_local, target_length, tp_rank, tp_size);
}

at::Tensor ShardedCheckpointReader::saved_optimizer_range(int tp_rank, const std::string& name, const std::string& field,
                                                          int64_t begin, int64_t end) const {
  const std::string key = name + "." + field;
  at::Tensor out = at::empty({end - begin}, at::kFloat);
  int64_t covered = 0;
  // The table of state.json lists each saved slice with its TP rank (experts: expert-TP rank),
  // offset and length, whichever file holds it: the range is filled from the slices in offset
  // order, each element once (slices held twice, as a tied embedding's, serve once).
  auto table = state_.find("optimizer_tensors");
  if (table != state_.end() && table->contains(key)) {
    std::vector<std::tuple<int64_t, int64_t, std::string>> slices;  // offset, length, file
    for (const auto& part : (*table)[key].at("files")) {
      if (part.at("tp_rank").get<int>() != tp_rank) continue;
      slices.emplace_back(part.at("offset").get<int64_t>(), part.at("numel").get<int64_t>(), part.at("file").get<std::string>());
    }
    std::sort(slices.begin(), slices.end());
    int64_t next = begin;
    for (const auto& [offset, length, n] : slices) {
      if (next >= end) break;
      if (offset > next || offset + length <= next) continue;
      const int64_t to = std::min(end, offset + length);
      const at::Tensor slice = file(n, true).view_floating(key).reshape({-1});
      out.narrow(0, next - begin, to - next).copy_(slice.narrow(0, next - offset, to - next));
      next = to;
    }
    if (next == end) return out;
    throw UserError(dir_ + ": the optimizer state of '" + key + "' covers " + std::to_string(next - begin) + " of the " +
                    std::to_string(end - begin) + " elements needed from element " + std::to_string(begin) +
                    " (a shard file is missing?)");
  }
  if (tp_rank >= int(optimizer_names_.size()) || optimizer_names_[size_t(tp_rank)].empty()) {
    throw UserError(dir_ + " has no optimizer state: load with --no-load-optim or --finetune");
  }
  const auto& names = optimizer_names_[size_t(tp_rank)];
  // Each DP rank's file holds a flat slice of the TP-local parameter at the offset its metadata
  // names; without the distributed optimizer one file holds all of it. A tied embedding is
  // held by two stages alike: whichever file comes first serves. Only files whose slice
  // overlaps [begin, end) are read.
  for (const auto& n : names) {
    const SafetensorsFile& header = file(n, false);
    if (!header.contains(key)) continue;
    auto it = header.metadata().find("offset/" + name);
    const int64_t offset = !distributed_ || it == header.metadata().end() ? 0 : std::stoll(it->second);
    const int64_t length = header.view_floating(key).numel();
    const int64_t from = std::max(begin, offset), to = std::min(end, offset + length);
    if (from >= to) continue;
    const at::Tensor slice = file(n, true).view_floating(key).reshape({-1});
    out.narrow(0, from - begin, to - from).copy_(slice.narrow(0, from - offset, to - from));
    covered += to - from;
    if (covered == end - begin) return out;
  }
  throw UserError(dir_ + ": the optimizer state of '" + key + "' covers " + std::to_string(covered) + " of the " +
                  std::to_string(end - begin) + " elements needed (a shard file is missing?)");
}

at::Tensor ShardedCheckpointReader::optimizer(const std::string& name, const std::string& field, int64_t vocab_rows,
                                              int tp_rank, int tp_size, int64_t offset, int64_t numel) const {
  const tp::ParamInfo& info = params_.at(name);
  const tp::ShardSpec& spec = info.split;
  const at::Tensor saved_shape = file(model_file(0, name), false).view_floating(name);
  const int parts = saved_parts(name);
  const bool same_rows = !info.vocab_rows || saved_shape.size(0) * parts == vocab_rows;
  if ((tp_size == parts || spec.replicated()) && same_rows) {
    // Same TP shard: the range maps one to one onto the saved flat shard.
    return saved_optimizer_range(spec.replicated() ? 0 : tp_rank, name, field, offset, offset + numel);
  }
  // Another TP split: the target shard from the overlapping saved shards, whole.
  auto part = [&](int s) {
    return saved_optimizer_range(s, name, field, 0, saved_shape.numel()).view(saved_shape.sizes());
  };
  const int64_t saved_local = spec.replicated() ? 0 : saved_shape.size(spec.dim);
  const int64_t target_length = info.vocab_rows ? vocab_rows : saved_local * parts;
  return target_shard(part, parts, spec, saved_local, target_length, tp_rank, tp_size).reshape({-1}).narrow(0, offset, numel);
}

at::Tensor ShardedCheckpointReader::step() const {
  for (const auto& names : optimizer_names_) {
    for (const auto& n : names) {
      if (file(n, false).contains("step")) return file(n, true).view_floating("step").clone();
    }
  }
  throw UserError(dir_ + " has no optimizer step: load with --no-load-optim or --finetune");
}

}  // namespace megatron
