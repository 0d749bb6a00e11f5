// The Hugging Face fixtures the HF tests share: random-weight models from
// tests/fixtures/make_hf_model.py and comparing two HF directories tensor by tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

namespace megatron {
class GPTModel;
}

namespace megatron::test {

// make_hf_model.py DIR VARIANT [bf16] [tokenizer=DIR] with the reference venv (a gtest failure if
// it fails). With `tokenizer_dir` the model's vocabulary is that tokenizer's (a model a server can talk through).
void make_hf_model(const std::string& dir, const std::string& variant, bool bf16 = false, const std::string& tokenizer_dir = "");
// The reference venv's python runs tests/`script` with `args`: a gtest failure unless it exits 0
// having printed "all checks passed" (the scripts that drive real clients and references).
void expect_python_checks_pass(const std::string& script, const std::vector<std::string>& args);
// Every tensor of an HF directory (sharded or not, reference.safetensors left out), by name.
std::map<std::string, at::Tensor> hf_tensors(const std::string& dir);
// The same tensors, dtypes and values in both directories (gtest expectations).
void expect_bitwise_equal(const std::string& a_dir, const std::string& b_dir);
// `model` (fp32, eval) on the input_ids of make_hf_model.py's reference.safetensors gives HF's
// logits (<= 1e-4) and, with labels shifted, HF's loss (<= 1e-5).
void expect_model_matches_reference(GPTModel& model, const std::string& reference_path);

}  // namespace megatron::test
