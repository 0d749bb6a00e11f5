// The model against Hugging Face transformers itself: a small random-weight HF model of each
// family is built by tests/fixtures/make_hf_model.py with the pinned transformers, its weights
// are loaded through the HF mapping, and logits and loss must match HF's (fp32, <= 1e-4). The
// DeepSeek fixtures: V2-Lite-shaped, V3-shaped, and V3 with its weights block-quantised to FP8
// (dequantised on load).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "checkpoint/hf_mapping.h"
#include "checkpoint/safetensors.h"
#include "model/gpt_model.h"
#include "support/test_support.h"

namespace megatron {
namespace {

class HfParity : public ::testing::TestWithParam<std::string> {};

TEST_P(HfParity, LogitsAndLossMatchTransformers) {
  const std::string python = test::venv_python();
  ASSERT_FALSE(python.empty()) << "no reference venv: run scripts/setup.sh or set MEGATRON_VENV";
  test::TempDir dir;
  auto made = test::run_command(test::shell_quote(python) + " " +
                                test::shell_quote(test::source_dir() + "/tests/fixtures/make_hf_model.py") + " " +
                                test::shell_quote(dir.path()) + " " + GetParam());
  ASSERT_EQ(made.status, 0) << made.output;

  ModelConfig config = model_config_from_hf(dir.path());
  GPTModel model(config);
  load_hf_weights(dir.path(), model);
  model.eval();

  SafetensorsFile reference(dir / "reference.safetensors");
  at::Tensor ids = reference.load("input_ids");        // [b, s]
  at::Tensor expected = reference.load("logits");      // [b, s, V]
  at::NoGradGuard no_grad;
  at::Tensor logits = model.forward(ids).transpose(0, 1);  // [b, s, V]
  const double max_diff = (logits - expected).abs().max().item<double>();
  EXPECT_LE(max_diff, 1e-4) << GetParam() << ": max |logits - HF| = " << max_diff;

  // HF's loss shifts labels inside the model; ours takes them shifted.
  const int64_t s = ids.size(1);
  Batch batch{ids.narrow(1, 0, s - 1), ids.narrow(1, 1, s - 1), at::ones({ids.size(0), s - 1})};
  const double loss = model.loss(batch).item<double>();
  EXPECT_NEAR(loss, reference.load("loss").item<double>(), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Families, HfParity,
                         ::testing::Values("llama3", "qwen2", "qwen3", "mistral", "mixtral", "qwen2_moe", "qwen3_moe",
                                           "deepseek_v2", "deepseek_v3", "deepseek_v3_fp8"));

}  // namespace
}  // namespace megatron
