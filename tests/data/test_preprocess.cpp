// `megatron preprocess`, run as the real binary: byte-identical .bin/.idx versus megatron-core's
// IndexedDatasetBuilder fed by HF tokenizers (tests/data/preprocess_reference.py) with 1 and 4
// workers, gzip input and two JSON keys; every kind of bad line (error naming file:line, or
// counted with --skip-bad-lines); --merge versus preprocessing the concatenation; and no output
// files left behind after a failure.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer_test_util.h"

namespace megatron {
namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary) << data;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Expects prefix_a.{bin,idx} and prefix_b.{bin,idx} to exist and be byte-identical.
void expect_same_dataset(const std::string& a, const std::string& b) {
  for (const char* ext : {".bin", ".idx"}) {
    const std::string x = read_bytes(a + ext), y = read_bytes(b + ext);
    EXPECT_FALSE(x.empty()) << a << ext << " missing";
    EXPECT_TRUE(x == y) << a << ext << " differs from " << b << ext << " (" << x.size() << " vs " << y.size()
                        << " bytes)";
  }
}

std::string llama3_dir() { return tok_test::npm_dir() + "/tokenizer-llama3/models"; }

// The npm Llama 3 file's post-processor adds nothing; Meta's own tokenizer.json prepends
// <|begin_of_text|> with a TemplateProcessing step. This copy has that step, so
// --tokenizer-hf-include-special-tokens has something to include.
const std::string& llama3_bos_dir() {
  static test::TempDir dir;
  static const std::string path = [] {
    nlohmann::json j = nlohmann::json::parse(read_bytes(llama3_dir() + "/tokenizer.json"));
    const nlohmann::json bos = {{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}};
    const nlohmann::json a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
    const nlohmann::json b = {{"Sequence", {{"id", "B"}, {"type_id", 1}}}};
    nlohmann::json tmpl = {
        {"type", "TemplateProcessing"},
        {"single", {bos, a}},
        {"pair", {bos, a, {{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 1}}}}, b}},
        {"special_tokens",
         {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {128000}}, {"tokens", {"<|begin_of_text|>"}}}}}}};
    j["post_processor"] = {{"type", "Sequence"}, {"processors", {j["post_processor"], tmpl}}};
    write_bytes(dir / "tokenizer.json", j.dump());
    write_bytes(dir / "tokenizer_config.json", read_bytes(llama3_dir() + "/tokenizer_config.json"));
    return dir.path();
  }();
  return path;
}

std::vector<std::string> llama3_flags(bool with_bos = false) {
  return {"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", with_bos ? llama3_bos_dir() : llama3_dir()};
}

std::vector<std::string> null_flags() { return {"--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"}; }

test::CommandResult preprocess(std::vector<std::string> args, const std::vector<std::string>& tokenizer) {
  args.insert(args.begin(), "preprocess");
  args.insert(args.end(), tokenizer.begin(), tokenizer.end());
  return test::run_megatron(args);
}

// Real prose and awkward text as JSONL with two keys: Brown corpus paragraphs, scripts, emoji,
// escapes, an empty document, lists of sentences (one with an empty sentence), a blank line,
// CRLF, and non-ASCII both raw and \u-escaped.
std::string parity_jsonl() {
  std::vector<std::string> texts = tok_test::corpus_texts(5);
  for (const std::string& t : tok_test::handwritten_texts()) texts.push_back(t);
  std::string out;
  for (size_t i = 0; i < texts.size(); ++i) {
    nlohmann::json doc = {{"id", i}, {"text", texts[i]}, {"title", "Doc " + std::to_string(i) + " \xC3\xA9t\xC3\xA9"}};
    out += doc.dump(-1, ' ', /*ensure_ascii=*/i % 3 == 0) + (i % 7 == 3 ? "\r\n" : "\n");
    if (i == 10) out += "\n";
  }
  out += nlohmann::json({{"text", {"First sentence.", "", " Second, with <|eot_id|> inside."}}, {"title", {"a", "b"}}}).dump() + "\n";
  out += nlohmann::json({{"text", ""}, {"title", ""}}).dump() + "\n";
  out += nlohmann::json({{"title", "last"}, {"text", "no newline at the end"}}).dump();
  return out;
}

// Runs the Python reference once per configuration and caches the outcome ("" = fine).
struct Reference {
  std::string error;
  std::string dir_prefix;
};
const Reference& reference(bool include_special_tokens) {
  static test::TempDir dir;
  static Reference cache[2];
  static bool done[2] = {false, false};
  Reference& r = cache[include_special_tokens];
  if (done[include_special_tokens]) return r;
  done[include_special_tokens] = true;
  const std::string python = test::venv_python();
  if (python.empty()) {
    r.error = "no venv (~/.cache/megatron.cpp/venv-*, or MEGATRON_VENV): run scripts/setup.sh";
    return r;
  }
  write_bytes(dir / "input.jsonl", parity_jsonl());
  r.dir_prefix = dir / (include_special_tokens ? "ref_special" : "ref");
  const std::string cmd = test::shell_quote(python) + " " +
                          test::shell_quote(test::source_dir() + "/tests/data/preprocess_reference.py") +
                          " --input " + test::shell_quote(dir / "input.jsonl") + " --output-prefix " +
                          test::shell_quote(r.dir_prefix) + " --tokenizer-model " +
                          test::shell_quote(include_special_tokens ? llama3_bos_dir() : llama3_dir()) +
                          " --json-keys text title --append-eod" +
                          (include_special_tokens ? " --include-special-tokens" : "");
  const test::CommandResult run = test::run_command(cmd);
  if (run.status != 0) r.error = "reference failed: " + cmd + "\n" + run.output;
  return r;
}

class PreprocessParity : public ::testing::TestWithParam<int> {};

TEST_P(PreprocessParity, ByteIdenticalToMegatronCore) {
  const Reference& ref = reference(false);
  ASSERT_EQ(ref.error, "");
  test::TempDir dir;
  write_bytes(dir / "in.jsonl", parity_jsonl());
  const auto run = preprocess({"--input", dir / "in.jsonl", "--json-keys", "text", "title", "--output-prefix",
                               dir / "out", "--append-eod", "--workers", std::to_string(GetParam())},
                              llama3_flags());
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("skipped 1 blank lines"), std::string::npos) << run.output;
  expect_same_dataset(dir / "out_text_document", ref.dir_prefix + "_text_document");
  expect_same_dataset(dir / "out_title_document", ref.dir_prefix + "_title_document");
  IndexedDataset ds(dir / "out_text_document");
  EXPECT_EQ(ds.dtype(), TokenDType::kInt32);  // Llama 3: 128256 ids
}

INSTANTIATE_TEST_SUITE_P(Workers, PreprocessParity, ::testing::Values(1, 4));

TEST(Preprocess, GzipInputEqualsReference) {
  const Reference& ref = reference(false);
  ASSERT_EQ(ref.error, "");
  test::TempDir dir;
  // Two gzip members back to back (what `cat a.gz b.gz` gives) must read as one stream.
  const std::string text = parity_jsonl();
  const size_t half = text.find('\n', text.size() / 2) + 1;
  write_bytes(dir / "a.jsonl", text.substr(0, half));
  write_bytes(dir / "b.jsonl", text.substr(half));
  const auto gz = test::run_command("gzip -c " + test::shell_quote(dir / "a.jsonl") + " > " +
                                    test::shell_quote(dir / "in.jsonl.gz") + " && gzip -c " +
                                    test::shell_quote(dir / "b.jsonl") + " >> " + test::shell_quote(dir / "in.jsonl.gz"));
  ASSERT_EQ(gz.status, 0) << gz.output;
  const auto run = preprocess({"--input", dir / "in.jsonl.gz", "--json-keys", "text", "title", "--output-prefix",
                               dir / "out", "--append-eod", "--workers", "2"},
                              llama3_flags());
  ASSERT_EQ(run.status, 0) << run.output;
  expect_same_dataset(dir / "out_text_document", ref.dir_prefix + "_text_document");
  expect_same_dataset(dir / "out_title_document", ref.dir_prefix + "_title_document");

  // A truncated gzip file is an error, not a silently short dataset.
  const std::string whole = read_bytes(dir / "in.jsonl.gz");
  write_bytes(dir / "cut.jsonl.gz", whole.substr(0, whole.size() / 2));
  const auto cut = preprocess({"--input", dir / "cut.jsonl.gz", "--output-prefix", dir / "cut"}, llama3_flags());
  EXPECT_EQ(cut.status, 2) << cut.output;
  EXPECT_NE(cut.output.find("cut.jsonl.gz"), std::string::npos) << cut.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "cut_text_document.bin"));
}

TEST(Preprocess, IncludeSpecialTokensMatchesMegatronFlag) {
  const Reference& ref = reference(true);
  ASSERT_EQ(ref.error, "");
  test::TempDir dir;
  write_bytes(dir / "in.jsonl", parity_jsonl());
  const auto run = preprocess({"--input", dir / "in.jsonl", "--json-keys", "text", "title", "--output-prefix",
                               dir / "out", "--append-eod", "--workers", "2", "--tokenizer-hf-include-special-tokens"},
                              llama3_flags(/*with_bos=*/true));
  ASSERT_EQ(run.status, 0) << run.output;
  expect_same_dataset(dir / "out_text_document", ref.dir_prefix + "_text_document");
  expect_same_dataset(dir / "out_title_document", ref.dir_prefix + "_title_document");
  IndexedDataset ds(dir / "out_text_document");
  int64_t first = -1;
  ds.read_tokens(0, 0, 1, &first);
  EXPECT_EQ(first, 128000);  // <|begin_of_text|>
  // Without the flag the same tokenizer adds no BOS, as Megatron's default.
  const auto plain = preprocess({"--input", dir / "in.jsonl", "--output-prefix", dir / "plain"},
                                llama3_flags(/*with_bos=*/true));
  ASSERT_EQ(plain.status, 0) << plain.output;
  IndexedDataset no_bos(dir / "plain_text_document");
  no_bos.read_tokens(0, 0, 1, &first);
  EXPECT_NE(first, 128000);
}

struct BadCase {
  std::string line;
  std::string reason;  // expected in the message
};

std::vector<BadCase> bad_cases() {
  return {
      {"{\"text\": \"unterminated}", "invalid JSON"},
      {"{\"text\": \"a\",}", "invalid JSON"},
      {"{\"txt\": \"wrong key\"}", "missing key \"text\""},
      {"{\"text\": 42}", "is a number, expected a string"},
      {"{\"text\": null}", "is null, expected a string"},
      {"{\"text\": {\"nested\": \"x\"}}", "is an object, expected a string"},
      {"{\"text\": [\"ok\", true]}", "list element 1 is a boolean"},
      {"[\"not\", \"an object\"]", "not a JSON object"},
      {"{\"text\": \"caf\xE9\"}", "invalid UTF-8"},          // Latin-1 byte
      {"{\"text\": \"\xC0\xAF\"}", "invalid UTF-8"},         // overlong '/'
      {"{\"text\": \"\xED\xA0\x80\"}", "invalid UTF-8"},     // encoded surrogate
      {"{\"text\": \"\xF4\x90\x80\x80\"}", "invalid UTF-8"}, // above U+10FFFF
      {"{\"text\": \"ab\xE2\x82\"}", "invalid UTF-8"},       // truncated sequence
      {"{\"text\": \"\\ud800 lone\"}", "invalid JSON"},      // unpaired surrogate escape
      {"{\"text\": \"1 2 x\"}", "tokenizer rejected"},       // NullTokenizer wants ids
  };
}

TEST(Preprocess, EachBadLineStopsWithFileAndLine) {
  test::TempDir dir;
  for (const BadCase& c : bad_cases()) {
    SCOPED_TRACE(c.line);
    write_bytes(dir / "bad.jsonl", "{\"text\": \"1 2 3\"}\n\n" + c.line + "\n{\"text\": \"4 5\"}\n");
    const auto run = preprocess({"--input", dir / "bad.jsonl", "--output-prefix", dir / "out/data",
                                 "--append-eod", "--workers", "2"},
                                null_flags());
    EXPECT_EQ(run.status, 2) << run.output;
    EXPECT_NE(run.output.find("error: " + (dir / "bad.jsonl") + ":3: "), std::string::npos) << run.output;
    EXPECT_NE(run.output.find(c.reason), std::string::npos) << run.output;
    EXPECT_TRUE(files_in(dir / "out").empty()) << "files left after a failure";
  }
}

TEST(Preprocess, SkipBadLinesCountsListsAndKeepsTheGoodOnes) {
  test::TempDir dir;
  std::string mixed, clean;
  std::vector<size_t> bad_line_numbers;
  size_t line_no = 0;
  int good = 0;
  for (const BadCase& c : bad_cases()) {
    const std::string ok = "{\"text\": \"" + std::to_string(++good) + " 7 8\"}\n";
    mixed += ok;
    clean += ok;
    mixed += "\n";  // blank lines are skipped and counted, not bad
    mixed += c.line + "\n";
    line_no += 3;
    bad_line_numbers.push_back(line_no);
  }
  write_bytes(dir / "mixed.jsonl", mixed);
  write_bytes(dir / "clean.jsonl", clean);
  const auto run = preprocess({"--input", dir / "mixed.jsonl", "--output-prefix", dir / "mixed", "--append-eod",
                               "--skip-bad-lines", "--workers", "3"},
                              null_flags());
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("skipped " + std::to_string(bad_cases().size()) + " bad lines"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("skipped " + std::to_string(bad_cases().size()) + " blank lines"), std::string::npos)
      << run.output;
  // The first ten are listed with their line numbers.
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_NE(run.output.find("mixed.jsonl:" + std::to_string(bad_line_numbers[i]) + ": "), std::string::npos)
        << run.output;
  }
  const auto ref = preprocess({"--input", dir / "clean.jsonl", "--output-prefix", dir / "clean", "--append-eod"},
                              null_flags());
  ASSERT_EQ(ref.status, 0) << ref.output;
  expect_same_dataset(dir / "mixed_text_document", dir / "clean_text_document");
  IndexedDataset ds(dir / "mixed_text_document");
  EXPECT_EQ(ds.num_documents(), static_cast<size_t>(good));
  EXPECT_EQ(ds.dtype(), TokenDType::kUInt16);
}

// Lines far into a file that spans many read batches, one line longer than a batch, and a
// failure after megabytes were already written: the error names the right line and nothing
// is left in the output directory, neither final nor temporary files.
TEST(Preprocess, LateFailureLeavesNoFilesAndNamesTheLine) {
  test::TempDir dir;
  std::string text;
  const int lines = 40000;
  for (int i = 1; i <= lines; ++i) {
    if (i == 777) {
      std::string long_doc;
      for (int k = 0; k < 60000; ++k) long_doc += std::to_string(k % 1000) + " ";
      long_doc.pop_back();
      text += "{\"text\": \"" + long_doc + "\", \"t2\": \"1\"}\n";
      continue;
    }
    text += i == 39000 ? "{\"text\": 1}\n" : "{\"text\": \"" + std::to_string(i % 997) + " 1 2 3 4 5 6 7 8 9\", \"t2\": \"5\"}\n";
  }
  write_bytes(dir / "big.jsonl", text);
  const auto run = preprocess({"--input", dir / "big.jsonl", "--json-keys", "text", "t2", "--output-prefix",
                               dir / "out/big", "--workers", "4", "--log-interval", "5000"},
                              null_flags());
  EXPECT_EQ(run.status, 2) << run.output;
  EXPECT_NE(run.output.find("big.jsonl:39000: key \"text\" is a number"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("preprocess: 35000 documents"), std::string::npos) << "progress lines: " << run.output;
  EXPECT_TRUE(files_in(dir / "out").empty());

  // The same file without the bad line goes through: the long line is one document.
  text.replace(text.find("{\"text\": 1}\n"), 12, "{\"text\": \"1\", \"t2\": \"2\"}\n");
  write_bytes(dir / "big.jsonl", text);
  const auto ok = preprocess({"--input", dir / "big.jsonl", "--json-keys", "text", "t2", "--output-prefix",
                              dir / "out/big", "--workers", "4"},
                             null_flags());
  ASSERT_EQ(ok.status, 0) << ok.output;
  IndexedDataset ds(dir / "out/big_text_document");
  EXPECT_EQ(ds.num_documents(), static_cast<size_t>(lines));
  EXPECT_EQ(ds.sequence_length(776), 60000);
  EXPECT_EQ(files_in(dir / "out"), (std::vector<std::string>{"big_t2_document.bin", "big_t2_document.idx",
                                                             "big_text_document.bin", "big_text_document.idx"}));
}

TEST(Preprocess, MergeEqualsPreprocessingTheConcatenation) {
  test::TempDir dir;
  const std::string text = parity_jsonl();
  std::vector<std::string> parts(3);
  size_t pos = 0;
  for (int p = 0; p < 3; ++p) {
    const size_t end = p == 2 ? text.size() : text.find('\n', (p + 1) * text.size() / 3) + 1;
    parts[p] = text.substr(pos, end - pos);
    pos = end;
  }
  write_bytes(dir / "all.jsonl", text);
  auto run = preprocess({"--input", dir / "all.jsonl", "--output-prefix", dir / "all", "--append-eod"}, llama3_flags());
  ASSERT_EQ(run.status, 0) << run.output;
  std::filesystem::create_directories(dir / "shards");
  std::vector<std::string> merge_args = {"preprocess", "--merge", "--input"};
  for (int p = 0; p < 3; ++p) {
    const std::string name = "part" + std::to_string(p);
    write_bytes(dir / (name + ".jsonl"), parts[p]);
    run = preprocess({"--input", dir / (name + ".jsonl"), "--output-prefix", dir / ("shards/" + name), "--append-eod"},
                     llama3_flags());
    ASSERT_EQ(run.status, 0) << run.output;
    merge_args.push_back(dir / ("shards/" + name + "_text_document"));
  }
  merge_args.insert(merge_args.end(), {"--output-prefix", dir / "merged"});
  run = test::run_megatron(merge_args);
  ASSERT_EQ(run.status, 0) << run.output;
  expect_same_dataset(dir / "merged", dir / "all_text_document");
  // merge_datasets.py's form: a directory of datasets, merged in name order.
  run = test::run_megatron({"preprocess", "--merge", "--input", dir / "shards", "--output-prefix", dir / "merged_dir"});
  ASSERT_EQ(run.status, 0) << run.output;
  expect_same_dataset(dir / "merged_dir", dir / "all_text_document");
}

TEST(Preprocess, FlagErrors) {
  test::TempDir dir;
  write_bytes(dir / "in.jsonl", "{\"text\": \"1\"}\n");
  const std::vector<std::string> base = {"--input", dir / "in.jsonl", "--output-prefix", dir / "o"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return preprocess(args, null_flags());
  };
  auto r = with({"--split-sentences"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--split-sentences is not supported"), std::string::npos) << r.output;
  r = with({"--bogus"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("unknown flag '--bogus'"), std::string::npos) << r.output;
  r = with({"--workers", "0"});
  EXPECT_EQ(r.status, 2);
  r = preprocess({"--input", dir / "missing.jsonl", "--output-prefix", dir / "o"}, null_flags());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("missing.jsonl: cannot open input"), std::string::npos) << r.output;
  r = test::run_megatron({"preprocess", "--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.output.find("--json-keys"), std::string::npos);
  EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"in.jsonl"});
}

}  // namespace
}  // namespace megatron
