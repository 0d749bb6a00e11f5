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

#include "checkpoint/fp8_state.h"
#include "checkpoint/hf_config_check.h"
#include "checkpoint/reshard.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_table.h"
#include "core/config_json.h"
#include "core/errors.h"
#include "core/files.h"
#include "core/json_text.h"
#include "model/gpt_model.h"
#include "optim/adamw.h"

namespace megatron {
namespace fs = std::filesystem;
namespace {

constexpr int kFormatVersion = 1;
const char* kTracker = "latest_checkpointed_iteration.txt";

std::vector<at::Generator> generators() {
  std::vector<at::Generator> gens = {at::detail::getDefaultCPUGenerator()};
  // The current device's generator: each rank has its own GPU.
  if (at::hasCUDA()) gens.push_back(at::globalContext().defaultGenerator(at::Device(at::kCUDA)));
  return gens;
}

nlohmann::json model_summary(const ModelConfig& m) {
  nlohmann::json j = {{"num_layers", m.num_layers}, {"hidden_size", m.hidden_size}, {"ffn_hidden_size", m.ffn_hidden_size},
          {"num_attention_heads", m.num_attention_heads}, {"num_query_groups", m.num_query_groups},
          {"kv_channels", m.kv_channels}, {"padded_vocab_size", m.padded_vocab_size},
          {"normalization", m.normalization}, {"swiglu", m.swiglu},
          {"position_embedding_type", m.position_embedding_type},
          {"untie_embeddings_and_output_weights", m.untie_embeddings_and_output_weights}};
  // With experts, what their tensors' shapes and names follow from (dense checkpoints: no keys).
  if (m.num_experts > 0) {
    j["num_experts"] = m.num_experts;
    j["moe_ffn_hidden_size"] = m.moe_ffn_hidden_size;
    j["moe_layers"] = m.moe_layers;
    j["moe_shared_expert_intermediate_size"] = m.moe_shared_expert_intermediate_size;
    if (m.moe_router_enable_expert_bias) j["moe_router_enable_expert_bias"] = true;
  }
  if (m.mtp_num_layers > 0) j["mtp_num_layers"] = m.mtp_num_layers;
  if (m.multi_latent_attention) {
    j["multi_latent_attention"] = true;
    j["q_lora_rank"] = m.q_lora_rank;
    j["kv_lora_rank"] = m.kv_lora_rank;
    j["qk_head_dim"] = m.qk_head_dim;
    j["qk_pos_emb_head_dim"] = m.qk_pos_emb_head_dim;
    j["v_head_dim"] = m.v_head_dim;
  }
  return j;
}

nlohmann::json layout_summary(const ParallelConfig& p, int tp, int pp, int dp) {
  return {{"tensor_model_parallel_size", tp},
          {"pipeline_model_parallel_size", pp},
          {"data_parallel_size", dp},
          {"use_distributed_optimizer", p.use_distributed_optimizer},
          {"num_virtual_stages_per_pipeline_rank", pp > 1 ? p.num_virtual_stages_per_pipeline_rank : 1},
          {"decoder_first_pipeline_num_layers", pp > 1 ? p.decoder_first_pipeline_num_layers : 0},
          {"decoder_last_pipeline_num_layers", pp > 1 ? p.decoder_last_pipeline_num_layers : 0},
          {"expert_model_parallel_size", p.expert_model_parallel_size},
          {"expert_tensor_parallel_size", p.expert_tensor_parallel_size > 0 ? p.expert_tensor_parallel_size : tp}};
}

nlohmann::json layout_summary(const Config& c, const dist::ParallelState& ps) {
  return layout_summary(c.parallel, ps.tp.size(), ps.pp.size(), ps.dp.size());
}

// Every parameter of this rank's chunks under its global name.
std::vector<std::pair<std::string, at::Tensor>> chunk_parameters(const std::vector<GPTModel*>& chunks) {
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (GPTModel* chunk : chunks) {
    for (const auto& p : chunk->named_parameters()) params.emplace_back(p.key(), p.value());
  }
  return params;
}

// What every parameter of this rank's chunks is (a tied embedding's copies are one entry).
tp::ParamTable chunk_table(const std::vector<GPTModel*>& chunks) {
  tp::ParamTable table;
  for (GPTModel* chunk : chunks) table.merge(chunk->parameter_table());
  return table;
}

// Copies the tensors of `file` into `params`, shapes checked.
void load_parameters(const SafetensorsFile& file, const std::vector<std::pair<std::string, at::Tensor>>& params) {
  at::NoGradGuard no_grad;
  for (const auto& [name, param] : params) {
    if (!file.contains(name)) throw UserError(file.path() + " has no tensor '" + name + "' (a checkpoint of another layout or model?)");
    at::Tensor saved = file.view_floating(name);
    if (!saved.sizes().equals(param.sizes())) {
      throw UserError(file.path() + ": tensor '" + name + "' has shape " + c10::str(saved.sizes()) + ", the model expects " +
                      c10::str(param.sizes()));
    }
    at::Tensor(param).copy_(saved);
  }
}

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
  return checkpoint_part_name(kind, ps.tp.rank(), ps.pp.rank(), per_dp ? ps.dp.rank() : -1);
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
  if (ps.dp.rank() == 0) {
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
  if (ps.tp.rank() == 0 && ps.dp.rank() == 0) {
    std::vector<SafetensorsEntry> fp8 = fp8_state_tensors(chunks);
    if (!fp8.empty()) snap.files.push_back({fp8_state_file(ps.pp.rank()), std::move(fp8), {{"format", "megatron.cpp"}}});
  }
  const std::vector<NamedTensor> optimizer_state = config.train.no_save_optim ? std::vector<NamedTensor>() : optimizer.state();
  // The distributed optimizer's files are per DP rank already and hold this rank's shards of both.
  const bool expert_optimizer_files = expert_files && !distributed_optimizer && !config.train.no_save_optim;
  if (!config.train.no_save_optim && (ps.dp.rank() == 0 || distributed_optimizer)) {
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
    auto gens = generators();
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
                             const std::function<void()>& check_before_publish) {
  make_directories(save_dir);
  const std::string final_dir = iteration_directory(save_dir, 0);
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
    nlohmann::json state = state_skeleton(config, TrainingProgress(), layout);
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
  write_file_atomic((fs::path(save_dir) / kTracker).string(), "0\n");
}

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

void load_model_weights(const std::string& dir, GPTModel& model, const dist::ParallelState& ps) {
  SafetensorsFile weights(dir + "/" + checkpoint_file("model", ps, false));
  weights.verify_checksum();
  load_parameters(weights, chunk_parameters({&model}));
}

namespace {

TrainingProgress progress_of(const nlohmann::json& state) {
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
        throw UserError("state.json: \"grad_scaler\" needs a number \"" + std::string(key) + "\"; the checkpoint is damaged");
      }
      return g[key].get<double>();
    };
    progress.grad_scaler = GradScalerState{number("scale"), number("growth_tracker"), number("hysteresis_tracker")};
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
  ShardedCheckpointReader reader(dir, state, chunk_table(chunks));
  const int64_t rows = config.model.padded_vocab_size;
  const tp::TensorParallel& tensor_parallel = chunks.at(0)->tensor_parallel();
  const tp::ParamTable table = chunk_table(chunks);
  // Each rank reads its own shards only (experts: of its expert-TP split).
  for (auto& [name, param] : chunk_parameters(chunks)) {
    const dist::Group& split = tensor_parallel.split_group(table.at(name));
    const at::Tensor value = reader.model(name, rows, split.rank(), split.size());
    if (!value.sizes().equals(param.sizes())) {
      throw UserError(dir + ": parameter '" + name + "' resharded to " + c10::str(value.sizes()) + ", the model expects " +
                      c10::str(param.sizes()));
    }
    param.copy_(value);
  }
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
  return config.train.finetune ? TrainingProgress() : progress_of(state);
}

// The generators' states from `path` (this rank's rng file). A state of another dtype or size
// than PyTorch's generators take is an error naming the file, not an internal one.
void load_generator_states(const std::string& path, const std::vector<GPTModel*>& chunks) {
  SafetensorsFile rng(path);
  rng.verify_checksum();
  auto state = [&](const char* name) { return rng.view_exactly(name, at::kByte, "a generator state").clone(); };
  try {
    auto gens = generators();
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
  const TrainingProgress progress = progress_of(state);
  if (ps.rank == 0) {
    std::printf("loaded checkpoint %s (iteration %lld)\n", dir.c_str(), static_cast<long long>(progress.iteration));
  }
  return progress;
}

}  // namespace

std::optional<TrainingProgress> load_checkpoint(const std::string& load_dir, const std::vector<GPTModel*>& chunks,
                                                AdamW* optimizer, const Config& config, const dist::ParallelState& ps) {
  const std::string dir = latest_checkpoint_directory(load_dir);
  if (dir.empty()) {
    // `--save D --load D` resumes whatever is there, and starts from scratch the first time; any
    // other --load must exist: a typo must not restart a run from scratch.
    if (!fs::exists(load_dir) && fs::path(load_dir).lexically_normal() != fs::path(config.train.save).lexically_normal()) {
      throw UserError("--load " + load_dir + ": no such directory; check the path, or drop --load to start from scratch");
    }
    if (fs::exists(fs::path(load_dir) / "config.json")) {
      throw UserError("--load " + load_dir + " holds a Hugging Face model (config.json): start from it with --load-hf " + load_dir);
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
