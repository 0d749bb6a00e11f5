// Generation against HF transformers and against recomputation, on the random tiny HF models of
// make_hf_model.py loaded as `megatron generate --load-hf` loads them:
//   - greedy continuations equal HF `generate`'s token for token (fp32, CPU), each prompt alone and
//     a batch of prompts of different lengths (HF left-pads it), also when the batch is larger
//     than the engine's slots (requests join as others finish);
//   - the logits of every decoding step over the key/value cache equal a full forward over the
//     whole sequence (one sequence, and two of different lengths decoded together).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "inference/engine.h"
#include "inference/generation_model.h"
#include "model/gpt_model.h"
#include "model/kv_cache.h"
#include "support/hf_fixtures.h"
#include "support/test_support.h"

namespace megatron {
namespace {

using Ids = std::vector<int64_t>;

// The prompts: lengths 5, 11 and 8, ids drawn from the vocabulary. The start (20) was chosen
// so that HF's two largest logits differ by more than 1e-3 at every step, for every fixture
// (checked below: a fixture change that narrows it fails loudly instead of flipping a tie).
std::vector<Ids> make_prompts(int64_t vocab) {
  std::vector<Ids> prompts;
  int64_t x = 20;
  for (int length : {5, 11, 8}) {
    Ids p;
    for (int i = 0; i < length; ++i) {
      x = (x * 37 + 11) % vocab;
      p.push_back(x);
    }
    prompts.push_back(p);
  }
  return prompts;
}

std::vector<Ids> greedy(GPTModel& model, int64_t vocab, const std::vector<Ids>& prompts, const Ids& stop_ids, int64_t max_batch,
                        int64_t new_tokens) {
  EngineOptions options;
  options.max_batch = max_batch;
  options.vocab_size = vocab;
  Engine engine(model, options);
  std::vector<GenerationRequest> requests;
  for (const Ids& p : prompts) {
    GenerationRequest r;
    r.prompt = p;
    r.max_new_tokens = new_tokens;
    r.sampling.greedy = true;
    r.stop_ids = stop_ids;
    requests.push_back(r);
  }
  std::vector<Ids> out;
  for (const GenerationResult& r : engine.generate(requests)) out.push_back(r.tokens);
  return out;
}

// max |a - b| of the last-position logits: the cached step's against a full forward.
double recompute_gap(GPTModel& model, const at::Tensor& cached_last, const Ids& sequence) {
  const at::Tensor full = model.forward(at::tensor(sequence, at::kLong).view({1, -1}));  // [s, 1, V]
  return (full[-1][0] - cached_last).abs().max().item<double>();
}

class HfGeneration : public ::testing::TestWithParam<std::string> {};

TEST_P(HfGeneration, GreedyEqualsTransformersAndCachedStepsEqualRecomputation) {
  at::NoGradGuard no_grad;
  test::TempDir dir;
  test::make_hf_model(dir.path(), GetParam());
  GenerationModel g = load_hf_for_generation(dir.path(), "", at::kCPU, /*need_tokenizer=*/false);
  GPTModel& model = *g.model;
  model.eval();
  const std::vector<Ids> prompts = make_prompts(g.vocab_size);
  const int64_t new_tokens = 12;

  // HF's greedy continuations, alone and batched.
  const std::string out = dir / "hf_generate.json";
  const auto hf = test::run_command(test::shell_quote(test::venv_python()) + " " +
                                    test::shell_quote(test::source_dir() + "/tests/fixtures/hf_generate.py") + " " +
                                    test::shell_quote(dir.path()) + " " + test::shell_quote(out) + " " + std::to_string(new_tokens) +
                                    " " + test::shell_quote(nlohmann::json(prompts).dump()));
  ASSERT_EQ(hf.status, 0) << hf.output;
  const nlohmann::json want = nlohmann::json::parse(read_file(out));
  // A gap this wide cannot close by the ~1e-6 our fp32 logits differ from HF's by: a mismatch
  // below is a real difference, not a tie broken the other way.
  ASSERT_GT(want["min_margin"].get<double>(), 1e-4) << "the fixture's logits are too close to tell tokens apart";
  EXPECT_EQ(Ids(want["eos"].get<Ids>()), g.stop_ids) << "EOS read from generation_config.json / config.json";

  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(greedy(model, g.vocab_size, {prompts[i]}, g.stop_ids, 1, new_tokens)[0], want["single"][i].get<Ids>()) << "prompt " << i;
  }
  const std::vector<Ids> batched = greedy(model, g.vocab_size, prompts, g.stop_ids, 3, new_tokens);
  const std::vector<Ids> queued = greedy(model, g.vocab_size, prompts, g.stop_ids, 2, new_tokens);  // the third waits for a slot
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(batched[i], want["batched"][i].get<Ids>()) << "prompt " << i << " in a batch of " << prompts.size();
    EXPECT_EQ(queued[i], want["single"][i].get<Ids>()) << "prompt " << i << " with two slots";
  }

  // Every cached step against recomputing the whole sequence: prompts 0 and 1 prefilled, then
  // decoded together (their lengths differ by 6), each step's logits checked for both.
  KvCache cache(static_cast<int64_t>(model.layers.size()), 2, 64);
  std::vector<Ids> sequences = {prompts[0], prompts[1]};
  Ids next(2);
  for (int64_t slot = 0; slot < 2; ++slot) {
    KvCacheStep prefill(cache, {slot}, static_cast<int64_t>(sequences[slot].size()), at::kCPU);
    const at::Tensor logits = model.forward_cached(at::tensor(sequences[slot], at::kLong).view({1, -1}), prefill)[0][0];  // [V]
    prefill.commit();
    EXPECT_LE(recompute_gap(model, logits, sequences[slot]), 1e-5) << "prefill of prompt " << slot;
    next[slot] = logits.narrow(0, 0, g.vocab_size).argmax().item<int64_t>();
  }
  for (int step = 0; step < 6; ++step) {
    KvCacheStep decode(cache, {0, 1}, 1, at::kCPU);
    const at::Tensor logits = model.forward_cached(at::tensor(next, at::kLong).view({2, 1}), decode)[0];  // [2, V]
    decode.commit();
    for (int64_t j = 0; j < 2; ++j) {
      sequences[j].push_back(next[j]);
      EXPECT_LE(recompute_gap(model, logits[j], sequences[j]), 1e-5) << "sequence " << j << ", decoding step " << step;
      next[j] = logits[j].narrow(0, 0, g.vocab_size).argmax().item<int64_t>();
    }
  }
  EXPECT_EQ(cache.length(0), int64_t(prompts[0].size()) + 6);
  EXPECT_EQ(cache.length(1), int64_t(prompts[1].size()) + 6);
}

// Llama 3 (GQA, Llama 3.1 RoPE scaling), Qwen2 (q/k/v biases), Qwen3 (q/k norms, tied
// embeddings), and the kinds whose caches differ: multi-latent attention with and without a query
// latent (DeepSeek-V2-Lite / V3 shapes: the cache keeps latents, YaRN) and a mixture of experts.
INSTANTIATE_TEST_SUITE_P(Families, HfGeneration,
                         ::testing::Values("llama3", "qwen2", "qwen3", "deepseek_v2", "deepseek_v3", "qwen3_moe"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace megatron
