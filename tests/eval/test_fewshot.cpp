// Few-shot examples as lm-evaluation-harness picks them (eval/fewshot.h, eval/python_random.h):
//   - random.Random(seed).sample as CPython draws it, checked against the venv's Python for both of
//     sample's methods (a shrinking pool for small populations, retried draws for large ones),
//     negative and wide seeds, and successive draws from one generator;
//   - the samplers as lm-eval 0.4.13's ContextSampler and FirstNSampler pick, documents in order,
//     with the evaluated split as its own few-shot split (duplicates of a document included, which
//     make lm-eval draw again) and without.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/errors.h"
#include "eval/fewshot.h"
#include "eval/python_random.h"
#include "support/test_support.h"

namespace megatron {
namespace {

nlohmann::json python_json(const test::TempDir& dir, const std::string& script) {
  const std::string path = dir / "script.py";
  std::ofstream(path) << script;
  const test::CommandResult r = test::run_command(test::shell_quote(test::venv_python()) + " " + test::shell_quote(path) + " 2>&1");
  EXPECT_EQ(r.status, 0) << r.output;
  return nlohmann::json::parse(r.output.substr(r.output.find_last_of('\n', r.output.size() - 2) + 1));
}

TEST(EvalFewshot, PythonRandomSamplesAsCPython) {
  test::TempDir dir;
  // Each case: a seed, then the (n, k) of successive samples from one generator.
  const std::vector<std::pair<int64_t, std::vector<std::pair<size_t, size_t>>>> cases = {
      {1234, {{10, 3}, {10, 3}, {4, 1}, {1, 1}, {21, 5}, {22, 5}}},  // the pool method (n <= 21 for k <= 5)
      {1234, {{7473, 5}, {7473, 6}, {60, 6}, {61, 6}, {200, 30}}},   // retried draws; k > 5 widens the pool bound
      {0, {{5, 5}, {100, 2}}},
      {-77, {{9, 4}}},
      {(int64_t(1) << 40) + 3, {{1000, 8}, {3, 2}}},                  // a seed of two 32-bit words
  };
  std::ostringstream script;
  script << "import json, random\nout = []\n";
  for (const auto& [seed, draws] : cases) {
    script << "r = random.Random(" << seed << ")\n";
    for (const auto& [n, k] : draws) script << "out.append(r.sample(range(" << n << "), " << k << "))\n";
  }
  script << "print(json.dumps(out))\n";
  const nlohmann::json want = python_json(dir, script.str());
  size_t i = 0;
  for (const auto& [seed, draws] : cases) {
    eval::PythonRandom random(seed);
    for (const auto& [n, k] : draws) {
      ASSERT_LT(i, want.size());
      EXPECT_EQ(random.sample(n, k), want[i].get<std::vector<size_t>>()) << "seed " << seed << ", sample(range(" << n << "), " << k << ")";
      ++i;
    }
  }
  EXPECT_EQ(i, want.size());
  EXPECT_THROW(eval::PythonRandom(1).sample(3, 4), std::invalid_argument);
}

// lm-eval's samplers over a split of documents whose values repeat (value = index % 7): which
// examples each evaluated document gets, in order.
TEST(EvalFewshot, DrawsAsLmEvalsSamplers) {
  test::TempDir dir;
  const size_t split = 30;
  auto value = [](size_t i) { return int64_t(i % 7); };
  const std::string script = R"(import json
from lm_eval.api.samplers import ContextSampler, FirstNSampler
df = [{"v": i % 7} for i in range(30)]
out = {}
for name, cls in (("default", ContextSampler), ("first_n", FirstNSampler)):
    for same in (True, False):
        for shots in (1, 3, 5):
            s = cls(df, rnd=1234)
            s.set_rnd(1234)
            picks = []
            for doc in range(12):
                ex = s.sample(shots, eval_doc=df[doc] if same else None)
                picks.append([x["v"] for x in ex])
            out[f"{name} {same} {shots}"] = picks
print(json.dumps(out))
)";
  const nlohmann::json want = python_json(dir, script);
  for (const eval::FewshotSampler sampler : {eval::FewshotSampler::Default, eval::FewshotSampler::FirstN}) {
    for (const bool same : {true, false}) {
      for (const int64_t shots : {1, 3, 5}) {
        const std::string key = eval::fewshot_sampler_name(sampler) + (same ? " True " : " False ") + std::to_string(shots);
        eval::FewshotDraw draw(sampler, split, shots, 1234);
        for (size_t doc = 0; doc < 12; ++doc) {
          std::function<bool(size_t)> is_doc;
          if (same) is_doc = [&](size_t i) { return value(i) == value(doc); };
          std::vector<int64_t> got;
          for (size_t i : draw.next(is_doc)) got.push_back(value(i));
          // lm-eval returns the documents, which repeat: compare their values.
          EXPECT_EQ(got, want.at(key).at(doc).get<std::vector<int64_t>>()) << key << ", document " << doc;
        }
      }
    }
  }
}

TEST(EvalFewshot, TooSmallASplitIsAClearError) {
  eval::FewshotDraw draw(eval::FewshotSampler::Default, 3, 3, 1234);
  // The split is the evaluated one: lm-eval draws num_fewshot + 1 = 4 of 3.
  try {
    draw.next([](size_t i) { return i == 0; });
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("fewer than --num-fewshot 3"), std::string::npos) << e.what();
  }
  EXPECT_EQ(eval::FewshotDraw(eval::FewshotSampler::Default, 3, 3, 1234).next(nullptr).size(), 3u);
  EXPECT_THROW(eval::parse_fewshot_sampler("random"), UserError);
  EXPECT_EQ(eval::lm_eval_sampler(eval::TaskFormat::Mmlu), eval::FewshotSampler::FirstN);
  EXPECT_EQ(eval::lm_eval_sampler(eval::TaskFormat::Gsm8k), eval::FewshotSampler::Default);
}

}  // namespace
}  // namespace megatron
