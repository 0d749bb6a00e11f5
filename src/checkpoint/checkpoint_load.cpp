// Loading native checkpoints: the tracker, state.json and its checks, and the files of the same
// layout or, through the resharding reader, of any other (checkpoint.h says what is where).
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_records.h"
#include "checkpoint/fp8_state.h"
#include "checkpoint/hf_config_check.h"
#include "checkpoint/reshard.h"
#include "checkpoint/safetensors.h"
#include "core/config_json.h"
#include "core/errors.h"
#include "core/files.h"
#include "core/json_text.h"
#include "model/gpt_model.h"
#include "optim/adamw.h"

namespace megatron {
namespace fs = std::filesystem;

std::string latest_checkpoint_directory(const std::string& load_dir) {
  const std::string tracker = (fs::path(load_dir) / kTracker).string();
  if (!fs::exists(tracker)) return "";
  const std::string text = read_file(tracker);
  char* end = nullptr;
  const long long iteration = std::strtoll(text.c_str(), &end, 10);
  if (text.rfind("release", 0) == 0) {
    throw UserError(tracker + " names a Megatron 'release' checkpoint, which `megatron train` does not load directly: convert it with "
                    "`megatron convert --from megatron --to native --load " + load_dir + " --save DIR` and train on with --load DIR --finetune");
  }
  if (end == text.c_str() || iteration < 0) {
    throw UserError(tracker + ": expected an iteration number, found '" + text + "'");
  }
  const std::string dir = iteration_directory(load_dir, iteration);
  if (!fs::is_directory(dir)) throw UserError(tracker + " names iteration " + std::to_string(iteration) + " but " + dir + " does not exist");
  return dir;
}

nlohmann::json read_checkpoint_state(const std::string& dir) {
  if (!fs::exists(dir + "/state.json")) {  // Megatron's own formats share the tracker's name
    const char* megatron = nullptr;
    if (fs::exists(dir + "/.metadata")) {
      megatron = "a Megatron-Core torch_dist checkpoint (.metadata, *.distcp)";
    } else if (fs::is_directory(dir + "/mp_rank_00") || fs::is_directory(dir + "/mp_rank_00_000")) {
      megatron = "a legacy Megatron checkpoint (mp_rank_XX/model_optim_rng.pt)";
    }
    if (megatron != nullptr) {
      throw UserError(dir + " is " + megatron + ", which `megatron train` does not load directly: convert it with `megatron convert "
                      "--from megatron --to native --load " + fs::path(dir).parent_path().string() + " --save DIR` and train on with "
                      "--load DIR --finetune");
    }
    throw UserError(dir + "/state.json is missing: " + dir + " is not a megatron.cpp checkpoint");
  }
  nlohmann::json state;
  try {
    const std::string text = read_file(dir + "/state.json");
    check_json_depth(text, dir + "/state.json");
    state = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(dir + "/state.json is corrupt: " + e.what());
  }
  if (!state.is_object()) throw UserError(dir + "/state.json is corrupt: expected a JSON object, got " + std::string(state.type_name()));
  const nlohmann::json version = state.value("format_version", nlohmann::json());
  if (!version.is_number_integer() || version.get<int64_t>() != kFormatVersion) {
    throw UserError(dir + "/state.json: unsupported checkpoint format version " + version.dump());
  }
  return state;
}

ModelConfig saved_model_config(const std::string& dir, const nlohmann::json& state) {
  const std::string path = dir + "/state.json";
  if (!state.contains("model_config")) {
    throw UserError(path + " records no model configuration (\"model_config\"): it was saved by an older version, or is damaged");
  }
  check_saved_model_fields(state["model_config"], path);
  ModelConfig m;
  try {
    m = model_config_from_json(state["model_config"]);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path + ": model_config: " + e.what());
  } catch (const UserError& e) {  // a required key missing
    throw UserError(path + ": " + e.what());
  }
  check_saved_model(m, path);
  return m;
}

namespace {

// Each rank reads its own shards only (experts: of its expert-TP split), checked against the
// model's parameters. `rows`: the padded vocabulary the embedding and output layer take.
void copy_resharded_weights(const std::string& dir, ShardedCheckpointReader& reader, const tp::ParamTable& table,
                            const std::vector<GPTModel*>& chunks, int64_t rows) {
  const tp::TensorParallel& tensor_parallel = chunks.at(0)->tensor_parallel();
  for (auto& [name, param] : chunk_parameters(chunks)) {
    const dist::Group& split = tensor_parallel.split_group(table.at(name));
    const at::Tensor value = reader.model(name, rows, split.rank(), split.size());
    if (!value.sizes().equals(param.sizes())) {
      throw UserError(dir + ": parameter '" + name + "' resharded to " + c10::str(value.sizes()) + ", the model expects " +
                      c10::str(param.sizes()));
    }
    param.copy_(value);
  }
}

}  // namespace

void load_model_weights(const std::string& dir, GPTModel& model, const dist::ParallelState& ps) {
  // One process reads the file one process saved; any other layout (a checkpoint saved split, a
  // model split over ranks or pipeline stages) reshards.
  if (ps.world_size == 1 && fs::exists(dir + "/" + checkpoint_file("model", ps, false))) {
    SafetensorsFile weights(dir + "/" + checkpoint_file("model", ps, false));
    weights.verify_checksum();
    load_parameters(weights, chunk_parameters({&model}));
    return;
  }
  // Split over ranks: this rank's shards, cut from whatever layout the checkpoint was saved in.
  at::NoGradGuard no_grad;
  const tp::ParamTable table = chunk_table({&model});
  ShardedCheckpointReader reader(dir, read_checkpoint_state(dir), table);
  copy_resharded_weights(dir, reader, table, {&model}, model.config().padded_vocab_size);
}

namespace {

// The progress `state` (dir/state.json) records; UserError naming the file when damaged.
TrainingProgress progress_of(const nlohmann::json& state, const std::string& dir) {
  TrainingProgress progress;
  progress.iteration = state.at("iteration").get<int64_t>();
  progress.consumed_train_samples = state.at("consumed_train_samples").get<int64_t>();
  progress.consumed_valid_samples = state.at("consumed_valid_samples").get<int64_t>();
  progress.skipped_iterations = state.value("skipped_iterations", int64_t(0));
  progress.nan_iterations = state.value("nan_iterations", int64_t(0));
  progress.skipped_train_samples = state.value("skipped_train_samples", int64_t(0));
  if (state.contains("grad_scaler")) {
    const nlohmann::json& g = state["grad_scaler"];
    auto number = [&](const char* key) {
      if (!g.is_object() || !g.contains(key) || !g[key].is_number()) {
        throw UserError(dir + "/state.json: \"grad_scaler\" needs a number \"" + std::string(key) + "\"; the checkpoint is damaged");
      }
      return g[key].get<double>();
    };
    progress.grad_scaler = GradScalerState{number("scale"), number("growth_tracker"), number("hysteresis_tracker")};
  }
  if (state.contains("opt_param_scheduler")) {
    const nlohmann::json& j = state["opt_param_scheduler"];
    auto field = [&](const char* key) -> const nlohmann::json& {
      if (!j.is_object() || !j.contains(key)) {
        throw UserError(dir + "/state.json: \"opt_param_scheduler\" has no \"" + std::string(key) + "\"; the checkpoint is damaged");
      }
      return j[key];
    };
    try {
      OptParamSchedulerState s;
      s.max_lr = field("max_lr").get<double>();
      s.min_lr = field("min_lr").get<double>();
      s.lr_warmup_steps = field("lr_warmup_steps").get<double>();
      s.lr_decay_steps = field("lr_decay_steps").get<double>();
      s.lr_decay_style = field("lr_decay_style").get<std::string>();
      s.start_wd = field("start_wd").get<double>();
      s.end_wd = field("end_wd").get<double>();
      s.wd_incr_steps = field("wd_incr_steps").get<double>();
      s.wd_incr_style = field("wd_incr_style").get<std::string>();
      progress.schedule = s;
      const int64_t num_steps = field("num_steps").get<int64_t>();  // where the schedule stands
      progress.schedule_start_samples = progress.consumed_train_samples - progress.skipped_train_samples - num_steps;
    } catch (const nlohmann::json::exception& e) {
      throw UserError(dir + "/state.json: \"opt_param_scheduler\" holds a value of the wrong type (" + e.what() +
                      "); the checkpoint is damaged");
    }
  }
  return progress;
}

// The progress a load goes on with: the saved one but for the learning-rate schedule, which
// --no-load-optim starts over (Megatron's scheduler is part of the optimizer state it skips) and
// a resume with the optimizer checks against the flags (resume_opt_param_scheduler).
TrainingProgress resumed_progress(const nlohmann::json& state, const Config& config, const std::string& dir) {
  TrainingProgress progress = progress_of(state, dir);
  if (config.train.no_load_optim) {
    progress.schedule.reset();
    progress.schedule_start_samples = progress.consumed_train_samples - progress.skipped_train_samples;
  } else if (progress.schedule) {
    progress.schedule = resume_opt_param_scheduler(opt_param_scheduler_state(config.train), *progress.schedule, config.train, dir);
    // Megatron's override puts the schedule where the run is.
    if (config.train.override_opt_param_scheduler) progress.schedule_start_samples = 0;
  }
  return progress;
}

// The optimizer whose state a checkpoint load reads: only a run that steps loads one.
AdamW& optimizer_to_load(AdamW* optimizer) {
  TORCH_CHECK(optimizer != nullptr, "load_checkpoint: optimizer state requested without an optimizer");
  return *optimizer;
}

// Another layout: each rank reads only the saved slices that overlap its own shards.
TrainingProgress load_resharded(const std::string& dir, const nlohmann::json& state, const nlohmann::json& saved_layout,
                                const std::vector<GPTModel*>& chunks, AdamW* optimizer, const Config& config,
                                const dist::ParallelState& ps) {
  at::NoGradGuard no_grad;
  const tp::ParamTable table = chunk_table(chunks);
  ShardedCheckpointReader reader(dir, state, table);
  const int64_t rows = config.model.padded_vocab_size;
  const tp::TensorParallel& tensor_parallel = chunks.at(0)->tensor_parallel();
  copy_resharded_weights(dir, reader, table, chunks, rows);
  const bool weights_only = config.train.finetune || config.train.no_load_optim;
  if (weights_only) {
    if (optimizer != nullptr) optimizer->reset_from_model();
  } else {
    optimizer_to_load(optimizer).load_resharded([&](const std::string& name, const std::string& field, int64_t offset, int64_t numel) {
      const dist::Group& split = tensor_parallel.split_group(table.at(name));
      return reader.optimizer(name, field, rows, split.rank(), split.size(), offset, numel);
    }, reader.step());
  }
  if (ps.rank == 0) {
    std::printf("loaded checkpoint %s saved under %s, resharded to %s%s\n", dir.c_str(), saved_layout.dump().c_str(),
                layout_summary(config, ps).dump().c_str(),
                config.train.no_load_rng ? "" : " (generator states start from --seed: they are per rank)");
  }
  if (!config.train.finetune) load_fp8_state(dir, chunks, /*report=*/ps.rank == 0);
  return config.train.finetune ? TrainingProgress() : resumed_progress(state, config, dir);
}

// The generators' states from `path` (this rank's rng file). A state of another dtype or size
// than PyTorch's generators take is an error naming the file, not an internal one.
void load_generator_states(const std::string& path, const std::vector<GPTModel*>& chunks) {
  SafetensorsFile rng(path);
  rng.verify_checksum();
  auto state = [&](const char* name) { return rng.view_exactly(name, at::kByte, "a generator state").clone(); };
  try {
    auto gens = checkpoint_generators();
    for (size_t i = 0; i < gens.size(); ++i) {
      const char* name = i == 0 ? "cpu" : "cuda";
      if (rng.contains(name)) gens[i].set_state(state(name));
    }
    if (const auto& tracker = chunks.at(0)->tensor_parallel().rng; tracker && rng.contains("model_parallel_cpu")) {
      tracker->set_states(state("model_parallel_cpu"), rng.contains("model_parallel_cuda") ? state("model_parallel_cuda") : at::Tensor());
    }
  } catch (const c10::Error& e) {
    throw UserError(path + ": a generator state is not one PyTorch's generators take (" + e.what_without_backtrace() +
                    "): the file is damaged; resume with --no-load-rng to start the generators from --seed");
  }
}

// Loads checkpoint directory `dir` whose state.json is `state`.
TrainingProgress load_checkpoint_directory(const std::string& dir, const nlohmann::json& state, const std::vector<GPTModel*>& chunks,
                                           AdamW* optimizer, const Config& config, const dist::ParallelState& ps) {
  if (!state.value("optimizer_saved", true) && !config.train.no_load_optim && !config.train.finetune) {
    throw UserError(dir + " was saved with --no-save-optim: resume it with --no-load-optim (a fresh optimizer) or --finetune");
  }
  if (!state.value("rng_saved", true) && !config.train.no_load_rng && !config.train.finetune) {
    throw UserError(dir + " was saved with --no-save-rng: resume it with --no-load-rng (generators from --seed) or --finetune");
  }
  nlohmann::json expected = model_summary(config.model);
  nlohmann::json saved_model = state["model"];
  // The padded vocabulary follows the TP size; resharding pads or trims those rows.
  expected.erase("padded_vocab_size");
  saved_model.erase("padded_vocab_size");
  if (saved_model != expected) {
    throw UserError(dir + ": the checkpoint's model (" + state["model"].dump() + ") differs from the configured one (" +
                    expected.dump() + "); use the same model flags as the run that saved it");
  }
  // Layouts saved before a key existed had its default value.
  nlohmann::json saved_layout = layout_summary(ParallelConfig(), 1, 1, 1);
  saved_layout.update(state.value("parallel", nlohmann::json::object()));
  if (!state.value("parallel", nlohmann::json::object()).contains("expert_tensor_parallel_size")) {
    saved_layout["expert_tensor_parallel_size"] = saved_layout["tensor_model_parallel_size"];  // expert TP was TP
  }
  const nlohmann::json layout = layout_summary(config, ps);
  const bool distributed_optimizer = config.parallel.use_distributed_optimizer;
  // The same layout reads this rank's own files (and its generator states); any other reshards.
  // Expert-parallel (or other-expert-TP) checkpoints spread a rank's tensors over two files: read
  // through the table.
  const bool same_layout = state["model"].value("padded_vocab_size", 0) == config.model.padded_vocab_size && saved_layout == layout &&
                           ps.ep.size() == 1 && ps.expert_tp.size() == ps.tp.size();
  if (!same_layout) return load_resharded(dir, state, saved_layout, chunks, optimizer, config, ps);
  {
    SafetensorsFile weights(dir + "/" + checkpoint_file("model", ps, false));
    weights.verify_checksum();
    load_parameters(weights, chunk_parameters(chunks));
  }
  if (config.train.finetune) {
    if (optimizer != nullptr) optimizer->reset_from_model();
    if (ps.rank == 0) std::printf("loaded weights from %s (--finetune: starting at iteration 0)\n", dir.c_str());
    return TrainingProgress();
  }
  if (state.value("weights_only", false) && !config.train.no_load_optim) {
    throw UserError(dir + " holds weights only (converted): load it with --finetune, or --no-load-optim --no-load-rng");
  }
  if (config.train.no_load_optim) {
    if (optimizer != nullptr) optimizer->reset_from_model();
  } else {
    SafetensorsFile optim(dir + "/" + checkpoint_file("optimizer", ps, distributed_optimizer));
    optim.verify_checksum();
    std::vector<NamedTensor> tensors;
    for (const auto& name : optim.names()) tensors.push_back({name, optim.view_floating(name)});
    optimizer_to_load(optimizer).load_state(tensors, /*load_moments=*/true);
  }
  if (!config.train.no_load_rng) {
    const std::string rng_file = dir + "/" + checkpoint_file("rng", ps, distributed_optimizer);
    if (!fs::exists(rng_file)) throw UserError(rng_file + " is missing: resume with the same number of ranks or pass --no-load-rng");
    load_generator_states(rng_file, chunks);
  }
  load_fp8_state(dir, chunks, /*report=*/ps.rank == 0);
  const TrainingProgress progress = resumed_progress(state, config, dir);
  if (ps.rank == 0) {
    std::printf("loaded checkpoint %s (iteration %lld)\n", dir.c_str(), static_cast<long long>(progress.iteration));
  }
  return progress;
}

}  // namespace

std::string checkpoint_directory_to_load(const std::string& load_dir, int64_t ckpt_step) {
  if (ckpt_step < 0) return latest_checkpoint_directory(load_dir);
  const std::string dir = iteration_directory(load_dir, ckpt_step);  // that iteration, whatever the tracker says
  if (fs::is_directory(dir)) return dir;
  std::string saved;
  if (fs::is_directory(load_dir)) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(load_dir)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("iter_", 0) == 0 && name.find(".tmp") == std::string::npos) names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) saved += (saved.empty() ? "" : ", ") + name;
  }
  throw UserError("--ckpt-step " + std::to_string(ckpt_step) + ": " + dir + " does not exist (saved under --load: " +
                  (saved.empty() ? std::string("none") : saved) + ")");
}

std::optional<TrainingProgress> load_checkpoint(const std::string& load_dir, const std::vector<GPTModel*>& chunks,
                                                AdamW* optimizer, const Config& config, const dist::ParallelState& ps) {
  const std::string dir = checkpoint_directory_to_load(load_dir, config.train.ckpt_step);
  if (dir.empty()) {
    // `--save D --load D` resumes whatever is there, and starts from scratch the first time; any
    // other --load must exist: a typo must not restart a run from scratch.
    if (!fs::exists(load_dir) && fs::path(load_dir).lexically_normal() != fs::path(config.train.save).lexically_normal()) {
      throw UserError("--load " + load_dir + ": no such directory; check the path, or drop --load to start from scratch");
    }
    if (fs::exists(fs::path(load_dir) / "config.json")) {
      throw UserError("--load " + load_dir + " holds a Hugging Face model (config.json): start from it with --load-hf " + load_dir);
    }
    if (config.train.exit_on_missing_checkpoint) {
      throw UserError("--load " + load_dir + " holds no checkpoint (no " + std::string(kTracker) + ") and --exit-on-missing-checkpoint is given");
    }
    if (ps.rank == 0) std::printf("WARNING: no %s under --load %s; starting from scratch\n", kTracker, load_dir.c_str());
    return std::nullopt;
  }
  const nlohmann::json state = read_checkpoint_state(dir);
  try {
    return load_checkpoint_directory(dir, state, chunks, optimizer, config, ps);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(dir + "/state.json: a field is missing or of the wrong type (" + e.what() + "): the checkpoint is damaged");
  }
}

}  // namespace megatron
