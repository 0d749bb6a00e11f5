// The Hugging Face fixtures the HF tests share: random-weight models from
// tests/fixtures/make_hf_model.py and comparing two HF directories tensor by tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace megatron::test {

// make_hf_model.py DIR VARIANT [bf16] with the reference venv (a gtest failure if it fails).
void make_hf_model(const std::string& dir, const std::string& variant, bool bf16 = false);
// Every tensor of an HF directory (sharded or not, reference.safetensors left out), by name.
std::map<std::string, at::Tensor> hf_tensors(const std::string& dir);
// The same tensors, dtypes and values in both directories (gtest expectations).
void expect_bitwise_equal(const std::string& a_dir, const std::string& b_dir);

}  // namespace megatron::test
