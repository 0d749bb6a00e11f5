#include "checkpoint/hf_export_ranks.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>

#include "checkpoint/hf_export.h"
#include "core/errors.h"
#include "model/gpt_model.h"
#include "pipeline/layout.h"
#include "tensor_parallel/sharding.h"

namespace megatron {

namespace {

// A tensor from `from` to `to` of `group`, shape first (up to 7 dimensions); returns it on `to`.
at::Tensor pass(const at::Tensor& full, const dist::Group& group, int from, int to, const at::Device& device,
                at::ScalarType dtype) {
  at::Tensor header = at::zeros({8}, at::TensorOptions().device(device).dtype(at::kLong));
  if (group.rank() == from) {
    header[0] = full.dim();
    for (int64_t d = 0; d < full.dim(); ++d) header[d + 1] = full.size(d);
    group.send(header, to);
    group.send(full, to);
    return full;
  }
  group.recv(header, from);
  const at::Tensor dims = header.cpu();
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < dims[0].item<int64_t>(); ++d) shape.push_back(dims[d + 1].item<int64_t>());
  at::Tensor out = at::empty(shape, at::TensorOptions().device(device).dtype(dtype));
  group.recv(out, from);
  return out;
}

}  // namespace

// The ranks of DP replica 0 walk the parameter names in the same order, and the first replica of
// every EP rank's experts (expert-DP rank 0) too: a dense tensor is gathered over TP and passed
// to stage 0; an expert is gathered over expert TP on its EP rank, passed to EP rank 0 of its
// stage, then to stage 0 (rank 0 is rank 0 of both layouts).
void export_hf_from_ranks(const std::vector<GPTModel*>& chunks, const Config& c, const dist::ParallelState& ps,
                          const at::Device& device) {
  const auto start = std::chrono::steady_clock::now();
  std::map<std::string, std::pair<at::Tensor, tp::ParamInfo>> params;  // this rank's
  for (GPTModel* chunk : chunks) {
    for (const auto& item : chunk->named_parameters()) params[item.key()] = {item.value(), chunk->parameter_table().at(item.key())};
  }
  at::ScalarType dtype = params.begin()->second.first.scalar_type();  // the model's (bf16 or fp32)
  for (const auto& [name, param] : params) {
    if (!param.second.keep_fp32) {
      dtype = param.first.scalar_type();
      break;
    }
  }
  const tp::ParamTable whole_model = describe_model(c.model);
  const int experts_per_rank = c.model.num_experts > 0 ? c.model.num_experts / ps.ep.size() : 1;
  const ParallelConfig& p = c.parallel;
  auto full_tensor = [&](const std::string& name) -> at::Tensor {
    int owner = 0;
    while (owner < ps.pp.size() && !pipeline::stage_holds(name, p, c.model, owner)) ++owner;
    if (owner == ps.pp.size()) throw UserError("--save-hf: no pipeline stage holds '" + name + "'");
    const int expert = whole_model.contains(name) ? whole_model.at(name).expert : -1;
    // What arrives from another rank comes in the parameter's dtype (an expert bias stays fp32).
    const at::ScalarType arriving = whole_model.contains(name) && whole_model.at(name).keep_fp32 ? at::kFloat : dtype;
    auto local = [&]() -> const std::pair<at::Tensor, tp::ParamInfo>& {
      auto it = params.find(name);
      if (it == params.end()) throw UserError("--save-hf: the model has no parameter '" + name + "'");
      return it->second;
    };
    at::Tensor full;
    if (expert < 0) {
      // Dense: DP replica 0 gathers it over TP on its stage; TP rank 0 passes it to stage 0.
      if (ps.dp_cp.rank() != 0) return {};
      if (ps.pp.rank() == owner) full = tp::gather_full(local().first.detach(), local().second.split, ps.tp).contiguous();
      if (owner != 0 && ps.tp.rank() == 0 && (ps.pp.rank() == owner || ps.pp.rank() == 0)) {
        full = pass(full, ps.pp, owner, 0, device, arriving);
      }
    } else {
      // An expert: its first replica (expert-DP rank 0) gathers it over expert TP on its EP rank,
      // which passes it to EP rank 0 of the stage, which passes it to stage 0.
      if (ps.expert_dp.rank() != 0) return {};
      const int ep_owner = expert / experts_per_rank;
      const bool lead = ps.expert_tp.rank() == 0;
      if (ps.pp.rank() == owner && ps.ep.rank() == ep_owner) {
        full = tp::gather_full(local().first.detach(), local().second.split, ps.expert_tp).contiguous();
      }
      if (ps.pp.rank() == owner && ep_owner != 0 && lead && (ps.ep.rank() == ep_owner || ps.ep.rank() == 0)) {
        full = pass(full, ps.ep, ep_owner, 0, device, arriving);
      }
      if (ps.ep.rank() == 0 && owner != 0 && lead && (ps.pp.rank() == owner || ps.pp.rank() == 0)) {
        full = pass(full, ps.pp, owner, 0, device, arriving);
      }
    }
    return full.defined() ? full.cpu() : full;
  };
  const int64_t hf_vocab = c.model.hf_vocab_size > 0 ? c.model.hf_vocab_size : c.model.vocab_size;
  if (ps.rank == 0) {
    HfExportOptions options;
    if (!c.train.load_hf.empty()) options.config_json = c.train.load_hf + "/config.json";
    const DataConfig& d = c.data;
    if (d.tokenizer_type == "HuggingFaceTokenizer" && !d.tokenizer_model.empty()) {
      options.tokenizer_dir = std::filesystem::is_directory(d.tokenizer_model)
                                  ? d.tokenizer_model
                                  : std::filesystem::path(d.tokenizer_model).parent_path().string();
    }
    save_hf_checkpoint(c.train.save_hf, c.model, hf_vocab, full_tensor, options);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("exported the model to %s (Hugging Face safetensors, %.2f s)\n", c.train.save_hf.c_str(), seconds);
    std::fflush(stdout);
  } else if (ps.dp_cp.rank() == 0 || ps.expert_dp.rank() == 0) {
    // The other ranks of the first replica take part in every gather and transfer rank 0 makes.
    for (const auto& name : whole_model.names()) full_tensor(name);
  }
  ps.world.barrier();
}

}  // namespace megatron
