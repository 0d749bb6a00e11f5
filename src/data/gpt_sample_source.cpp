// Builds the trainer's GPT sample sources from its options; see gpt_sample_source.h.
#include "data/gpt_sample_source.h"

namespace megatron {

GPTDataOptions gpt_data_options(const Config& c, const std::string& data_cache_path) {
  GPTDataOptions o;
  o.data_path = c.data.data_path;
  o.split_data_path = {c.data.train_data_path, c.data.valid_data_path, c.data.test_data_path};
  o.split = c.data.split;
  o.seq_length = c.model.seq_length;
  o.seed = c.train.seed;
  o.data_cache_path = data_cache_path;
  o.train_iters = c.train.train_iters;
  o.train_samples = c.train.train_samples;
  o.global_batch_size = c.train.global_batch_size;
  o.eval_interval = c.train.eval_interval;
  o.eval_iters = c.train.eval_iters;
  o.skip_train = c.train.skip_train;
  return o;
}

std::unique_ptr<SampleSource> make_gpt_sample_source(const GPTDataOptions& o, Split split) {
  auto sizes = megatron_split_num_samples(o.train_iters, o.global_batch_size, o.eval_interval, o.eval_iters);
  // As Megatron's get_train_valid_test_num_samples: --train-samples sizes the training split
  // itself (the shuffle depends on it), not iterations x global batch.
  if (o.train_samples > 0) sizes[0] = o.train_samples;
  if (o.skip_train) sizes[1] = o.eval_iters * o.global_batch_size;
  GPTDatasetConfig config;
  config.seq_length = o.seq_length;
  config.seed = o.seed;
  config.cache_dir = o.data_cache_path;
  const int64_t num_samples = sizes[static_cast<size_t>(split)];
  auto dataset = o.data_path.empty()
                     ? build_gpt_own_split_dataset(o.split_data_path[static_cast<size_t>(split)], split, num_samples, config)
                     : build_gpt_split_dataset(o.data_path, o.split, split, num_samples, config);
  if (!dataset || dataset->size() == 0) return nullptr;
  return std::make_unique<GPTSampleSource>(std::move(dataset));
}

}  // namespace megatron
