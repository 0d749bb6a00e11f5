#include "moe/moe_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "core/errors.h"

namespace megatron::moe {
namespace {

// A tiny reader of the list expressions Megatron's launch scripts pass: lists of integers,
// `list * int`, `list + list` and parentheses, e.g. ([0]*3+[1]*45) or [1]*4+[0]*2.
class ListExpression {
 public:
  explicit ListExpression(const std::string& text) : s_(text) {}

  std::vector<int> parse() {
    std::vector<int> out = sum();
    skip_spaces();
    if (at_ != s_.size()) fail("unexpected '" + s_.substr(at_, 1) + "'");
    return out;
  }

 private:
  std::vector<int> sum() {
    std::vector<int> out = product();
    while (take('+')) {
      std::vector<int> more = product();
      out.insert(out.end(), more.begin(), more.end());
    }
    return out;
  }
  std::vector<int> product() {
    std::vector<int> out = primary();
    while (take('*')) {
      const int n = integer();
      if (n < 0) fail("a list repeated a negative number of times");
      std::vector<int> repeated;
      for (int i = 0; i < n; ++i) repeated.insert(repeated.end(), out.begin(), out.end());
      out = repeated;
    }
    return out;
  }
  std::vector<int> primary() {
    if (take('(')) {
      std::vector<int> out = sum();
      if (!take(')')) fail("missing ')'");
      return out;
    }
    if (!take('[')) fail("expected a list such as [0,1] or ([0]*1+[1]*47)");
    std::vector<int> out;
    if (take(']')) return out;
    do {
      out.push_back(integer());
    } while (take(','));
    if (!take(']')) fail("missing ']'");
    return out;
  }
  int integer() {
    skip_spaces();
    const size_t start = at_;
    while (at_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[at_]))) ++at_;
    if (start == at_) fail("expected an integer");
    return std::stoi(s_.substr(start, at_ - start));
  }
  bool take(char c) {
    skip_spaces();
    if (at_ < s_.size() && s_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  void skip_spaces() {
    while (at_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[at_]))) ++at_;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw UserError("--moe-layer-freq '" + s_ + "': " + what + " (at character " + std::to_string(at_ + 1) + ")");
  }

  std::string s_;
  size_t at_ = 0;
};

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

[[noreturn]] void bad(const std::string& flag, const std::string& what) { throw UserError("--" + flag + " " + what); }

// Sinkhorn routing has its own weights (sigmoid for top-1, else the softmax over all experts, as
// --moe-router-pre-softmax: Qwen2-MoE's preset keeps it) and its own balance; Megatron ignores the
// routing flags below under it, and asserts a zero coefficient. Given here, they would do
// nothing: said instead.
void check_sinkhorn(const ModelConfig& m) {
  const std::string why = "with --moe-router-load-balancing-type sinkhorn, which ";
  if (m.moe_aux_loss_coeff.front() != 0) bad("moe-aux-loss-coeff", "must be 0 " + why + "balances the routing without a loss");
  if (m.moe_router_score_function != "softmax") bad("moe-router-score-function", "cannot be set " + why + "has its own weights");
  if (m.moe_router_topk_scaling_factor > 0) bad("moe-router-topk-scaling-factor", "cannot be given " + why + "has its own weights");
  if (m.moe_router_num_groups > 0) bad("moe-router-num-groups", "cannot be given " + why + "chooses among all experts");
  if (m.moe_router_enable_expert_bias) bad("moe-router-enable-expert-bias", "cannot be given " + why + "balances by itself");
}

}  // namespace

std::vector<int> parse_moe_layer_freq(const std::string& value, int num_layers) {
  std::vector<int> layers;
  if (all_digits(value)) {
    const int every = std::stoi(value);
    if (every < 1) bad("moe-layer-freq", value + ": must be at least 1 (every N-th layer is an MoE layer)");
    for (int i = 0; i < num_layers; ++i) layers.push_back(i % every == 0 ? 1 : 0);
    return layers;
  }
  layers = ListExpression(value).parse();
  if (int(layers.size()) != num_layers) {
    bad("moe-layer-freq", "'" + value + "' gives " + std::to_string(layers.size()) + " layers, the model has --num-layers " +
                              std::to_string(num_layers) + ": give one 0/1 entry per layer");
  }
  for (int v : layers) {
    if (v != 0 && v != 1) bad("moe-layer-freq", "'" + value + "': entries must be 0 (dense) or 1 (MoE)");
  }
  return layers;
}

void finalize_moe_config(ModelConfig& m, ParallelConfig& p, int world_size) {
  const int tp = p.tensor_model_parallel_size, ep = p.expert_model_parallel_size;
  if (m.num_experts < 0) bad("num-experts", "must be positive (got " + std::to_string(m.num_experts) + ")");
  if (m.num_experts == 0) {
    if (ep > 1) bad("expert-model-parallel-size", std::to_string(ep) + " needs mixture-of-experts layers: set --num-experts");
    if (p.expert_tensor_parallel_size > 1) bad("expert-tensor-parallel-size", "needs mixture-of-experts layers: set --num-experts");
    p.expert_tensor_parallel_size = tp;
    m.moe_layers.clear();
    return;
  }
  m.moe_layers = parse_moe_layer_freq(m.moe_layer_freq, m.num_layers);
  if (m.moe_ffn_hidden_size == 0) m.moe_ffn_hidden_size = m.ffn_hidden_size;
  if (m.moe_ffn_hidden_size <= 0) bad("moe-ffn-hidden-size", "is required with --num-experts (or --ffn-hidden-size)");
  if (m.moe_router_topk < 1 || m.moe_router_topk > m.num_experts) {
    bad("moe-router-topk", std::to_string(m.moe_router_topk) + " must be between 1 and --num-experts " + std::to_string(m.num_experts));
  }
  if (m.moe_router_score_function != "softmax" && m.moe_router_score_function != "sigmoid") {
    bad("moe-router-score-function", "must be softmax or sigmoid (got '" + m.moe_router_score_function + "')");
  }
  // --moe-router-pre-softmax with sigmoid scores: Megatron's routing ignores it (finalize_config
  // says so and clears it).
  if (!m.moe_router_dtype.empty() && m.moe_router_dtype != "fp32" && m.moe_router_dtype != "fp64") {
    bad("moe-router-dtype", "must be fp32 or fp64 (got '" + m.moe_router_dtype + "')");
  }
  if (m.moe_router_enable_expert_bias && m.moe_router_score_function != "sigmoid") {
    bad("moe-router-enable-expert-bias", "needs --moe-router-score-function sigmoid (as Megatron)");
  }
  if (!(m.moe_router_bias_update_rate >= 0.0) || !std::isfinite(m.moe_router_bias_update_rate)) {
    bad("moe-router-bias-update-rate", "must be finite and >= 0");
  }
  const int groups = m.moe_router_num_groups, group_topk = m.moe_router_group_topk;
  if ((groups > 0) != (group_topk > 0) || groups < 0 || group_topk < 0) {
    bad("moe-router-num-groups", "and --moe-router-group-topk go together, both positive (group-limited routing)");
  }
  if (groups > 0) {
    const int k = m.moe_router_topk;
    if (m.num_experts % groups != 0) {
      bad("moe-router-num-groups", std::to_string(groups) + " does not divide --num-experts " + std::to_string(m.num_experts));
    }
    if (group_topk > groups) {
      bad("moe-router-group-topk", std::to_string(group_topk) + " is above --moe-router-num-groups " + std::to_string(groups));
    }
    if (group_topk > k || k / group_topk > m.num_experts / groups) {
      bad("moe-router-group-topk", std::to_string(group_topk) + ": each group is scored by its top --moe-router-topk / " +
                                       "--moe-router-group-topk experts, which must be between 1 and the experts of a group");
    }
    if (k > group_topk * (m.num_experts / groups)) {
      bad("moe-router-topk", std::to_string(k) + " is more than the experts of --moe-router-group-topk groups");
    }
  }
  const std::vector<std::string>& types = m.moe_router_load_balancing_type;
  if (types.empty()) bad("moe-router-load-balancing-type", "needs a type: aux_loss, seq_aux_loss, global_aux_loss, sinkhorn or none");
  for (size_t i = 0; i < types.size(); ++i) {
    const std::string& lb = types[i];
    if (lb != "aux_loss" && lb != "seq_aux_loss" && lb != "global_aux_loss" && lb != "sinkhorn" && lb != "none") {
      bad("moe-router-load-balancing-type", "must be aux_loss, seq_aux_loss, global_aux_loss, sinkhorn or none (got '" + lb + "')");
    }
    if (lb == "sinkhorn" && types.size() > 1) bad("moe-router-load-balancing-type", "sinkhorn routes by itself: give it alone");
    if (std::find(types.begin(), types.begin() + long(i), lb) != types.begin() + long(i)) {
      bad("moe-router-load-balancing-type", "names " + lb + " twice");
    }
  }
  if (m.moe_aux_loss_coeff.size() != types.size()) {
    bad("moe-aux-loss-coeff", "gives " + std::to_string(m.moe_aux_loss_coeff.size()) + " coefficient(s) for " +
                                  std::to_string(types.size()) + " --moe-router-load-balancing-type(s): give one per type");
  }
  if (m.routes_by_sinkhorn()) check_sinkhorn(m);
  if (m.moe_expert_capacity_factor < 0) bad("moe-expert-capacity-factor", "must be positive (or left out: dropless)");
  if (m.moe_token_drop_policy != "probs" && m.moe_token_drop_policy != "position") {
    bad("moe-token-drop-policy", "must be probs or position (got '" + m.moe_token_drop_policy + "')");
  }
  if (m.moe_pad_expert_input_to_capacity && m.moe_expert_capacity_factor == 0) {
    bad("moe-pad-expert-input-to-capacity", "needs --moe-expert-capacity-factor (the capacity it pads to)");
  }
  for (double coeff : m.moe_aux_loss_coeff) {
    if (coeff < 0) bad("moe-aux-loss-coeff", "must be >= 0");
  }
  if (m.moe_z_loss_coeff < 0) bad("moe-z-loss-coeff", "must be >= 0");
  if (m.moe_shared_expert_intermediate_size < 0) bad("moe-shared-expert-intermediate-size", "must be >= 0");
  if (m.moe_shared_expert_gate && m.moe_shared_expert_intermediate_size == 0) {
    bad("moe-shared-expert-gate", "needs shared experts: set --moe-shared-expert-intermediate-size");
  }
  if (m.moe_shared_expert_overlap && m.moe_token_dispatcher_type != "alltoall") {
    bad("moe-shared-expert-overlap", "works with --moe-token-dispatcher-type alltoall only (as Megatron)");
  }
  if (m.moe_token_dispatcher_type != "allgather" && m.moe_token_dispatcher_type != "alltoall") {
    bad("moe-token-dispatcher-type", "must be allgather or alltoall (got '" + m.moe_token_dispatcher_type + "'; flex is not supported)");
  }
  if (!m.swiglu) bad("num-experts", "needs --swiglu experts (every supported MoE family uses SwiGLU)");
  if (ep < 1) bad("expert-model-parallel-size", "must be at least 1");
  if (m.num_experts % ep != 0) {
    bad("expert-model-parallel-size", std::to_string(ep) + " does not divide --num-experts " + std::to_string(m.num_experts) +
                                          ": each expert-parallel rank holds the same number of experts");
  }
  if (p.expert_tensor_parallel_size == 0) p.expert_tensor_parallel_size = tp;
  const int etp = p.expert_tensor_parallel_size;
  if (etp < 1) bad("expert-tensor-parallel-size", "must be at least 1");
  // One pipeline stage's ranks (tp x cp x dp) laid out again as expert TP x EP x expert DP.
  const int stage_ranks = world_size / p.pipeline_model_parallel_size;
  if (stage_ranks % (etp * ep) != 0) {
    const std::string layout = "expert TP " + std::to_string(etp) + " x EP " + std::to_string(ep);
    bad(etp != tp ? "expert-tensor-parallel-size" : "expert-model-parallel-size",
        std::to_string(etp != tp ? etp : ep) + ": " + layout + " must divide the " + std::to_string(stage_ranks) +
            " ranks of a pipeline stage (tensor x context x data parallel), as in Megatron");
  }
  if (tp > 1 && !p.sequence_parallel) {
    bad("tensor-model-parallel-size", std::to_string(tp) + " with MoE layers needs --sequence-parallel (as Megatron)");
  }
  if (m.moe_ffn_hidden_size % etp != 0) {
    bad("moe-ffn-hidden-size", std::to_string(m.moe_ffn_hidden_size) + " is not divisible by the expert tensor-parallel size " +
                                   std::to_string(etp) + " (--expert-tensor-parallel-size, by default the TP size)");
  }
  if (m.moe_shared_expert_intermediate_size % tp != 0) {
    bad("moe-shared-expert-intermediate-size", "is not divisible by --tensor-model-parallel-size " + std::to_string(tp));
  }
}

std::string route_reads_host(const ModelConfig& m, bool bf16) {
  if (!m.moe_grouped_gemm) return "the experts' loop reads each expert's token count on the host (drop --no-moe-grouped-gemm)";
  if (!bf16) return "the grouped GEMM outside bf16 falls back to a per-expert loop that reads the group ends on the host (add --bf16)";
  if (m.moe_expert_capacity_factor > 0 && !m.moe_pad_expert_input_to_capacity) {
    return "--moe-expert-capacity-factor finds the kept tokens on the host (add --moe-pad-expert-input-to-capacity)";
  }
  if (!m.fp8.empty()) return "--fp8-format: the experts' FP8 grouped GEMMs read the group sizes on the host";
  return "";
}

std::string describe_moe(const ModelConfig& m) {
  if (m.num_experts == 0) return "";
  std::string out = "> mixture of experts: " + std::to_string(m.num_moe_layers()) + " of " + std::to_string(m.num_layers) +
                    " layers, " + std::to_string(m.num_experts) + " experts (top-" + std::to_string(m.moe_router_topk) +
                    "), expert ffn " + std::to_string(m.moe_ffn_hidden_size);
  if (m.moe_shared_expert_intermediate_size > 0) {
    out += ", shared experts " + std::to_string(m.moe_shared_expert_intermediate_size);
    if (m.moe_shared_expert_overlap) out += " (overlapped on a stream of their own on the GPU)";
  }
  out += ", " + m.moe_token_dispatcher_type + " dispatcher";
  if (m.moe_grouped_gemm) out += ", grouped GEMM";
  if (m.moe_expert_capacity_factor > 0) {
    char capacity[96];
    std::snprintf(capacity, sizeof(capacity), ", capacity factor %g (%s)", m.moe_expert_capacity_factor, m.moe_token_drop_policy.c_str());
    out += capacity;
    if (m.moe_pad_expert_input_to_capacity) out += ", padded to capacity";
  }
  if (m.moe_permute_fusion) out += ", fused permutation (CUDA kernels on the GPU)";
  out += "\n";
  if (m.moe_router_num_groups > 0) {
    out += "> routing: experts in " + std::to_string(m.moe_router_num_groups) + " groups, each token's from its best " +
           std::to_string(m.moe_router_group_topk) + "\n";
  }
  if (m.moe_router_enable_expert_bias) {
    char rate[64];
    std::snprintf(rate, sizeof(rate), "%g", m.moe_router_bias_update_rate);
    out += std::string("> expert bias (auxiliary-loss-free balancing), updated by ") + rate + " per step\n";
  }
  if (m.hf_mtp_layers > m.mtp_num_layers) {
    out += "> config.json names " + std::to_string(m.hf_mtp_layers) + " multi-token prediction layer(s) (num_nextn_predict_layers); " +
           "this run builds " + std::to_string(m.mtp_num_layers) + " (--mtp-num-layers): the others' weights are not loaded\n";
  }
  return out;
}

}  // namespace megatron::moe
