// Hugging Face <-> Megatron-Core naming and layout for the Llama family (Llama 2/3/3.1, Qwen2/
// 2.5/3, Mistral): config.json -> ModelConfig, and HF safetensors weights into a GPTModel
// (q/k/v fused per query group into linear_qkv, gate/up stacked into linear_fc1).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"

namespace megatron {

class GPTModel;
class SafetensorsFile;
struct ModelFamily;

// All tensors of an HF checkpoint directory (model.safetensors, or the shards its
// model.safetensors.index.json names), memory-mapped, by name. Block-quantised FP8 weights
// (DeepSeek-V3's: float8 e4m3 with a `<name>_scale_inv` of one fp32 scale per block, the block
// as config.json's quantization_config.weight_block_size, 128 x 128 by default) are taken
// dequantised, in fp32. A file that carries a crc32 in its metadata (as `convert --to hf` writes)
// is checked against it before its first tensor is taken.
class HfCheckpointReader {
 public:
  explicit HfCheckpointReader(const std::string& dir);
  bool has(const std::string& name) const;
  at::Tensor take(const std::string& name);  // a view of the mapping (FP8: dequantised); UserError if absent
  // As take(), the shape checked against `expected` (what config.json makes it): a UserError
  // naming the file, tensor and both shapes, never a reshape of the wrong data.
  at::Tensor take(const std::string& name, at::IntArrayRef expected);
  // Tensors under these name prefixes are known and left unused on purpose (an HF checkpoint's
  // multi-token prediction layers, which this model does not have).
  void ignore_prefix(const std::string& prefix) { ignored_.push_back(prefix); }
  // UserError naming the first tensor nothing took (an architecture option we do not map).
  void check_all_used() const;

 private:
  std::string dir_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> by_name_;
  std::set<std::string> used_;
  std::set<const SafetensorsFile*> verified_;  // files whose crc32 (when they carry one) was checked
  std::vector<std::string> ignored_;
  int64_t block_rows_ = 128, block_cols_ = 128;  // FP8 scale blocks
};

// The full (unsplit) Megatron tensor `name` from HF tensors: q/k/v fused per query group,
// fc1 = [gate; up], embedding and output rows padded with zeros to padded_vocab_size. `shape` is
// the full tensor's shape in the model `config` describes: every HF tensor read is checked
// against the part of it that it makes (the embedding's rows against config.json's vocab_size).
at::Tensor megatron_tensor_from_hf(const std::string& name, const ModelConfig& config, HfCheckpointReader& hf,
                                   at::IntArrayRef shape);

// The inverse: the HF tensors of one full Megatron tensor, the first hf_vocab rows of the
// embedding and output layer (padding dropped). Views of `full` where possible.
std::vector<std::pair<std::string, at::Tensor>> hf_tensors_from_megatron(const std::string& name, const at::Tensor& full,
                                                                         const ModelConfig& config, int64_t hf_vocab);

// The HF layers after the decoder that `config` does not build (hf_mtp_layers: multi-token
// prediction) marked as left unread on purpose.
void ignore_unbuilt_hf_layers(HfCheckpointReader& hf, const ModelConfig& config);

// Reads <dir>/config.json through `family` (default: the built-in family of its model_type);
// the result names its family. The vocabulary is not padded (padded_vocab_size = vocab_size)
// so logits line up with HF's. UserError on a missing file or an unsupported architecture.
ModelConfig model_config_from_hf(const std::string& hf_dir, const ModelFamily* family = nullptr);

// `megatron train --load-hf DIR`: the model architecture comes from DIR/config.json (read
// through config.model.family when set). A model flag
// given explicitly that disagrees with it is a UserError naming both values; the sequence length
// defaults to min(max_position_embeddings, 4096) and the tokenizer to DIR's tokenizer.json.
void adopt_hf_architecture(Config& config);

// Copies the weights of an HF directory into `model` (this TP rank's shards). Every model
// parameter must be covered and every HF tensor used; otherwise UserError naming the tensor.
// Multi-token prediction depths the checkpoint has no weights for (HF transformers saves none)
// keep their initialisation: returns how many parameters did.
int64_t load_hf_weights(const std::string& hf_dir, GPTModel& model);
// The chunks of one pipeline rank (each takes the tensors of its own parameters).
int64_t load_hf_weights(const std::string& hf_dir, const std::vector<GPTModel*>& chunks);

}  // namespace megatron
