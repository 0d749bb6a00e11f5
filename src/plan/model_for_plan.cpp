#include "plan/model_for_plan.h"

#include "checkpoint/hf_mapping.h"
#include "core/errors.h"
#include "train/arguments.h"

namespace megatron::plan {

Config model_for_plan(const std::vector<std::string>& train_args) {
  Config config = parse_train_arguments(train_args);
  if (!config.train.load_hf.empty()) {
    adopt_hf_architecture(config);
    config.train.load_hf.clear();
  }
  config.train.load.clear();
  config.train.save.clear();
  config.train.save_hf.clear();
  DataConfig& d = config.data;
  ModelConfig& m = config.model;
  bool given_vocab = config.explicit_flags.count("vocab-size") > 0;
  if (!given_vocab && m.hf_vocab_size > 0 && d.tokenizer_model.empty()) {
    // An HF model's config.json gives its embedding rows: the vocabulary the plan needs.
    d.tokenizer_type = "HuggingFaceTokenizer";
    m.vocab_size = m.hf_vocab_size;
    given_vocab = true;
  }
  if (!d.tokenizer_type.empty() && d.tokenizer_type != "NullTokenizer" && m.extra_vocab_size == 0) {
    // The tokenizer's ids: --vocab-size when given, else its files. NullTokenizer(N) has N + 1.
    int64_t ids = m.vocab_size;
    if (!given_vocab) {
      if (d.tokenizer_model.empty() && d.vocab_file.empty()) {
        throw UserError("plan needs the vocabulary's size: give --vocab-size N (the tokenizer's ids) or the tokenizer's files (--tokenizer-model) "
                        "for --tokenizer-type " + d.tokenizer_type);
      }
      ids = tokenizer_info(tokenizer_spec(d, m.vocab_size)).vocab_size;
    }
    d = DataConfig();
    d.tokenizer_type = "NullTokenizer";
    m.vocab_size = static_cast<int>(ids - 1);
  }
  if (m.vocab_size <= 0) {
    throw UserError("plan needs the vocabulary's size: give --vocab-size N (the tokenizer's ids) or the tokenizer (--tokenizer-type, --tokenizer-model)");
  }
  d.data_path.clear();
  d.train_data_path.clear();
  d.valid_data_path.clear();
  d.test_data_path.clear();
  d.sft = false;
  d.mock_data = true;
  // What a run needs and a plan does not read.
  if (config.train.train_iters == 0 && config.train.train_samples == 0) config.train.train_iters = 1;
  if (!(config.train.lr > 0)) config.train.lr = 1e-4;
  if (config.train.global_batch_size <= 0) {
    throw UserError("plan needs --global-batch-size: it sets the micro-batches a step, which the pipeline's bubble and memory depend on");
  }
  return config;
}

}  // namespace megatron::plan
