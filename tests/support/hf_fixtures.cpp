#include "support/hf_fixtures.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint/safetensors.h"
#include "model/gpt_model.h"
#include "support/test_support.h"

namespace megatron::test {
namespace fs = std::filesystem;

void make_hf_model(const std::string& dir, const std::string& variant, bool bf16, const std::string& tokenizer_dir) {
  const std::string python = venv_python();
  ASSERT_FALSE(python.empty()) << "no reference venv: run scripts/setup.sh or set MEGATRON_VENV";
  auto made = run_command(shell_quote(python) + " " + shell_quote(source_dir() + "/tests/fixtures/make_hf_model.py") + " " +
                          shell_quote(dir) + " " + variant + (bf16 ? " bf16" : "") +
                          (tokenizer_dir.empty() ? "" : " " + shell_quote("tokenizer=" + tokenizer_dir)));
  ASSERT_EQ(made.status, 0) << made.output;
}

void expect_python_checks_pass(const std::string& script, const std::vector<std::string>& args) {
  const std::string python = venv_python();
  ASSERT_FALSE(python.empty()) << "no reference venv: run scripts/setup.sh or set MEGATRON_VENV";
  std::string command = shell_quote(python) + " " + shell_quote(source_dir() + "/tests/" + script);
  for (const std::string& a : args) command += " " + shell_quote(a);
  const auto run = run_command(command);
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("all checks passed"), std::string::npos) << run.output;
}

std::map<std::string, at::Tensor> hf_tensors(const std::string& dir) {
  std::map<std::string, at::Tensor> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".safetensors" || name == "reference.safetensors") continue;
    SafetensorsFile f(entry.path().string());
    for (const auto& t : f.names()) out[t] = f.load(t);
  }
  return out;
}

void expect_bitwise_equal(const std::string& a_dir, const std::string& b_dir) {
  auto a = hf_tensors(a_dir), b = hf_tensors(b_dir);
  ASSERT_EQ(a.size(), b.size()) << a_dir << " vs " << b_dir;
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name << " missing from " << b_dir;
    EXPECT_EQ(t.scalar_type(), b[name].scalar_type()) << name;
    EXPECT_TRUE(at::equal(t, b[name])) << name;
  }
}

void expect_model_matches_reference(GPTModel& model, const std::string& reference_path) {
  SafetensorsFile reference(reference_path);
  const at::Tensor ids = reference.load("input_ids");  // [b, s]
  at::NoGradGuard no_grad;
  const at::Tensor logits = model.forward(ids).transpose(0, 1);  // [b, s, V]
  EXPECT_LE((logits - reference.load("logits")).abs().max().item<double>(), 1e-4) << reference_path;
  // HF's loss shifts labels inside the model; ours takes them shifted.
  const int64_t s = ids.size(1);
  Batch batch{ids.narrow(1, 0, s - 1), ids.narrow(1, 1, s - 1), at::ones({ids.size(0), s - 1})};
  EXPECT_NEAR(model.loss(batch).item<double>(), reference.load("loss").item<double>(), 1e-5) << reference_path;
}

}  // namespace megatron::test
