// The router's pieces against their definitions written out here: token dropping under both
// policies (Megatron's apply_router_token_dropping: per expert the `capacity` highest weights, or
// the first tokens), the balancing and z losses against their formulas, and the global balancing
// loss's counts averaged over a step's micro-batches.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>

#include "model/layer_spec.h"
#include "moe/aux_loss.h"
#include "moe/router.h"
#include "support/test_support.h"

namespace megatron {
namespace {

// The pairs each policy keeps, by a plain loop over every expert's tokens.
at::Tensor reference_kept(const at::Tensor& probs, const at::Tensor& indices, int E, double factor, bool by_probs) {
  const int64_t T = probs.size(0), k = probs.size(1);
  const int64_t capacity = int64_t(std::ceil(double(T * k) / E * factor));
  at::Tensor kept = at::zeros({T, k}, at::kBool);
  for (int e = 0; e < E; ++e) {
    std::vector<std::pair<int64_t, int64_t>> pairs;  // (token, choice) routed to e
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        if (indices[t][j].item<int64_t>() == e) pairs.emplace_back(t, j);
      }
    }
    if (by_probs) {
      using Pair = std::pair<int64_t, int64_t>;
      std::stable_sort(pairs.begin(), pairs.end(), [&](const Pair& a, const Pair& b) {
        return probs[a.first][a.second].item<float>() > probs[b.first][b.second].item<float>();
      });
    }
    for (size_t i = 0; i < pairs.size() && int64_t(i) < capacity; ++i) kept[pairs[i].first][pairs[i].second] = true;
  }
  return kept;
}

TEST(MoeRouter, TokenDroppingKeepsWhatMegatronKeeps) {
  at::manual_seed(3);
  const int E = 8;
  const at::Tensor logits = at::randn({64, E}) * 2;
  at::Tensor top, indices;
  std::tie(top, indices) = logits.topk(2, 1);
  const at::Tensor probs = at::softmax(top, -1);
  for (const bool by_probs : {true, false}) {
    for (const double factor : {0.5, 1.0, 1.5}) {
      const at::Tensor kept = moe::within_capacity(probs, indices, E, factor, by_probs ? "probs" : "position");
      const at::Tensor expected = reference_kept(probs, indices, E, factor, by_probs);
      EXPECT_TRUE(at::equal(kept, expected)) << (by_probs ? "probs" : "position") << " factor " << factor;
      if (factor == 0.5) EXPECT_LT(kept.sum().item<int64_t>(), 128) << "nothing dropped at factor 0.5";
    }
  }
  // A capacity of at least every token: nothing to drop.
  EXPECT_TRUE(moe::within_capacity(probs, indices, E, 100.0, "probs").all().item<bool>());
}

TEST(MoeRouter, BalancingAndZLossFollowTheirFormulas) {
  at::manual_seed(4);
  const int64_t T = 32, E = 4, k = 2;
  const at::Tensor logits = at::randn({T, E});
  const at::Tensor scores = at::softmax(logits, -1);
  const at::Tensor chosen = std::get<1>(scores.topk(k, 1));
  const at::Tensor counts = at::zeros({T, E}).scatter_(1, chosen, 1.0).sum(0);
  double expected = 0;
  for (int64_t i = 0; i < E; ++i) expected += scores.select(1, i).sum().item<double>() * counts[i].item<double>();
  expected *= double(E) * 0.01 / (double(k) * T * T);
  EXPECT_NEAR(moe::switch_load_balancing_loss(scores, counts, T, int(k), int(E), 0.01).item<double>(), expected, 1e-7);
  double z = 0;
  for (int64_t t = 0; t < T; ++t) z += std::pow(std::log(logits[t].exp().sum().item<double>()), 2);
  EXPECT_NEAR(moe::z_loss(logits, 0.001).item<double>(), 0.001 * z / T, 1e-7);
  // Perfect balance and uniform scores: Megatron's loss is exactly the coefficient.
  const at::Tensor uniform = at::full({T, E}, 1.0 / E);
  EXPECT_NEAR(moe::switch_load_balancing_loss(uniform, at::full({E}, double(T * k / E)), T, int(k), int(E), 0.01).item<double>(),
              0.01, 1e-9);
}

// global_aux_loss (Megatron's _apply_global_aux_loss): micro-batch m of a step uses the expert
// counts averaged over micro-batches 1..m; the next step starts afresh. aux_loss beside it uses
// each micro-batch's own counts. take_tracked() returns the sums of loss / coeff.
TEST(MoeRouter, GlobalAuxLossAveragesCountsOverTheStepsMicroBatches) {
  at::manual_seed(5);
  ModelConfig c;
  c.hidden_size = 16;
  c.num_layers = 1;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_layers = {1};
  c.moe_router_load_balancing_type = {"global_aux_loss", "aux_loss"};
  c.moe_aux_loss_coeff = {0.02, 0.01};
  ASSERT_EQ(moe::tracked_loss_names(c), (std::vector<std::string>{"load_balancing_loss", "global_load_balancing_loss"}));
  const tp::TensorParallel tp;
  moe::TopKRouter router(PartContext{c, tp, at::kCPU, false, 0});
  {
    at::NoGradGuard no_grad;
    router.weight.normal_(0, 0.5);
  }
  router.train();
  const int64_t T = 24, E = 4, k = 2;
  for (int step = 0; step < 2; ++step) {
    at::Tensor counts_so_far = at::zeros({E});
    double want_aux = 0, want_global = 0;
    for (int m = 1; m <= 3; ++m) {
      const at::Tensor tokens = at::randn({T, 16});
      router.forward(tokens, 1);
      const at::Tensor scores = at::softmax(at::linear(tokens, router.weight.detach()), -1);
      const at::Tensor counts = at::zeros({T, E}).scatter_(1, std::get<1>(scores.topk(k, 1)), 1.0).sum(0);
      counts_so_far += counts;
      want_aux += moe::switch_load_balancing_loss(scores, counts, T, int(k), int(E), 0.01).item<double>() / 0.01;
      want_global += moe::switch_load_balancing_loss(scores, counts_so_far / double(m), T, int(k), int(E), 0.02).item<double>() / 0.02;
    }
    const at::Tensor tracked = router.take_tracked();
    ASSERT_EQ(tracked.numel(), 2);
    EXPECT_NEAR(tracked[0].item<double>(), want_aux, 1e-5 * want_aux) << "step " << step;
    EXPECT_NEAR(tracked[1].item<double>(), want_global, 1e-5 * want_global) << "step " << step;
  }
}

// --moe-router-load-balancing-type sinkhorn through the router, against Megatron-Core's own method
// run in Python on the same logits: in training the experts of sinkhorn's balanced assignment,
// at inference the plain top-k, each with sigmoid (top-1) or all-expert softmax (top-2) weights.
// The logits lean hard towards expert 0, so balancing changes the choice.
TEST(MoeRouter, SinkhornRoutesAsMegatronCore) {
  const std::string python = test::venv_python();
  ASSERT_FALSE(python.empty()) << "no reference venv: run scripts/setup.sh";
  at::manual_seed(6);
  const int64_t T = 48, E = 4, h = 16;
  at::Tensor tokens = at::randn({T, h});
  tokens.select(1, 0).add_(3.0);
  test::TempDir dir;
  struct Case {
    int64_t k;
    bool training;
    std::string name() const { return "k" + std::to_string(k) + (training ? " training" : " inference"); }
    std::string file() const { return "k" + std::to_string(k) + (training ? "_training" : "_inference") + ".bin"; }
  };
  const std::vector<Case> cases = {{1, true}, {1, false}, {2, true}, {2, false}};
  auto router_for = [&](int64_t k) {
    ModelConfig c;
    c.hidden_size = h;
    c.num_layers = 1;
    c.num_experts = E;
    c.moe_router_topk = k;
    c.moe_layers = {1};
    c.moe_router_load_balancing_type = {"sinkhorn"};
    c.moe_aux_loss_coeff = {0.0};
    auto router = std::make_unique<moe::TopKRouter>(PartContext{c, tp::TensorParallel(), at::kCPU, false, 0});
    at::NoGradGuard no_grad;
    at::manual_seed(7 + k);
    router->weight.normal_(0, 0.5);
    router->weight[0][0].add_(2.0);  // expert 0 wins most tokens' plain top-k
    return router;
  };
  // Their scores, all cases in one run.
  std::string command = test::shell_quote(python) + " " + test::shell_quote(test::source_dir() + "/tests/moe/megatron_sinkhorn.py");
  for (const int64_t k : {1, 2}) {
    const at::Tensor logits = at::linear(tokens, router_for(k)->weight).detach().contiguous();  // [T, E]
    const std::string logits_file = dir / ("logits_k" + std::to_string(k) + ".bin");
    std::ofstream(logits_file, std::ios::binary).write(static_cast<const char*>(logits.data_ptr()), logits.nbytes());
    for (const Case& c : cases) {
      if (c.k != k) continue;
      command += " " + logits_file + "," + (dir / c.file()) + "," + std::to_string(T) + "," + std::to_string(E) + "," +
                 std::to_string(k) + (c.training ? ",1" : ",0");
    }
  }
  const auto r = test::run_command(command);
  ASSERT_EQ(r.status, 0) << r.output;

  for (const Case& c : cases) {
    at::Tensor theirs = at::empty({T, E});
    std::ifstream(dir / c.file(), std::ios::binary).read(static_cast<char*>(theirs.data_ptr()), theirs.nbytes());
    auto router = router_for(c.k);
    if (c.training) router->train();
    else router->eval();
    const moe::Routing routing = router->forward(tokens, 1);
    const at::Tensor ours = at::zeros({T, E}).scatter_(1, routing.indices, routing.probs.detach().to(at::kFloat));
    EXPECT_TRUE(at::equal(ours != 0, theirs != 0)) << c.name() << ": other experts chosen\n" << ours << theirs;
    EXPECT_TRUE(at::allclose(ours, theirs, 1e-6, 1e-7)) << c.name();
    // What the balancing does: plain top-k sends nearly every token to expert 0, sinkhorn's
    // choice spreads them.
    const at::Tensor per_expert = (ours != 0).sum(0);
    if (c.training) {
      EXPECT_LE(per_expert.max().item<int64_t>(), T * c.k / E + T / 4) << c.name() << ": not balanced " << per_expert;
    } else {
      EXPECT_GE(per_expert[0].item<int64_t>(), T * 7 / 8) << c.name() << ": the logits do not lean as meant " << per_expert;
    }
  }
}

}  // namespace
}  // namespace megatron
