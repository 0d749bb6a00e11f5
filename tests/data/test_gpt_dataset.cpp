// GPTDataset and BlendedDataset against megatron-core 0.16 itself: the C++ test writes indexed
// datasets, megatron_reference_indices.py builds Megatron's datasets over them in the venv, and
// every index is compared element by element (and the cached .npy files byte by byte), then the
// first samples' tokens, labels, loss masks, position ids and attention masks.
#include <array>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "data/blended_dataset.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/ltor_masks.h"
#include "reference_python.h"

namespace megatron {
namespace {

constexpr int64_t kEod = 0;

struct Case {
  std::string name;
  std::vector<std::string> data_path;  // dataset names (A, B, ...) or weights
  std::string split;
  std::array<int64_t, 3> sizes;
  int64_t seq_length;
  int64_t seed;
  bool reset_position_ids = false, reset_attention_mask = false, eod_mask_loss = false;
  int num_get = 12;
};

// Documents of random length in [min_len, max_len] plus the EOD, tokens in [1, vocab).
void write_dataset(const std::string& prefix, TokenDType dtype, int docs, int min_len, int max_len, int vocab,
                   uint64_t seed) {
  std::mt19937_64 gen(seed);
  IndexedDatasetBuilder builder(prefix, dtype);
  for (int d = 0; d < docs; ++d) {
    const int len = min_len + static_cast<int>(gen() % static_cast<uint64_t>(max_len - min_len + 1));
    std::vector<int64_t> doc;
    for (int i = 0; i < len; ++i) doc.push_back(1 + static_cast<int64_t>(gen() % static_cast<uint64_t>(vocab - 1)));
    doc.push_back(kEod);
    builder.add_document(doc.data(), doc.size());
  }
  builder.finalize();
}

class MegatronReferenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = reference::make_temp_dir("gpt_dataset_test");
    write_dataset(dir_ + "/A", TokenDType::kUInt16, 1500, 1, 40, 60000, 1);
    write_dataset(dir_ + "/B", TokenDType::kInt32, 1200, 5, 60, 100000, 2);
    write_dataset(dir_ + "/C", TokenDType::kUInt16, 2000, 0, 9, 500, 3);  // many EODs per sample
    write_dataset(dir_ + "/D", TokenDType::kUInt16, 201, 10, 30, 1000, 4);

    // Multi-epoch sizes from A's train split, so the 80% rule's both sides are hit on purpose.
    IndexedDataset a(dir_ + "/A");
    const auto range = *split_sequence_range(parse_split_matrix("98,2,0"), Split::Train, 1500);
    int64_t tokens = 0;
    for (int64_t s = range.first; s < range.second; ++s) tokens += a.sequence_length(static_cast<size_t>(s));
    const int64_t per_epoch = (tokens - 1) / 32, sans_final = (2 * tokens - 1) / 32;
    separate_size_ = sans_final + per_epoch / 4;
    no_separate_size_ = sans_final + per_epoch * 9 / 10;

    cases_ = {
        {"single_epoch", {"A"}, "969,30,1", {100, 10, 3}, 32, 1234},
        {"multi_epoch_separate", {"A"}, "98,2,0", {separate_size_, 5, 0}, 32, 7},
        {"multi_epoch_no_separate", {"A"}, "98,2,0", {no_separate_size_, 5, 0}, 32, 7},
        {"half_split_seed0", {"D"}, "1,1", {50, 50, 0}, 16, 0},
        {"all_flags_max_seed", {"C"}, "90,10", {400, 30, 0}, 20, 4294967295, true, true, true, 40},
        {"eod_mask_only", {"C"}, "969,30,1", {120, 10, 5}, 24, 5, false, false, true, 20},
        {"blend2", {"0.3", "A", "0.7", "B"}, "969,30,1", {300, 40, 10}, 32, 1234},
        {"blend3", {"2", "A", "1", "B", "1.5", "C"}, "80,15,5", {500, 60, 20}, 24, 99, true, true, false, 30},
        {"blend_unweighted", {"A", "B"}, "80,15,5", {200, 20, 5}, 32, 11},
        {"weighted_single", {"1.0", "B"}, "969,30,1", {100, 10, 3}, 16, 3},
        // Each split its own data (--train-data-path etc.): every dataset whole; a lone weighted
        // prefix is a plain GPTDataset here, unlike under --data-path.
        {"per_split_single", {"A", ";", "0.5", "B", ";", "-"}, "per_split", {200, 30, 0}, 32, 5},
        {"per_split_blends", {"0.3", "A", "0.7", "B", ";", "C", "D", ";", "D"}, "per_split", {300, 40, 10}, 24, 17},
    };
    std::ofstream spec(dir_ + "/spec.txt");
    for (const Case& c : cases_) {
      spec << "gpt | " << c.name << " | ";
      for (const auto& p : paths(c)) spec << p << " ";
      spec << " | " << c.split << " | " << c.sizes[0] << " " << c.sizes[1] << " " << c.sizes[2] << " | "
           << c.seq_length << " | " << c.seed << " | " << kEod << " | " << c.reset_position_ids << " "
           << c.reset_attention_mask << " " << c.eod_mask_loss << " | " << c.num_get << "\n";
    }
    spec.close();
    setup_error_ = reference::run_reference_script(
        "megatron_reference_indices.py",
        reference::shell_quote(dir_ + "/spec.txt") + " " + reference::shell_quote(dir_ + "/ref"));
  }
  // A failed reference build fails every test instead of skipping it.
  void SetUp() override { ASSERT_EQ(setup_error_, ""); }
  static void TearDownTestSuite() { reference::remove_tree(dir_); }

  // Dataset names become prefixes in the temp dir; weights stay.
  static std::vector<std::string> paths(const Case& c) {
    std::vector<std::string> out;
    for (const auto& p : c.data_path) out.push_back(std::isalpha(static_cast<unsigned char>(p[0])) ? dir_ + "/" + p : p);
    return out;
  }

  // A per_split case's three lists ("-": none), as --train-data-path, --valid-data-path and
  // --test-data-path give them.
  static std::array<std::vector<std::string>, 3> own_split_paths(const Case& c) {
    std::array<std::vector<std::string>, 3> out;
    size_t i = 0;
    for (const auto& p : paths(c)) {
      if (p == ";") ++i;
      else if (p != "-") out.at(i).push_back(p);
    }
    return out;
  }

  static const Case& find(const std::string& name) {
    for (const Case& c : cases_) {
      if (c.name == name) return c;
    }
    throw std::logic_error("no case " + name);
  }

  static void expect_same(const NpyArray& mine, const std::string& ref_path, const std::string& what) {
    ASSERT_TRUE(reference::path_exists(ref_path)) << ref_path;
    const NpyArray ref = NpyArray::map_file(ref_path);
    ASSERT_EQ(mine.shape(), ref.shape()) << what;
    ASSERT_EQ(mine.dtype(), ref.dtype()) << what << ": Megatron stores it as " << npy_descr(ref.dtype());
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(mine[i], ref[i]) << what << " differs at element " << i;
  }

  static void expect_gpt_same(const GPTDataset& ds, const std::string& ref_prefix, bool compare_cache_bytes) {
    SCOPED_TRACE(ref_prefix);
    expect_same(ds.document_index(), ref_prefix + "-document_index.npy", "document index");
    expect_same(ds.sample_index(), ref_prefix + "-sample_index.npy", "sample index");
    expect_same(ds.shuffle_index(), ref_prefix + "-shuffle_index.npy", "shuffle index");
    if (!compare_cache_bytes) return;
    for (const char* name : {"document_index.npy", "sample_index.npy", "shuffle_index.npy"}) {
      EXPECT_TRUE(reference::read_file_bytes(ds.cache_path(name)) ==
                  reference::read_file_bytes(ref_prefix + "-" + name))
          << "cached " << name << " differs from numpy.save's bytes";
    }
  }

  static void check_case(const std::string& name) {
    const Case& c = find(name);
    const std::string ref = dir_ + "/ref/" + c.name + "/";
    GPTDatasetConfig config;
    config.seq_length = c.seq_length;
    config.seed = c.seed;
    config.cache_dir = dir_ + "/cache/" + c.name;
    for (int i = 0; i < 3; ++i) {
      SCOPED_TRACE(std::string(c.name) + " split " + std::to_string(i));
      const std::string split_ref = ref + "split" + std::to_string(i);
      auto ds = c.split == "per_split"
                    ? build_gpt_own_split_dataset(own_split_paths(c)[static_cast<size_t>(i)], static_cast<Split>(i),
                                                  c.sizes[static_cast<size_t>(i)], config)
                    : build_gpt_split_dataset(paths(c), c.split, static_cast<Split>(i), c.sizes[static_cast<size_t>(i)], config);
      if (!reference::path_exists(split_ref + "-meta.txt")) {
        EXPECT_EQ(ds, nullptr) << "Megatron builds no dataset for this split";
        continue;
      }
      ASSERT_NE(ds, nullptr);
      std::ifstream meta(split_ref + "-meta.txt");
      std::string key, kind;
      int64_t size = 0, num_datasets = 0;
      meta >> key >> kind >> key >> size;
      if (kind == "blend") meta >> key >> num_datasets;
      EXPECT_EQ(ds->size(), size);
      if (kind == "gpt") {
        auto* gpt = dynamic_cast<GPTDataset*>(ds.get());
        ASSERT_NE(gpt, nullptr) << "Megatron builds a plain GPTDataset here";
        ASSERT_NO_FATAL_FAILURE(expect_gpt_same(*gpt, split_ref, true));
      } else {
        auto* blend = dynamic_cast<BlendedDataset*>(ds.get());
        ASSERT_NE(blend, nullptr) << "Megatron builds a BlendedDataset here";
        ASSERT_EQ(static_cast<int64_t>(blend->datasets().size()), num_datasets);
        expect_same(blend->dataset_index(), split_ref + "-dataset_index.npy", "dataset index");
        expect_same(blend->dataset_sample_index(), split_ref + "-dataset_sample_index.npy", "dataset sample index");
        for (size_t j = 0; j < blend->datasets().size(); ++j) {
          ASSERT_NO_FATAL_FAILURE(
              expect_gpt_same(*blend->datasets()[j], split_ref + "-d" + std::to_string(j), true));
        }
      }
      ASSERT_NO_FATAL_FAILURE(check_samples(c, *ds, split_ref));
    }
  }

  static void check_samples(const Case& c, const SequenceDataset& ds, const std::string& split_ref) {
    const NpyArray tokens = NpyArray::map_file(split_ref + "-tokens.npy");
    const NpyArray labels = NpyArray::map_file(split_ref + "-labels.npy");
    const NpyArray loss_mask = NpyArray::map_file(split_ref + "-loss_mask.npy");
    const NpyArray positions = NpyArray::map_file(split_ref + "-position_ids.npy");
    const NpyArray attention = NpyArray::map_file(split_ref + "-attention_mask.npy");
    const size_t s = static_cast<size_t>(c.seq_length);
    const size_t count = tokens.shape()[0];
    ASSERT_EQ(count, static_cast<size_t>(std::min<int64_t>(c.num_get, ds.size())));
    LtorOptions options;
    options.eod = kEod;
    options.reset_position_ids = c.reset_position_ids;
    options.reset_attention_mask = c.reset_attention_mask;
    options.eod_mask_loss = c.eod_mask_loss;
    std::vector<int64_t> text(s + 1);
    for (size_t k = 0; k < count; ++k) {
      ds.sample(static_cast<int64_t>(k), text.data());
      const LtorSample got = make_ltor_sample(text.data(), c.seq_length, options);
      for (size_t t = 0; t < s; ++t) {
        const size_t at = k * s + t;
        ASSERT_EQ(got.tokens[t], tokens[at]) << "sample " << k << " token " << t;
        ASSERT_EQ(got.labels[t], labels[at]) << "sample " << k << " label " << t;
        ASSERT_EQ(static_cast<int64_t>(got.loss_mask[t]), loss_mask[at]) << "sample " << k << " loss mask " << t;
        ASSERT_EQ(got.position_ids[t], positions[at]) << "sample " << k << " position " << t;
        for (size_t u = 0; u < s; ++u) {
          ASSERT_EQ(ltor_attention_masked(got.cu_seqlens, static_cast<int64_t>(t), static_cast<int64_t>(u)),
                    attention[(k * s + t) * s + u] != 0)
              << "sample " << k << " attention mask [" << t << ", " << u << "]";
        }
      }
    }
  }

  static std::string setup_error_;
  static std::string dir_;
  static std::vector<Case> cases_;
  static int64_t separate_size_, no_separate_size_;
};
std::string MegatronReferenceTest::setup_error_;
std::string MegatronReferenceTest::dir_;
std::vector<Case> MegatronReferenceTest::cases_;
int64_t MegatronReferenceTest::separate_size_ = 0;
int64_t MegatronReferenceTest::no_separate_size_ = 0;

TEST_F(MegatronReferenceTest, SingleEpoch) { check_case("single_epoch"); }

TEST_F(MegatronReferenceTest, MultiEpochFinalEpochShuffledSeparately) {
  check_case("multi_epoch_separate");
  GPTDatasetConfig config;
  config.seq_length = 32;
  config.seed = 7;
  config.use_cache = false;
  auto ds = build_gpt_split_dataset({dir_ + "/A"}, "98,2,0", Split::Train, separate_size_, config);
  auto* gpt = dynamic_cast<GPTDataset*>(ds.get());
  ASSERT_NE(gpt, nullptr);
  EXPECT_EQ(gpt->num_epochs(), 3);
  EXPECT_TRUE(gpt->separate_final_epoch());
}

TEST_F(MegatronReferenceTest, MultiEpochFinalEpochShuffledTogether) {
  check_case("multi_epoch_no_separate");
  GPTDatasetConfig config;
  config.seq_length = 32;
  config.seed = 7;
  config.use_cache = false;
  auto ds = build_gpt_split_dataset({dir_ + "/A"}, "98,2,0", Split::Train, no_separate_size_, config);
  auto* gpt = dynamic_cast<GPTDataset*>(ds.get());
  ASSERT_NE(gpt, nullptr);
  EXPECT_EQ(gpt->num_epochs(), 3);
  EXPECT_FALSE(gpt->separate_final_epoch());
}

TEST_F(MegatronReferenceTest, HalfwaySplitRoundsHalfToEvenSeedZero) { check_case("half_split_seed0"); }
TEST_F(MegatronReferenceTest, ResetPositionsAttentionAndEodMaskMaxSeed) { check_case("all_flags_max_seed"); }
TEST_F(MegatronReferenceTest, EodMaskLossOnly) { check_case("eod_mask_only"); }
TEST_F(MegatronReferenceTest, BlendOfTwo) { check_case("blend2"); }
TEST_F(MegatronReferenceTest, BlendOfThreeWithResets) { check_case("blend3"); }
TEST_F(MegatronReferenceTest, UnweightedBlendWeightsBySize) { check_case("blend_unweighted"); }
TEST_F(MegatronReferenceTest, WeightedSinglePrefixIsABlend) { check_case("weighted_single"); }
TEST_F(MegatronReferenceTest, PerSplitPathsTakeEachDatasetWhole) { check_case("per_split_single"); }
TEST_F(MegatronReferenceTest, PerSplitBlendsWeightedUnweightedAndSingle) { check_case("per_split_blends"); }

}  // namespace
}  // namespace megatron
