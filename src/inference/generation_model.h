// What generation needs from a checkpoint, whichever kind it is: the model with its weights,
// the tokenizer, the ids that end a sequence, and how many ids are real (the rest of the output
// layer is Megatron's vocabulary padding). `megatron generate` and the server load through here.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace megatron {

class GPTModel;
class Tokenizer;

struct GenerationModel {
  std::shared_ptr<GPTModel> model;
  std::shared_ptr<Tokenizer> tokenizer;
  std::vector<int64_t> stop_ids;  // EOS: generation_config.json's / config.json's for HF, else the tokenizer's
  int64_t vocab_size = 0;         // candidate ids [0, vocab_size)
  std::string source;             // the directory read, for messages
};

// A native checkpoint directory (as train --save wrote it: the latest iteration, its model and
// tokenizer records). `tokenizer_model` (optional) replaces the recorded tokenizer file.
GenerationModel load_native_for_generation(const std::string& load_dir, const std::string& tokenizer_model, const at::Device& device);

// A Hugging Face model directory (config.json, safetensors, tokenizer.json); `tokenizer_model`
// (optional) is another HF tokenizer file or directory. A directory without any tokenizer is a
// UserError unless `need_tokenizer` is false (token ids in, token ids out).
GenerationModel load_hf_for_generation(const std::string& hf_dir, const std::string& tokenizer_model, const at::Device& device,
                                       bool need_tokenizer = true);

}  // namespace megatron
