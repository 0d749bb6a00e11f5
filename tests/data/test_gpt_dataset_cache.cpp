// GPTDataset / BlendedDataset behaviour that needs no reference: the index cache (reuse, atomic
// writes, damaged files rebuilt, unwritable directories refused), user errors, argument parsing,
// the ltor masks on a hand-made sample, and the GPTSampleSource wrapper.
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/errors.h"
#include "data/blended_dataset.h"
#include "data/gpt_dataset.h"
#include "data/gpt_sample_source.h"
#include "data/indexed_dataset.h"
#include "data/ltor_masks.h"
#include "reference_python.h"

namespace megatron {
namespace {

class GPTDatasetCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = reference::make_temp_dir("gpt_dataset_cache_test");
    ASSERT_FALSE(dir_.empty());
    write(dir_ + "/data", 300, 1);
    write(dir_ + "/other", 200, 2);
  }
  void TearDown() override { reference::remove_tree(dir_); }

  static void write(const std::string& prefix, int docs, int64_t salt) {
    IndexedDatasetBuilder b(prefix, TokenDType::kUInt16);
    for (int d = 0; d < docs; ++d) {
      std::vector<int64_t> doc;
      for (int i = 0; i < 5 + (d * 7 + salt) % 23; ++i) doc.push_back(1 + (d * 31 + i * 17 + salt) % 900);
      doc.push_back(0);
      b.add_document(doc.data(), doc.size());
    }
    b.finalize();
  }

  // The trainer's options over data/: 10 iterations of 4 samples, evaluated every 5 for 2.
  GPTDataOptions options(const std::string& split) const {
    GPTDataOptions o;
    o.data_path = {dir_ + "/data"};
    o.split = split;
    o.seq_length = 16;
    o.data_cache_path = dir_ + "/cache";
    o.train_iters = 10;
    o.global_batch_size = 4;
    o.eval_interval = 5;
    o.eval_iters = 2;
    return o;
  }

  GPTDatasetConfig config() const {
    GPTDatasetConfig c;
    c.seq_length = 16;
    c.seed = 1234;
    c.cache_dir = dir_ + "/cache";
    return c;
  }

  std::shared_ptr<GPTDataset> build(int64_t num_samples = 500, GPTDatasetConfig c = GPTDatasetConfig()) const {
    if (c.seq_length == 0) c = config();
    auto ds = std::make_shared<const IndexedDataset>(dir_ + "/data");
    auto range = *split_sequence_range(parse_split_matrix("90,10"), Split::Train, 300);
    return std::make_shared<GPTDataset>(ds, Split::Train, range, num_samples, c);
  }

  static std::vector<int64_t> all(const NpyArray& a) {
    std::vector<int64_t> v(a.size());
    for (size_t i = 0; i < a.size(); ++i) v[i] = a[i];
    return v;
  }
  static void expect_same_indices(const GPTDataset& a, const GPTDataset& b) {
    EXPECT_EQ(all(a.document_index()), all(b.document_index()));
    EXPECT_EQ(all(a.sample_index()), all(b.sample_index()));
    EXPECT_EQ(all(a.shuffle_index()), all(b.shuffle_index()));
  }

  std::string dir_;
};

TEST_F(GPTDatasetCacheTest, SecondBuildLoadsTheCache) {
  auto first = build();
  EXPECT_FALSE(first->loaded_from_cache());
  for (const char* f : {"description.txt", "document_index.npy", "sample_index.npy", "shuffle_index.npy"}) {
    EXPECT_TRUE(reference::path_exists(first->cache_path(f))) << f;
  }
  auto second = build();
  EXPECT_TRUE(second->loaded_from_cache());
  expect_same_indices(*first, *second);
  std::vector<int64_t> a(17), b(17);
  for (int64_t i = 0; i < first->size(); ++i) {
    first->sample(i, a.data());
    second->sample(i, b.data());
    ASSERT_EQ(a, b) << "sample " << i;
  }
  for (const auto& name : reference::list_dir(dir_ + "/cache")) {
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << "temporary file left behind: " << name;
  }
}

TEST_F(GPTDatasetCacheTest, DifferentParametersGetDifferentCacheFiles) {
  auto a = build(500);
  auto b = build(900);
  GPTDatasetConfig c = config();
  c.seed = 99;
  auto s = build(500, c);
  EXPECT_NE(a->cache_path("x"), b->cache_path("x"));
  EXPECT_NE(a->cache_path("x"), s->cache_path("x"));
  EXPECT_FALSE(b->loaded_from_cache());
  EXPECT_FALSE(s->loaded_from_cache());
}

TEST_F(GPTDatasetCacheTest, TruncatedCacheIsRebuilt) {
  auto first = build();
  const std::string shuffle = first->cache_path("shuffle_index.npy");
  ASSERT_EQ(::truncate(shuffle.c_str(), 140), 0);
  testing::internal::CaptureStderr();
  auto second = build();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(second->loaded_from_cache());
  EXPECT_NE(err.find("rebuilding"), std::string::npos) << err;
  expect_same_indices(*first, *second);
  EXPECT_TRUE(build()->loaded_from_cache());
}

TEST_F(GPTDatasetCacheTest, OutOfRangeEntriesAreRebuilt) {
  auto first = build();
  std::vector<uint32_t> bad(static_cast<size_t>(first->size()), 0);
  bad[3] = 0xfffffff0u;  // a well-formed file whose content would read out of bounds
  write_npy_atomic(first->cache_path("shuffle_index.npy"), NpyDType::kUInt32, {bad.size()}, bad.data());
  testing::internal::CaptureStderr();
  auto second = build();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(second->loaded_from_cache());
  EXPECT_NE(err.find("shuffle index entry out of range"), std::string::npos) << err;
  expect_same_indices(*first, *second);
}

TEST_F(GPTDatasetCacheTest, MismatchedDescriptionIsRebuilt) {
  auto first = build();
  std::ofstream(first->cache_path("description.txt")) << "something else";
  testing::internal::CaptureStderr();
  auto second = build();
  testing::internal::GetCapturedStderr();
  EXPECT_FALSE(second->loaded_from_cache());
  expect_same_indices(*first, *second);
}

TEST_F(GPTDatasetCacheTest, DefaultCacheDirectoryIsMegatrons) {
  GPTDatasetConfig c = config();
  c.cache_dir.clear();
  auto ds = build(100, c);
  EXPECT_EQ(ds->cache_path("x").rfind(dir_ + "/data/cache/GPTDataset_indices/", 0), 0u) << ds->cache_path("x");
  EXPECT_TRUE(reference::path_exists(ds->cache_path("shuffle_index.npy")));
}

TEST_F(GPTDatasetCacheTest, NoCacheWritesNothing) {
  GPTDatasetConfig c = config();
  c.use_cache = false;
  auto a = build(100, c);
  EXPECT_FALSE(reference::path_exists(dir_ + "/cache"));
  expect_same_indices(*a, *build(100));
}

TEST_F(GPTDatasetCacheTest, UnwritableCacheDirectoryIsAUserError) {
  std::ofstream(dir_ + "/plainfile") << "x";
  GPTDatasetConfig c = config();
  c.cache_dir = dir_ + "/plainfile/cache";
  try {
    build(100, c);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--data-cache-path"), std::string::npos) << e.what();
  }
}

TEST_F(GPTDatasetCacheTest, BlendCacheRoundTrip) {
  GPTDatasetConfig c = config();
  const std::vector<std::string> path = {"0.4", dir_ + "/data", "0.6", dir_ + "/other"};
  auto a = std::dynamic_pointer_cast<BlendedDataset>(build_gpt_split_dataset(path, "90,10", Split::Train, 300, c));
  auto b = std::dynamic_pointer_cast<BlendedDataset>(build_gpt_split_dataset(path, "90,10", Split::Train, 300, c));
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(a->loaded_from_cache());
  EXPECT_TRUE(b->loaded_from_cache());
  EXPECT_EQ(all(a->dataset_index()), all(b->dataset_index()));
  EXPECT_EQ(all(a->dataset_sample_index()), all(b->dataset_sample_index()));
  // Megatron's sizes: the blend holds ceil(300 * 0.4) + ceil(300 * 0.6) samples.
  EXPECT_EQ(a->size(), 120 + 180);
}

TEST_F(GPTDatasetCacheTest, EmptySplitIsAUserError) {
  auto ds = std::make_shared<const IndexedDataset>(dir_ + "/data");
  EXPECT_THROW(GPTDataset(ds, Split::Test, {300, 300}, 10, config()), UserError);
  GPTDatasetConfig c = config();
  c.seed = -1;
  EXPECT_THROW(GPTDataset(ds, Split::Train, {0, 10}, 10, c), UserError);
}

TEST_F(GPTDatasetCacheTest, SampleSourceWrapsAroundAndSkipsEmptySplits) {
  const GPTDataOptions o = options("100,0,0");
  auto train = make_gpt_sample_source(o, Split::Train);
  ASSERT_NE(train, nullptr);
  EXPECT_EQ(make_gpt_sample_source(o, Split::Valid), nullptr);
  const auto& ds = static_cast<const GPTSampleSource&>(*train).dataset();
  EXPECT_GE(ds.size(), 40);
  std::vector<int64_t> a(17), b(17);
  train->sample(3, a.data());
  train->sample(3 + ds.size(), b.data());
  EXPECT_EQ(a, b);
}

TEST_F(GPTDatasetCacheTest, SkipTrainSizesTheValidationSplitForOneEvaluation) {
  GPTDataOptions o = options("50,50,0");
  auto requested = [&] {
    auto valid = make_gpt_sample_source(o, Split::Valid);
    return dynamic_cast<const GPTDataset&>(static_cast<const GPTSampleSource&>(*valid).dataset()).num_samples_requested();
  };
  EXPECT_EQ(requested(), (10 / 5 + 1) * 2 * 4);  // a run evaluates 3 times
  o.skip_train = true;
  EXPECT_EQ(requested(), 2 * 4);  // Megatron's get_train_valid_test_num_samples under --skip-train
}

TEST(GPTDatasetParsing, SplitMatrixAndRanges) {
  const SplitMatrix m = parse_split_matrix("969, 30, 1");
  ASSERT_TRUE(m[0] && m[1] && m[2]);
  EXPECT_DOUBLE_EQ(m[0]->second, 0.969);
  EXPECT_EQ(*split_sequence_range(m, Split::Valid, 1000), std::make_pair(int64_t{969}, int64_t{999}));
  const SplitMatrix half = parse_split_matrix("1,1");
  EXPECT_FALSE(half[2].has_value());
  // Python's round: 100.5 -> 100, 2.5 -> 2, 3.5 -> 4.
  EXPECT_EQ(split_sequence_range(half, Split::Train, 201)->second, 100);
  EXPECT_EQ(split_sequence_range(half, Split::Train, 5)->second, 2);
  EXPECT_EQ(split_sequence_range(half, Split::Train, 7)->second, 4);
  EXPECT_THROW(parse_split_matrix("1,2,3,4"), UserError);
  EXPECT_THROW(parse_split_matrix("0,0,0"), UserError);
  EXPECT_THROW(parse_split_matrix("1.2.3"), UserError);
  EXPECT_THROW(parse_split_matrix("abc"), UserError);
}

TEST(GPTDatasetParsing, DataPathAndSizes) {
  DataBlend b = parse_data_path({"0.3", "a", "0.7", "b"});
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"a", "b"}));
  ASSERT_TRUE(b.weights.has_value());
  EXPECT_EQ(*b.weights, (std::vector<double>{0.3, 0.7}));
  EXPECT_FALSE(parse_data_path({"a", "b"}).weights.has_value());
  EXPECT_FALSE(parse_data_path({"a"}).weights.has_value());
  EXPECT_FALSE(parse_data_path({"1", "a", "b", "c"}).weights.has_value());  // "b" is no weight
  EXPECT_THROW(parse_data_path({"0", "a", "1", "b"}), UserError);
  EXPECT_THROW(parse_data_path({}), UserError);
  EXPECT_EQ(megatron_split_num_samples(100, 8, 30, 5), (std::array<int64_t, 3>{800, 160, 40}));
  EXPECT_EQ(blend_dataset_share(0.3, 1000, 0.005), 302);  // ceil(ceil(300.0000x) * 1.005)
  EXPECT_EQ(blend_dataset_share(0.5, 1000, 0.0), 500);
}

TEST(GPTDatasetIndices, BlendingIndicesFollowTheWeights) {
  std::vector<int16_t> index;
  std::vector<int64_t> sample;
  build_blending_indices({0.5, 0.25, 0.25}, 8, &index, &sample);
  // s=0 and s=1 both use max(s, 1) = 1: ties go to the lowest index.
  EXPECT_EQ(index, (std::vector<int16_t>{0, 1, 2, 0, 0, 1, 2, 0}));
  EXPECT_EQ(sample, (std::vector<int64_t>{0, 0, 0, 1, 2, 1, 1, 3}));
}

TEST(LtorMasks, ResetsAfterEod) {
  // text: 5 6 EOD 7 EOD 8 9 | label 4
  const std::vector<int64_t> text = {5, 6, 0, 7, 0, 8, 9, 4};
  LtorOptions o;
  o.eod = 0;
  LtorSample plain = make_ltor_sample(text.data(), 7, o);
  EXPECT_EQ(plain.labels, (std::vector<int64_t>{6, 0, 7, 0, 8, 9, 4}));
  EXPECT_EQ(plain.position_ids, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(plain.loss_mask, std::vector<float>(7, 1.0f));
  EXPECT_EQ(plain.cu_seqlens, (std::vector<int32_t>{0, 7}));
  o.reset_position_ids = o.reset_attention_mask = o.eod_mask_loss = true;
  LtorSample reset = make_ltor_sample(text.data(), 7, o);
  EXPECT_EQ(reset.position_ids, (std::vector<int64_t>{0, 1, 2, 0, 1, 0, 1}));
  // The loss is masked where the input is EOD (predicting across the boundary).
  EXPECT_EQ(reset.loss_mask, (std::vector<float>{1, 1, 0, 1, 0, 1, 1}));
  EXPECT_EQ(reset.cu_seqlens, (std::vector<int32_t>{0, 3, 5, 7}));
  EXPECT_FALSE(ltor_attention_masked(reset.cu_seqlens, 2, 0));
  EXPECT_TRUE(ltor_attention_masked(reset.cu_seqlens, 3, 2));
  EXPECT_FALSE(ltor_attention_masked(reset.cu_seqlens, 4, 3));
  EXPECT_TRUE(ltor_attention_masked(reset.cu_seqlens, 4, 5));
}

}  // namespace
}  // namespace megatron
