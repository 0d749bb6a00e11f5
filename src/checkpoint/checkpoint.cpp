// Saving native checkpoints: file names, the snapshot of this rank's tensors (copied to the host
// for an asynchronous save), writing, and publishing by rename (checkpoint.h says what is where;
// checkpoint_load.cpp reads them back).
#include "checkpoint/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_records.h"
#include "checkpoint/fp8_state.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_table.h"
#include "core/config_json.h"
#include "core/errors.h"
#include "core/files.h"
#include "model/gpt_model.h"
#include "optim/adamw.h"

namespace megatron {
namespace fs = std::filesystem;
namespace {

// Temporary directories of saves or deletions a crash interrupted (never loadable: their names
// are not iteration names).
void remove_leftovers(const std::string& save_dir) {
  const std::string mine = ".tmp-" + std::to_string(::getpid());
  for (const auto& entry : fs::directory_iterator(save_dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("iter_", 0) == 0 && name.find(".tmp") != std::string::npos && name.find(mine) == std::string::npos) {
      remove_tree(entry.path().string());
    }
  }
}

// Keeps the checkpoint just saved (the tracker's) and the newest keep - 1 others; deletes the
// rest. Each is first renamed to a temporary name, so a crash mid-delete never leaves a partial
// directory under a final name.
void remove_old_checkpoints(const std::string& save_dir, int64_t keep, int64_t current) {
  std::vector<std::pair<long long, fs::path>> found;
  for (const auto& entry : fs::directory_iterator(save_dir)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.size() != 12 || name.rfind("iter_", 0) != 0) continue;
    const long long iteration = std::stoll(name.substr(5));
    if (iteration != current) found.emplace_back(iteration, entry.path());
  }
  std::sort(found.begin(), found.end());
  for (size_t i = 0; i + size_t(keep - 1) < found.size(); ++i) {
    const std::string doomed = temporary_name(found[i].second.string()) + "-delete";
    fs::rename(found[i].second, doomed);
    remove_tree(doomed);
  }
}

// The keys of state.json every checkpoint has; the caller adds the tensor table.
nlohmann::json state_skeleton(const Config& config, const TrainingProgress& progress, const nlohmann::json& layout) {
  nlohmann::json state = {{"format_version", kFormatVersion},
          {"iteration", progress.iteration},
          {"consumed_train_samples", progress.consumed_train_samples},
          {"consumed_valid_samples", progress.consumed_valid_samples},
          {"skipped_iterations", progress.skipped_iterations},
          {"nan_iterations", progress.nan_iterations},
          {"model", model_summary(config.model)},
          {"model_config", model_config_to_json(config.model)},
          {"tokenizer", tokenizer_config_to_json(config.data)},
          {"parallel", layout},
          {"bf16", config.train.bf16}};
  if (config.train.fp16) state["fp16"] = true;
  if (progress.skipped_train_samples > 0) state["skipped_train_samples"] = progress.skipped_train_samples;
  if (const auto& g = progress.grad_scaler) {
    state["grad_scaler"] = {{"scale", g->scale}, {"growth_tracker", g->growth_tracker}, {"hysteresis_tracker", g->hysteresis_tracker}};
  }
  if (const auto& s = progress.schedule) {
    // Megatron's OptimizerParamScheduler.state_dict(), field for field.
    state["opt_param_scheduler"] = {
        {"max_lr", s->max_lr},
        {"min_lr", s->min_lr},
        {"lr_warmup_steps", s->lr_warmup_steps},
        {"lr_decay_steps", s->lr_decay_steps},
        {"lr_decay_style", s->lr_decay_style},
        {"start_wd", s->start_wd},
        {"end_wd", s->end_wd},
        {"wd_incr_steps", s->wd_incr_steps},
        {"wd_incr_style", s->wd_incr_style},
        {"num_steps", progress.consumed_train_samples - progress.skipped_train_samples - progress.schedule_start_samples}};
  }
  return state;
}

// Every rank's string on rank 0 (collective over `world`; others get an empty list).
std::vector<std::string> gather_on_rank0(const dist::ParallelState& ps, const std::string& mine, const at::Device& device) {
  if (ps.world_size == 1) return {mine};
  const auto options = at::TensorOptions().device(device);
  at::Tensor length = at::full({1}, int64_t(mine.size()), options.dtype(at::kLong));
  at::Tensor lengths = at::empty({ps.world_size}, options.dtype(at::kLong));
  ps.world.all_gather(lengths, length);
  const at::Tensor sizes = lengths.cpu();
  const int64_t longest = sizes.max().item<int64_t>();
  at::Tensor bytes = at::zeros({longest}, at::kByte);
  std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
  at::Tensor all = at::empty({ps.world_size * longest}, options.dtype(at::kByte));
  ps.world.all_gather(all, bytes.to(device));
  if (ps.rank != 0) return {};
  const at::Tensor host = all.cpu();
  std::vector<std::string> out;
  for (int r = 0; r < ps.world_size; ++r) {
    out.emplace_back(static_cast<const char*>(host.data_ptr()) + r * longest, size_t(sizes[r].item<int64_t>()));
  }
  return out;
}

}  // namespace

std::string checkpoint_part_name(const std::string& kind, int tp_rank, int pp_rank, int dp_rank, int ep_rank) {
  char name[96];
  if (ep_rank >= 0) {
    std::snprintf(name, sizeof(name), "%s_tp%02d_pp%03d_ep%03d.safetensors", kind.c_str(), tp_rank, pp_rank, ep_rank);
  } else if (dp_rank >= 0) {
    std::snprintf(name, sizeof(name), "%s_tp%02d_pp%03d_dp%03d.safetensors", kind.c_str(), tp_rank, pp_rank, dp_rank);
  } else {
    std::snprintf(name, sizeof(name), "%s_tp%02d_pp%03d.safetensors", kind.c_str(), tp_rank, pp_rank);
  }
  return name;
}

std::string checkpoint_file(const std::string& kind, const dist::ParallelState& ps, bool distributed_optimizer) {
  if (ps.world_size == 1) return kind + ".safetensors";
  if (kind == "rng") {
    char name[64];
    std::snprintf(name, sizeof(name), "rng_rank%05d.safetensors", ps.rank);
    return name;
  }
  const bool per_dp = kind == "optimizer" && distributed_optimizer;
  return checkpoint_part_name(kind, ps.tp.rank(), ps.pp.rank(), per_dp ? ps.dp_cp.rank() : -1);
}

std::string iteration_directory(const std::string& save_dir, int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof(name), "iter_%07lld", static_cast<long long>(iteration));
  return (fs::path(save_dir) / name).string();
}

CheckpointSnapshot snapshot_checkpoint(const std::string& save_dir, const TrainingProgress& progress,
                                       const std::vector<GPTModel*>& chunks,
                                       const AdamW& optimizer, const Config& config, const dist::ParallelState& ps,
                                       bool copy, std::map<std::string, at::Tensor>* host_buffers) {
  CheckpointSnapshot snap;
  snap.save_dir = save_dir;
  snap.iteration = progress.iteration;
  snap.leader = ps.rank == 0;
  snap.keep_last_n = config.train.keep_last_n;
  const bool distributed_optimizer = config.parallel.use_distributed_optimizer;
  snap.final_dir = iteration_directory(save_dir, progress.iteration);
  // Every rank writes into the same temporary directory, so its name cannot hold a pid.
  snap.tmp_dir = ps.world_size == 1 ? temporary_name(snap.final_dir) : snap.final_dir + ".tmp";
  if (snap.leader) {
    make_directories(save_dir);
    remove_leftovers(save_dir);
    remove_tree(snap.tmp_dir);
    make_directories(snap.tmp_dir);
  }
  ps.world.barrier();

  // An asynchronous save keeps host copies, so training may change the originals meanwhile.
  auto host = [&](const std::string& key, const at::Tensor& t) {
    at::Tensor d = t.detach();
    if (!copy) return d;
    if (d.is_cpu()) return d.clone();
    if (host_buffers == nullptr) return d.to(at::kCPU);
    at::Tensor& buffer = (*host_buffers)[key];
    if (!buffer.defined() || !buffer.sizes().equals(d.sizes()) || buffer.scalar_type() != d.scalar_type()) {
      buffer = at::empty(d.sizes(), d.options().device(at::kCPU).pinned_memory(true));
    }
    buffer.copy_(d);
    return buffer;
  };
  // Under expert parallelism the experts differ across the DP replicas, and under an expert TP
  // other than TP they split otherwise than the dense tensors: each (expert-TP, EP) rank's are
  // written apart, by the first replica of them (expert-DP rank 0), into ..._tpTT_ppPPP_epEEE
  // files, TT its expert-TP rank.
  const tp::ParamTable table = chunk_table(chunks);
  const bool expert_files = ps.ep.size() > 1 || ps.expert_tp.size() != ps.tp.size();
  auto is_expert = [&](const std::string& param) { return table.contains(param) && table.at(param).expert >= 0; };
  auto of_expert = [&](const std::string& state_name) {  // "<param>.<field>"
    const size_t dot = state_name.rfind('.');
    return dot != std::string::npos && is_expert(state_name.substr(0, dot));
  };
  const std::map<std::string, std::string> model_metadata = {{"format", "megatron.cpp"},
                                                             {"tensor_parallel_rank", std::to_string(ps.tp.rank())},
                                                             {"tensor_parallel_size", std::to_string(ps.tp.size())}};
  const std::map<std::string, std::string> expert_metadata = {{"format", "megatron.cpp"},
                                                              {"tensor_parallel_rank", std::to_string(ps.expert_tp.rank())},
                                                              {"tensor_parallel_size", std::to_string(ps.expert_tp.size())}};
  if (ps.dp_cp.rank() == 0) {  // one writer among the replicas (context-parallel ones too)
    CheckpointSnapshot::File f{checkpoint_file("model", ps, distributed_optimizer), {}, model_metadata};
    for (const auto& [name, param] : chunk_parameters(chunks)) {
      if (!expert_files || !is_expert(name)) f.tensors.push_back({name, host("model/" + name, param)});
    }
    snap.files.push_back(std::move(f));
  }
  if (expert_files && ps.expert_dp.rank() == 0) {
    CheckpointSnapshot::File f{checkpoint_part_name("model", ps.expert_tp.rank(), ps.pp.rank(), -1, ps.ep.rank()), {}, expert_metadata};
    for (const auto& [name, param] : chunk_parameters(chunks)) {
      if (is_expert(name)) f.tensors.push_back({name, host("model/" + name, param)});
    }
    snap.files.push_back(std::move(f));
  }
  // The FP8 delayed recipe's amax histories and scales: the same on every TP and DP rank.
  if (ps.tp.rank() == 0 && ps.dp_cp.rank() == 0) {
    std::vector<SafetensorsEntry> fp8 = fp8_state_tensors(chunks);
    if (!fp8.empty()) snap.files.push_back({fp8_state_file(ps.pp.rank()), std::move(fp8), {{"format", "megatron.cpp"}}});
  }
  const std::vector<NamedTensor> optimizer_state = config.train.no_save_optim ? std::vector<NamedTensor>() : optimizer.state();
  // The distributed optimizer's files are per DP rank already and hold this rank's shards of both.
  const bool expert_optimizer_files = expert_files && !distributed_optimizer && !config.train.no_save_optim;
  if (!config.train.no_save_optim && (ps.dp_cp.rank() == 0 || distributed_optimizer)) {
    CheckpointSnapshot::File f{checkpoint_file("optimizer", ps, distributed_optimizer), {}, optimizer.state_offsets()};
    for (const auto& t : optimizer_state) {
      if (!expert_optimizer_files || !of_expert(t.name)) f.tensors.push_back({t.name, host("optimizer/" + t.name, t.tensor)});
    }
    snap.files.push_back(std::move(f));
  }
  if (expert_optimizer_files && ps.expert_dp.rank() == 0) {
    CheckpointSnapshot::File f{checkpoint_part_name("optimizer", ps.expert_tp.rank(), ps.pp.rank(), -1, ps.ep.rank()), {},
                               optimizer.state_offsets()};
    for (const auto& t : optimizer_state) {
      if (of_expert(t.name)) f.tensors.push_back({t.name, host("optimizer/" + t.name, t.tensor)});
    }
    snap.files.push_back(std::move(f));
  }
  if (!config.train.no_save_rng) {
    CheckpointSnapshot::File rng{checkpoint_file("rng", ps, distributed_optimizer), {}, {}};
    auto gens = checkpoint_generators();
    for (size_t i = 0; i < gens.size(); ++i) rng.tensors.push_back({i == 0 ? "cpu" : "cuda", gens[i].get_state()});
    if (const auto& tracker = chunks.at(0)->tensor_parallel().rng) {
      rng.tensors.push_back({"model_parallel_cpu", tracker->cpu_state()});
      if (tracker->cuda_state().defined()) rng.tensors.push_back({"model_parallel_cuda", tracker->cuda_state()});
    }
    snap.files.push_back(std::move(rng));
  }

  // Every file's tensors described in state.json (gathered: each rank knows its own files).
  const at::Device device = chunks.at(0)->parameters().at(0).device();
  const std::vector<std::string> descriptions = gather_on_rank0(
      ps, describe_files(snap.files, table, ps.tp.rank(), ps.tp.size(), ps.expert_tp.rank(), ps.expert_tp.size()).dump(), device);
  if (snap.leader) {
    std::vector<nlohmann::json> parsed;
    for (const auto& d : descriptions) parsed.push_back(nlohmann::json::parse(d));
    const nlohmann::json table = merge_file_descriptions(parsed);
    nlohmann::json state = state_skeleton(config, progress, layout_summary(config, ps));
    state["tensors"] = table.at("tensors");
    state["optimizer_tensors"] = table.at("optimizer_tensors");
    // --no-save-optim / --no-save-rng: a resume must say it starts those afresh.
    if (config.train.no_save_optim) state["optimizer_saved"] = false;
    if (config.train.no_save_rng) state["rng_saved"] = false;
    snap.state_json = state.dump(2) + "\n";
  }
  return snap;
}

void write_checkpoint_files(const CheckpointSnapshot& snap) {
  for (const auto& f : snap.files) save_safetensors(snap.tmp_dir + "/" + f.name, f.tensors, f.metadata);
  if (snap.leader) write_file_atomic(snap.tmp_dir + "/state.json", snap.state_json);
}

void publish_checkpoint(const CheckpointSnapshot& snap, const dist::ParallelState& ps) {
  ps.world.barrier();  // every part is written (and fsynced) before the directory is published
  if (snap.leader) {
    fsync_path(snap.tmp_dir);
    // Replace an older checkpoint of the same iteration only once the new one is complete.
    if (fs::exists(snap.final_dir)) {
      const std::string old = temporary_name(snap.final_dir) + "-old";  // a temporary name: never taken for a checkpoint
      fs::rename(snap.final_dir, old);
      fs::rename(snap.tmp_dir, snap.final_dir);
      remove_tree(old);
    } else {
      fs::rename(snap.tmp_dir, snap.final_dir);
    }
    fsync_path(snap.save_dir);
    write_file_atomic((fs::path(snap.save_dir) / kTracker).string(), std::to_string(snap.iteration) + "\n");
    if (snap.keep_last_n > 0) remove_old_checkpoints(snap.save_dir, snap.keep_last_n, snap.iteration);
  }
  ps.world.barrier();
}

void save_checkpoint(const std::string& save_dir, const TrainingProgress& progress, const std::vector<GPTModel*>& chunks,
                     const AdamW& optimizer, const Config& config, const dist::ParallelState& ps) {
  const CheckpointSnapshot snap = snapshot_checkpoint(save_dir, progress, chunks, optimizer, config, ps, /*copy=*/false);
  write_checkpoint_files(snap);
  publish_checkpoint(snap, ps);
}

void save_weights_checkpoint(const std::string& save_dir, const Config& config, const tp::ParamTable& params,
                             const std::function<void(int, int, int, const std::string&)>& write_model_file,
                             const std::map<std::string, std::string>& extra_files,
                             const std::function<void()>& check_before_publish, const TrainingProgress& progress) {
  make_directories(save_dir);
  const std::string final_dir = iteration_directory(save_dir, progress.iteration);
  if (fs::exists(final_dir)) throw UserError(final_dir + " exists: convert into a new directory");
  const std::string tmp_dir = temporary_name(final_dir);
  remove_tree(tmp_dir);
  make_directories(tmp_dir);
  try {
    const int tp_size = config.parallel.tensor_model_parallel_size, pp_size = config.parallel.pipeline_model_parallel_size;
    const int ep_size = config.parallel.expert_model_parallel_size;
    // Per TP rank and stage: the file of the dense tensors (all of them without expert
    // parallelism), then one per EP rank with its experts.
    std::vector<std::tuple<int, int, int, std::string>> files;
    for (int p = 0; p < pp_size; ++p) {
      for (int t = 0; t < tp_size; ++t) {
        files.emplace_back(t, p, -1, tp_size * pp_size == 1 && ep_size == 1 ? std::string("model.safetensors") : checkpoint_part_name("model", t, p));
        for (int e = 0; e < ep_size && ep_size > 1; ++e) files.emplace_back(t, p, e, checkpoint_part_name("model", t, p, -1, e));
      }
    }
    for (const auto& [t, p, e, name] : files) write_model_file(t, p, e, tmp_dir + "/" + name);
    for (const auto& [name, source] : extra_files) write_file_atomic(tmp_dir + "/" + name, read_file(source));
    ParallelConfig weights_layout = config.parallel;
    weights_layout.use_distributed_optimizer = false;
    const nlohmann::json layout = layout_summary(weights_layout, tp_size, pp_size, 1);
    // The table of state.json, from the files just written (memory-mapped, nothing copied).
    std::vector<nlohmann::json> descriptions;
    for (const auto& [t, p, e, name] : files) {
      SafetensorsFile written(tmp_dir + "/" + name);
      CheckpointSnapshot::File f{name, {}, {}};
      for (const auto& tensor : written.names()) f.tensors.push_back({tensor, written.view(tensor)});
      descriptions.push_back(describe_files({f}, params, t, tp_size));
    }
    const nlohmann::json table = merge_file_descriptions(descriptions);
    nlohmann::json state = state_skeleton(config, progress, layout);
    state["weights_only"] = true;
    state["tensors"] = table.at("tensors");
    write_file_atomic(tmp_dir + "/state.json", state.dump(2) + "\n");
    fsync_path(tmp_dir);
    if (check_before_publish) check_before_publish();
  } catch (...) {
    remove_tree(tmp_dir);  // a temporary name is never loaded; removing it leaves no doubt
    throw;
  }
  fs::rename(tmp_dir, final_dir);
  fsync_path(save_dir);
  write_file_atomic((fs::path(save_dir) / kTracker).string(), std::to_string(progress.iteration) + "\n");
}

}  // namespace megatron
