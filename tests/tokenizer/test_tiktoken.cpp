// --tokenizer-type TikTokenizer against megatron-core's TikTokenTokenizer (on PyPI's tiktoken):
// a real vocabulary (Llama 3's ranks in Megatron's tiktoken JSON), both split patterns, a cut
// vocabulary with custom special tokens; the ids preprocessing writes; what train reads from
// the flags and what state.json keeps; and the errors for broken vocabulary files.
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/config_json.h"
#include "core/errors.h"
#include "data/indexed_dataset.h"
#include "tokenizer/tiktoken_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"
#include "train/arguments.h"

namespace megatron {
namespace {

using namespace tok_test;

// Megatron's tiktoken vocabulary made from Llama 3's tokenizer.json (128000 ranks), once.
const std::string& llama3_vocab() {
  static test::TempDir dir;
  static const std::string path = [] {
    const std::string out = dir / "llama3_tiktoken.json";
    const auto run = test::run_command(test::shell_quote(test::venv_python()) + " " +
                                       test::shell_quote(source_dir() + "/tests/tokenizer/tiktoken_reference.py") +
                                       " vocab --from-hf " + test::shell_quote(npm_dir() + "/tokenizer-llama3/models/tokenizer.json") +
                                       " --out " + test::shell_quote(out));
    EXPECT_EQ(run.status, 0) << run.output;
    return run.status == 0 ? out : std::string();
  }();
  return path;
}

struct Setting {
  const char* name;
  std::string pattern;
  int64_t vocab_size, num_special;
  std::vector<std::string> special_tokens;
};

void PrintTo(const Setting& s, std::ostream* os) { *os << s.name; }

TokenizerSpec spec_of(const Setting& s) {
  TokenizerSpec spec;
  spec.type = "TikTokenizer";
  spec.model = llama3_vocab();
  spec.vocab_size = s.vocab_size;
  spec.tiktoken_pattern = s.pattern;
  spec.tiktoken_num_special_tokens = s.num_special;
  spec.special_tokens = s.special_tokens;
  return spec;
}

nlohmann::json megatron_core_ids(const Setting& s, const std::vector<std::string>& texts) {
  const std::string texts_file = write_temp(nlohmann::json(texts).dump(), ".json");
  std::string cmd = test::shell_quote(test::venv_python()) + " " +
                    test::shell_quote(source_dir() + "/tests/tokenizer/tiktoken_reference.py") + " ids --vocab " +
                    test::shell_quote(llama3_vocab()) + " --texts " + test::shell_quote(texts_file) + " --pattern " +
                    s.pattern + " --vocab-size " + std::to_string(s.vocab_size) + " --num-special " + std::to_string(s.num_special);
  if (!s.special_tokens.empty()) {
    cmd += " --special-tokens";
    for (const std::string& t : s.special_tokens) cmd += " " + test::shell_quote(t);
  }
  int status = 0;
  const std::string out = run_command(cmd + " 2>/dev/null", &status);
  std::remove(texts_file.c_str());
  EXPECT_EQ(status, 0) << cmd;
  return status == 0 ? nlohmann::json::parse(out) : nlohmann::json();
}

class TikTokenReference : public ::testing::TestWithParam<Setting> {};

TEST_P(TikTokenReference, IdsAndDecodingEqualMegatronCore) {
  const Setting s = GetParam();
  ASSERT_FALSE(llama3_vocab().empty());
  std::vector<std::string> texts = handwritten_texts();
  texts.push_back("<SPECIAL_7><s>glued</s><SPECIAL_999> <|im_start|>user\n<pad>x<cls><sep><mask><unk>");
  for (auto& t : random_texts(300, 77)) texts.push_back(t);
  for (auto& t : corpus_texts(3)) texts.push_back(t);
  const nlohmann::json ref = megatron_core_ids(s, texts);
  ASSERT_TRUE(ref.is_object());
  auto tok = make_tokenizer(spec_of(s));
  EXPECT_EQ(tok->vocab_size(), ref["vocab_size"].get<int64_t>());
  EXPECT_EQ(tok->bos_id(), ref["bos_id"].get<int64_t>());
  EXPECT_EQ(tok->eos_id(), ref["eos_id"].get<int64_t>());
  EXPECT_EQ(tok->eod_id(), ref["eod"].get<int64_t>());
  int failures = 0;
  for (size_t i = 0; i < texts.size() && failures < 5; ++i) {
    const std::vector<int64_t> ours = tok->encode(texts[i]);
    const std::vector<int64_t> expected = as_ids(ref["ids"][i]);
    const std::string decoded = tok->decode(ours);
    if (ours != expected || decoded != ref["decoded"][i].get<std::string>()) {
      ++failures;
      ADD_FAILURE() << s.name << ": text " << i << " " << nlohmann::json(texts[i]).dump() << "\n  ours:     "
                    << nlohmann::json(ours).dump() << "\n  expected: " << nlohmann::json(expected).dump()
                    << "\n  decoded:  " << nlohmann::json(decoded).dump() << "\n  expected: " << ref["decoded"][i].dump();
    }
    // Nothing is added around a sequence, and valid text comes back byte for byte.
    EXPECT_EQ(tok->encode(texts[i], false), ours);
    if (tok::is_valid_utf8(texts[i])) EXPECT_EQ(decoded, texts[i]);
  }
  // Single tokens both ways: a special token, a byte, a merged token.
  const int64_t n = s.num_special;
  EXPECT_EQ(tok->token_to_id("</s>"), ref["eos_id"].get<int64_t>());
  EXPECT_EQ(tok->token_to_id("A"), n + 'A');
  EXPECT_EQ(tok->id_to_token(n + 'A'), "A");
  EXPECT_EQ(tok->id_to_token(tok->vocab_size()), std::nullopt);
}

INSTANTIATE_TEST_SUITE_P(
    Settings, TikTokenReference,
    ::testing::Values(Setting{"v2_all_ranks", "v2", 129000, 1000, {}}, Setting{"v1_all_ranks", "v1", 129000, 1000, {}},
                      // Cut to 40000 ranks; 16 special tokens in a custom order, one of them a chat marker.
                      Setting{"v2_cut_custom_specials", "v2", 40016, 16,
                              {"<pad>", "<s>", "</s>", "<unk>", "<mask>", "<cls>", "<sep>", "<|im_start|>", "<|im_end|>"}}),
    [](const ::testing::TestParamInfo<Setting>& info) { return std::string(info.param.name); });

TEST(TikToken, PreprocessWritesMegatronCoreIdsAndEod) {
  ASSERT_FALSE(llama3_vocab().empty());
  const std::vector<std::string> docs = {"The Fulton County Grand Jury said Friday.", "数字和中文 <s> 1234567",
                                         "emoji 😀🎉 and\n\n  code()"};
  test::TempDir dir;
  {
    std::ofstream out(dir / "in.jsonl");
    for (const std::string& d : docs) out << nlohmann::json{{"text", d}}.dump() << "\n";
  }
  const auto run = test::run_megatron({"preprocess", "--input", dir / "in.jsonl", "--output-prefix", dir / "out", "--append-eod",
                                       "--tokenizer-type", "TikTokenizer", "--tokenizer-model", llama3_vocab(), "--vocab-size",
                                       "129000", "--tiktoken-pattern", "v2", "--workers", "2"});
  ASSERT_EQ(run.status, 0) << run.output;
  const nlohmann::json ref = megatron_core_ids(Setting{"v2", "v2", 129000, 1000, {}}, docs);
  ASSERT_TRUE(ref.is_object());
  IndexedDataset ds(dir / "out_text_document");
  EXPECT_EQ(ds.dtype(), TokenDType::kInt32);  // 129000 ids
  ASSERT_EQ(ds.num_sequences(), docs.size());
  for (size_t i = 0; i < docs.size(); ++i) {
    std::vector<int64_t> want = as_ids(ref["ids"][i]);
    want.push_back(2);  // EOD = </s>, as Megatron's TikTokenizer
    std::vector<int64_t> got(ds.sequence_length(i));
    ds.read_tokens(i, 0, got.size(), got.data());
    EXPECT_EQ(got, want) << "document " << i;
  }
}

TEST(TikToken, TrainTakesTheVocabularyFromTheFlagsAndStateJsonKeepsIt) {
  ASSERT_FALSE(llama3_vocab().empty());
  std::vector<std::string> args = {"--num-layers", "1", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length",
                                   "16", "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-4", "--mock-data", "--tokenizer-type",
                                   "TikTokenizer", "--tokenizer-model", llama3_vocab(), "--vocab-size", "129000",
                                   "--tiktoken-pattern", "v1"};
  Config c = parse_train_arguments(args);
  finalize_config(c, 1);
  EXPECT_EQ(c.model.vocab_size, 129000);
  EXPECT_EQ(c.model.padded_vocab_size, 129024);  // a multiple of 128
  EXPECT_EQ(c.data.eod_id, 2);
  // A checkpoint's state.json keeps what generate needs to rebuild the same tokenizer.
  DataConfig back;
  tokenizer_config_from_json(tokenizer_config_to_json(c.data), back);
  EXPECT_EQ(back.tiktoken_pattern, "v1");
  EXPECT_EQ(back.tiktoken_num_special_tokens, 1000);
  auto tok = make_tokenizer(tokenizer_spec(back, c.model.vocab_size));
  EXPECT_EQ(tok->encode("Hello world"), make_tokenizer(tokenizer_spec(c.data, 129000))->encode("Hello world"));

  // Without --vocab-size, Megatron's 2^17 ids: more than this vocabulary's 128000 ranks + 1000.
  args.erase(args.end() - 4, args.end() - 2);
  Config defaults = parse_train_arguments(args);
  try {
    finalize_config(defaults, 1);
    ADD_FAILURE() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("pass --vocab-size 129000"), std::string::npos) << e.what();
  }

  // Megatron's scripts pass --tiktoken-pattern with other tokenizers: a notice, no effect.
  Config null = parse_train_arguments({"--num-layers", "1", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length",
                                       "16", "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-4", "--mock-data", "--tokenizer-type",
                                       "NullTokenizer", "--vocab-size", "100", "--tiktoken-pattern", "v2"});
  finalize_config(null, 1);
  bool noticed = false;
  for (const std::string& n : null.flag_notices) noticed |= n.find("--tiktoken-pattern") != std::string::npos;
  EXPECT_TRUE(noticed);
  EXPECT_EQ(null.model.vocab_size, 101);
}

// A tiny vocabulary file: the 256 bytes, then `extra` entries as given.
std::string vocab_json(const std::vector<nlohmann::json>& extra, int bytes = 256) {
  nlohmann::json list = nlohmann::json::array();
  static const char* const kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int b = 0; b < bytes; ++b) {
    const std::string enc = std::string(1, kB64[b >> 2]) + kB64[(b & 3) << 4] + "==";
    list.push_back({{"rank", b}, {"token_bytes", enc}, {"token_str", ""}});
  }
  for (const auto& e : extra) list.push_back(e);
  return list.dump();
}

TEST(TikToken, MergesByRankAndBrokenFilesNameTheEntry) {
  test::TempDir dir;
  auto load = [&](const std::string& contents, int64_t vocab_size, const std::string& pattern = "v2") {
    std::ofstream(dir / "v.json") << contents;
    TokenizerSpec spec;
    spec.type = "TikTokenizer";
    spec.model = dir / "v.json";
    spec.vocab_size = vocab_size;
    spec.tiktoken_pattern = pattern;
    spec.tiktoken_num_special_tokens = 10;
    return make_tokenizer(spec);
  };
  auto error_of = [&](const std::string& contents, int64_t vocab_size, const std::string& pattern = "v2") {
    try {
      load(contents, vocab_size, pattern);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // "ab" (rank 256) merges before "bc" (rank 257): "abc" -> ab, c; "bcd" -> bc, d.
  auto tok = load(vocab_json({{{"rank", 256}, {"token_bytes", "YWI="}, {"token_str", "ab"}},
                              {{"rank", 257}, {"token_bytes", "YmM="}, {"token_str", "bc"}}}),
                  10 + 258);
  EXPECT_EQ(tok->encode("abc"), (std::vector<int64_t>{10 + 256, 10 + 'c'}));
  EXPECT_EQ(tok->encode("bcd"), (std::vector<int64_t>{10 + 257, 10 + 'd'}));
  EXPECT_EQ(tok->encode("<SPECIAL_9>"), std::vector<int64_t>{9});

  const std::string good = vocab_json({});
  EXPECT_NE(error_of("{\"rank\": 0}", 266).find("expected a JSON list"), std::string::npos);
  EXPECT_NE(error_of("[1, 2", 266).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(good, 300).find("holds 256 ranks"), std::string::npos);
  EXPECT_NE(error_of(good, 300).find("pass --vocab-size 266"), std::string::npos);
  EXPECT_NE(error_of(vocab_json({{{"rank", 7}, {"token_bytes", "YWI="}, {"token_str", ""}}}), 267).find("entry 256 has rank 7"),
            std::string::npos);
  EXPECT_NE(error_of(vocab_json({{{"rank", 256}, {"token_bytes", "Y*I="}, {"token_str", ""}}}), 267).find("entry 256 has token_bytes"),
            std::string::npos);
  EXPECT_NE(error_of(vocab_json({{{"rank", 256}, {"token_bytes", "YQ=="}, {"token_str", ""}}}), 267).find("repeats the bytes"),
            std::string::npos);
  EXPECT_NE(error_of(vocab_json({{{"rank", 256}}}), 267).find("lacks"), std::string::npos);
  nlohmann::json swapped = nlohmann::json::parse(good);
  std::swap(swapped[65]["token_bytes"], swapped[66]["token_bytes"]);
  EXPECT_NE(error_of(swapped.dump(), 266).find("entry 65 is not the single byte 65"), std::string::npos);
  EXPECT_NE(error_of(good, 266, "v3").find("--tiktoken-pattern must be v1 or v2"), std::string::npos);
  EXPECT_NE(error_of(good, 200).find("at least the 256 byte tokens"), std::string::npos);
  TokenizerSpec missing_special;
  missing_special.type = "TikTokenizer";
  missing_special.model = dir / "v.json";
  missing_special.special_tokens = {"<s>", "</s>"};
  try {
    make_tokenizer(missing_special);
    ADD_FAILURE() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--tokenizer-special-tokens must include <unk>"), std::string::npos) << e.what();
  }
  missing_special.model = "";
  missing_special.special_tokens = {};
  EXPECT_THROW(make_tokenizer(missing_special), UserError);
}

}  // namespace
}  // namespace megatron
