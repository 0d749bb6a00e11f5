// Bad inputs to the tokenizer factory (missing, truncated, invalid or unsupported files,
// unknown types) must raise UserError naming the file and what to do; plus the NullTokenizer.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/errors.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace megatron {
namespace {

using namespace tok_test;

// Expects make_tokenizer to throw UserError whose message contains every fragment.
void expect_user_error(const std::vector<std::string>& fragments, const std::string& type,
                       const std::string& model, const std::string& vocab = "",
                       const std::string& merges = "", int64_t n = 0) {
  try {
    make_tokenizer(type, model, vocab, merges, n);
    ADD_FAILURE() << "no error for type " << type << " model " << model;
  } catch (const UserError& e) {
    for (const std::string& f : fragments) {
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "message lacks '" << f << "': " << e.what();
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a UserError: " << e.what();
  }
}

TEST(TokenizerErrors, MissingFilesAndDirectories) {
  expect_user_error({"/nonexistent/tok", "no such file"}, "HuggingFaceTokenizer", "/nonexistent/tok");
  const std::string empty_dir = write_temp("", "");
  std::remove(empty_dir.c_str());
  ASSERT_EQ(::mkdir(empty_dir.c_str(), 0755), 0);
  expect_user_error({empty_dir, "no tokenizer.json"}, "HuggingFaceTokenizer", empty_dir);
  ::rmdir(empty_dir.c_str());
  expect_user_error({"--tokenizer-model"}, "HuggingFaceTokenizer", "");
  expect_user_error({"--vocab-file", "/nope/vocab.json"}, "GPT2BPETokenizer", "", "/nope/vocab.json",
                    "/nope/merges.txt");
  expect_user_error({"--vocab-file", "required"}, "GPT2BPETokenizer", "", "", "");
  expect_user_error({"/nope/tokenizer.model", ".model"}, "SentencePieceTokenizer", "/nope/tokenizer.model");
}

TEST(TokenizerErrors, InvalidOrUnsupportedTokenizerJson) {
  struct Case {
    std::string contents;
    std::vector<std::string> fragments;
  };
  const std::string bpe = R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";
  const std::vector<Case> cases = {
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0", {"not valid JSON"}},  // truncated
      {"", {"not valid JSON"}},
      {"[1, 2, 3]", {"no \"model\""}},
      {R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})", {"Unigram", "not supported", "SentencePieceTokenizer"}},
      {R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})", {"WordPiece", "not supported"}},
      {"{\"normalizer\": {\"type\": \"Lowercase\"}, " + bpe + "}", {"normalizer type 'Lowercase'", "not supported"}},
      {"{\"pre_tokenizer\": {\"type\": \"Metaspace\"}, " + bpe + "}", {"pre-tokenizer type 'Metaspace'"}},
      {"{\"decoder\": {\"type\": \"WordPiece\"}, " + bpe + "}", {"decoder type 'WordPiece'"}},
      {"{\"post_processor\": {\"type\": \"Foo\"}, " + bpe + "}", {"post_processor type 'Foo'"}},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}})", {"'ab'", "not in the vocabulary"}},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a"]}})", {"merge"}},
      {R"({"model": {"type": "BPE", "vocab": {"a": "zero"}, "merges": []}})", {"tokenizer"}},
      // An id far past the entries would allocate a table of that many tokens (fuzzing found 2 GB).
      {R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 55555553}, "merges": []}})",
       {"token id 55555553 of 'b' is out of range: a vocabulary of 2 entries numbers them from 0, below 1028"}},
      {R"({"model": {"type": "BPE", "vocab": {"a": 2e64}, "merges": []}})", {"must be an integer within 64 bits, got 2e+64"}},
      {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}, " + bpe + "}",
       {"regex"}},
      // Oniguruma constructs PCRE2 cannot mean the same way: refused, never tokenized differently.
      {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"[a-z&&[^aeiou]]\"}, \"behavior\": \"Isolated\"}, " + bpe + "}",
       {"a class intersection (&&)", "refused rather than tokenize differently from HF"}},
      {"{\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"[[:^alpha:]]\"}, \"content\": \" \"}, " + bpe + "}",
       {"the negated POSIX bracket [:^alpha:]"}},
      // HF inserts a Replace's content at an empty match, at the start of a text twice (or panics).
      {"{\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"\\\\s*\"}, \"content\": \"#\"}, " + bpe + "}",
       {"pattern '\\s*' can match the empty string"}},
  };
  for (const Case& c : cases) {
    const std::string file = write_temp(c.contents, ".json");
    std::vector<std::string> fragments = c.fragments;
    fragments.push_back(file);  // every message names the file
    expect_user_error(fragments, "HuggingFaceTokenizer", file);
    std::remove(file.c_str());
  }

  // A Replace regex that matches empty only inside texts is taken (HF inserts the content there),
  // but where it matches empty at a text's start, encoding that text is an error.
  const std::string lookahead = write_temp(
      "{\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"(?=b)\"}, \"content\": \"a\"}, " + bpe + "}", ".json");
  auto tok = make_tokenizer("HuggingFaceTokenizer", lookahead, "", "", 0);
  EXPECT_EQ(tok->encode("ab", false), (std::vector<int64_t>{0, 2})) << "'ab' normalizes to 'aab'";
  try {
    tok->encode("ba", false);
    ADD_FAILURE() << "no error for an empty match at the start";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("pattern '(?=b)' matched the empty string; at the start of a text"), std::string::npos)
        << e.what();
  }
  std::remove(lookahead.c_str());
}

TEST(TokenizerErrors, BadGpt2FilesAndBadTypes) {
  const std::string vocab = write_temp(R"({"a": 0, "b": 1})", ".json");
  const std::string merges = write_temp("#version: 0.2\na b\n", ".txt");
  expect_user_error({"does not match", "'ab'"}, "GPT2BPETokenizer", "", vocab, merges);
  const std::string bad_merges = write_temp("#version: 0.2\na b c\n", ".txt");
  expect_user_error({bad_merges + ":2", "two tokens"}, "GPT2BPETokenizer", "", vocab, bad_merges);
  const std::string bad_vocab = write_temp("not json", ".json");
  expect_user_error({bad_vocab, "vocab.json"}, "GPT2BPETokenizer", "", bad_vocab, merges);
  const std::string not_a_model = write_temp("definitely not a protobuf", ".model");
  expect_user_error({not_a_model, "not a SentencePiece model"}, "SentencePieceTokenizer", not_a_model);
  expect_user_error({"--tokenizer-type BertWordPieceLowerCase", "not supported"},
                    "BertWordPieceLowerCase", "");
  expect_user_error({"--vocab-size"}, "NullTokenizer", "", "", "", 0);
  for (const std::string& f : {vocab, merges, bad_merges, bad_vocab, not_a_model}) std::remove(f.c_str());
}

TEST(NullTokenizer, IdsAreTheTextAsInMegatron) {
  auto tok = make_tokenizer("NullTokenizer", "", "", "", 1000);
  EXPECT_EQ(tok->vocab_size(), 1001);
  EXPECT_EQ(tok->eod_id(), 1000);
  EXPECT_FALSE(tok->bos_id());
  EXPECT_EQ(tok->encode("1 2  3\n999\t1000"), (std::vector<int64_t>{1, 2, 3, 999, 1000}));
  EXPECT_EQ(tok->encode(""), std::vector<int64_t>{});
  EXPECT_EQ(tok->decode({5, 6, 7}), "5 6 7");
  EXPECT_EQ(tok->token_to_id("42"), 42);
  EXPECT_FALSE(tok->token_to_id("x"));
  EXPECT_EQ(tok->id_to_token(7), "7");
  EXPECT_THROW(tok->encode("1 two 3"), UserError);
  EXPECT_THROW(tok->encode("1001"), UserError);
  EXPECT_THROW(tok->encode("-1"), UserError);
}

}  // namespace
}  // namespace megatron
