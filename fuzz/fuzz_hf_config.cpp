// A HF config.json read into a model configuration as `convert --from hf` and `train --load-hf`
// read it (the family from model_type, every field's JSON type and range, the sizes' arithmetic),
// then, for configurations small enough to build quickly, the model built on the meta device
// (shapes only): any configuration that is accepted must build.
#include <ATen/ATen.h>

#include <fstream>

#include "checkpoint/hf_mapping.h"
#include "core/errors.h"
#include "fuzz_target.h"
#include "model/gpt_model.h"

MEGATRON_FUZZ_TARGET(hf_config) {
  const std::string config = megatron::fuzz::scratch_file("config.json");
  const std::string dir = config.substr(0, config.rfind('/'));
  std::ofstream(config, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), std::streamsize(size));
  megatron::ModelConfig m;
  try {
    m = megatron::model_config_from_hf(dir);
  } catch (const megatron::UserError& e) {
    megatron::fuzz::rejected(e);
    return;
  }
  if (m.num_layers > 4 || m.num_experts > 64 || m.vocab_size > (1 << 20)) return;
  m.hf_vocab_size = m.vocab_size;
  m.padded_vocab_size = static_cast<int>(m.vocab_size);
  try {
    const megatron::GPTModel shapes(m, {}, std::nullopt, std::nullopt, at::kMeta);
    (void)shapes.named_parameters();
  } catch (const megatron::UserError& e) {
    megatron::fuzz::rejected(e);
  }
}
