#include "support/hf_fixtures.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint/safetensors.h"
#include "support/test_support.h"

namespace megatron::test {
namespace fs = std::filesystem;

void make_hf_model(const std::string& dir, const std::string& variant, bool bf16) {
  const std::string python = venv_python();
  ASSERT_FALSE(python.empty()) << "no reference venv: run scripts/setup.sh or set MEGATRON_VENV";
  auto made = run_command(shell_quote(python) + " " + shell_quote(source_dir() + "/tests/fixtures/make_hf_model.py") + " " +
                          shell_quote(dir) + " " + variant + (bf16 ? " bf16" : ""));
  ASSERT_EQ(made.status, 0) << made.output;
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

}  // namespace megatron::test
