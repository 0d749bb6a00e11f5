// Tests for the Megatron indexed dataset reader/builder: round trips, the exact on-disk bytes,
// every corruption the reader must reject, builder atomicity, merge, and a byte-for-byte
// comparison with datasets written by numpy the way Megatron-LM writes them.
#include <dirent.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_support.h"

#include "core/errors.h"
#include "data/indexed_dataset.h"

namespace megatron {
namespace {

using Bytes = std::vector<unsigned char>;
using Docs = std::vector<std::vector<int64_t>>;

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// Little-endian appenders, so the expected .idx is spelled out from the spec, not from the code.
void put_le(Bytes* b, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b->push_back(static_cast<unsigned char>(v >> (8 * i)));
}

void build(const std::string& prefix, TokenDType dtype, const Docs& docs) {
  IndexedDatasetBuilder builder(prefix, dtype);
  for (const auto& doc : docs) builder.add_document(doc.data(), doc.size());
  builder.finalize();
}

std::vector<int64_t> read_sequence(const IndexedDataset& ds, size_t i) {
  std::vector<int64_t> out(static_cast<size_t>(ds.sequence_length(i)));
  ds.read_tokens(i, 0, out.size(), out.data());
  return out;
}

class IndexedDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/indexed_dataset_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const std::string& name : list_dir()) ::unlink((dir_ + "/" + name).c_str());
    ::rmdir(dir_.c_str());
  }
  std::vector<std::string> list_dir() const {
    std::vector<std::string> names;
    if (DIR* d = ::opendir(dir_.c_str())) {
      while (dirent* e = ::readdir(d)) {
        std::string name = e->d_name;
        if (name != "." && name != "..") names.push_back(name);
      }
      ::closedir(d);
    }
    return names;
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // Asserts that opening `prefix` throws UserError naming `file` and containing `what`.
  void expect_rejected(const std::string& prefix, const std::string& file, const std::string& what) {
    try {
      IndexedDataset ds(prefix);
      ADD_FAILURE() << "opened a corrupt dataset; expected an error about " << what;
    } catch (const UserError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(file), std::string::npos) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
    }
  }

  std::string dir_;
};

TEST(TokenDTypeTest, ItemsizeAndVocabChoice) {
  EXPECT_EQ(token_dtype_itemsize(TokenDType::kUInt8), 1u);
  EXPECT_EQ(token_dtype_itemsize(TokenDType::kUInt16), 2u);
  EXPECT_EQ(token_dtype_itemsize(TokenDType::kInt32), 4u);
  EXPECT_EQ(token_dtype_itemsize(TokenDType::kFloat64), 8u);
  EXPECT_EQ(static_cast<int>(TokenDType::kUInt16), 8);
  EXPECT_EQ(token_dtype_for_vocab(50257), TokenDType::kUInt16);
  EXPECT_EQ(token_dtype_for_vocab(65499), TokenDType::kUInt16);
  EXPECT_EQ(token_dtype_for_vocab(65500), TokenDType::kInt32);
  EXPECT_EQ(token_dtype_for_vocab(128256), TokenDType::kInt32);
}

TEST_F(IndexedDatasetTest, RoundTripUInt16) {
  const Docs docs = {{0, 1, 65535}, {}, {42}, {7, 8, 9, 10, 11}};
  const std::string prefix = path("u16");
  build(prefix, TokenDType::kUInt16, docs);
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.dtype(), TokenDType::kUInt16);
  ASSERT_EQ(ds.num_sequences(), 3u);  // the empty document has no sequence
  EXPECT_EQ(ds.num_documents(), 4u);
  EXPECT_EQ(ds.num_tokens(), 9);
  EXPECT_EQ(ds.document_indices().to_vector(), (std::vector<int64_t>{0, 1, 1, 2, 3}));
  EXPECT_EQ(ds.sequence_lengths().to_vector(), (std::vector<int32_t>{3, 1, 5}));
  EXPECT_EQ(read_sequence(ds, 0), docs[0]);
  EXPECT_EQ(read_sequence(ds, 1), docs[2]);
  EXPECT_EQ(read_sequence(ds, 2), docs[3]);
  int64_t middle[2];
  ds.read_tokens(2, 2, 2, middle);
  EXPECT_EQ(middle[0], 9);
  EXPECT_EQ(middle[1], 10);
  EXPECT_EQ(exists(prefix + ".bin"), true);
  EXPECT_EQ(list_dir().size(), 2u);  // no temporaries left behind
}

TEST_F(IndexedDatasetTest, RoundTripInt32WithMultiSequenceDocuments) {
  const std::string prefix = path("i32");
  // Longer than the 1 MiB write buffer, to exercise the direct-write path.
  std::vector<int64_t> big(600000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<int64_t>((i * 7919) % 2147483647);
  const std::vector<int64_t> a = {2147483647, 0, 65536}, b = {100000};
  {
    IndexedDatasetBuilder builder(prefix, TokenDType::kInt32);
    builder.add_sequence(a.data(), a.size());
    builder.add_sequence(b.data(), b.size());
    builder.end_document();
    builder.add_document(big.data(), big.size());
    builder.finalize();
  }
  IndexedDataset moved_from(prefix);
  IndexedDataset ds = std::move(moved_from);  // move-only type: the mapping travels
  ASSERT_EQ(ds.num_sequences(), 3u);
  EXPECT_EQ(ds.num_documents(), 2u);
  EXPECT_EQ(ds.document_indices().to_vector(), (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(ds.sequence_offsets()[2], 16);
  EXPECT_EQ(read_sequence(ds, 0), a);
  EXPECT_EQ(read_sequence(ds, 1), b);
  EXPECT_EQ(read_sequence(ds, 2), big);
  EXPECT_EQ(read_bytes(prefix + ".bin").size(), (4 + 600000) * 4u);
}

TEST_F(IndexedDatasetTest, EmptyDataset) {
  const std::string prefix = path("empty");
  build(prefix, TokenDType::kUInt16, {});
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.num_sequences(), 0u);
  EXPECT_EQ(ds.num_documents(), 0u);
  EXPECT_EQ(read_bytes(prefix + ".idx").size(), 34u + 8u);
}

TEST_F(IndexedDatasetTest, ExactBytesOfThreeDocuments) {
  const std::string prefix = path("exact");
  build(prefix, TokenDType::kUInt16, {{1, 2, 3}, {4, 5}, {65535}});

  Bytes idx = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  put_le(&idx, 1, 8);  // version
  put_le(&idx, 8, 1);  // dtype code: uint16
  put_le(&idx, 3, 8);  // S
  put_le(&idx, 4, 8);  // D = documents + 1
  for (uint64_t len : {3, 2, 1}) put_le(&idx, len, 4);
  for (uint64_t off : {0, 6, 10}) put_le(&idx, off, 8);  // byte offsets: += len * 2
  for (uint64_t doc : {0, 1, 2, 3}) put_le(&idx, doc, 8);
  ASSERT_EQ(idx.size(), 34u + 3 * 4 + 3 * 8 + 4 * 8);
  EXPECT_EQ(read_bytes(prefix + ".idx"), idx);

  const Bytes bin = {1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 0xff, 0xff};
  EXPECT_EQ(read_bytes(prefix + ".bin"), bin);
}

TEST_F(IndexedDatasetTest, RejectsMissingFiles) {
  const std::string prefix = path("ds");
  expect_rejected(prefix, prefix + ".idx", "not found");
  build(prefix, TokenDType::kUInt16, {{1, 2}});
  ::unlink((prefix + ".bin").c_str());
  expect_rejected(prefix, prefix + ".bin", "not found");
}

TEST_F(IndexedDatasetTest, RejectsCorruptFiles) {
  const std::string prefix = path("ds");
  build(prefix, TokenDType::kUInt16, {{1, 2, 3}, {4, 5}, {6}});
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  const Bytes idx = read_bytes(idx_path), bin = read_bytes(bin_path);
  // Layout for S=3, D=4: lengths at 34, offsets at 46, document indices at 70, end at 102.
  auto with_idx = [&](auto edit) {
    Bytes b = idx;
    edit(&b);
    write_bytes(idx_path, b);
  };

  write_bytes(bin_path, Bytes(bin.begin(), bin.end() - 2));
  expect_rejected(prefix, bin_path, "truncated");
  write_bytes(bin_path, bin);

  with_idx([](Bytes* b) { (*b)[0] = 'X'; });
  expect_rejected(prefix, idx_path, "not a Megatron indexed dataset");
  with_idx([](Bytes* b) { b->assign({'G', 'I', 'F', '8', '9', 'a'}); });
  expect_rejected(prefix, idx_path, "not a Megatron indexed dataset");

  with_idx([](Bytes* b) { b->resize(20); });
  expect_rejected(prefix, idx_path, "truncated");
  with_idx([](Bytes* b) { b->resize(80); });
  expect_rejected(prefix, idx_path, "truncated");
  with_idx([](Bytes* b) { b->pop_back(); });
  expect_rejected(prefix, idx_path, "truncated");
  with_idx([](Bytes* b) { b->push_back(0); });
  expect_rejected(prefix, idx_path, "does not match the header");

  with_idx([](Bytes* b) { (*b)[9] = 2; });
  expect_rejected(prefix, idx_path, "unsupported index version 2");
  with_idx([](Bytes* b) { (*b)[17] = 9; });
  expect_rejected(prefix, idx_path, "unknown dtype code 9");
  with_idx([](Bytes* b) { (*b)[17] = 0; });
  expect_rejected(prefix, idx_path, "unknown dtype code 0");
  with_idx([](Bytes* b) { (*b)[17] = 7; });
  expect_rejected(prefix, idx_path, "float32");

  with_idx([](Bytes* b) { (*b)[46 + 8] = 8; });  // offset of sequence 1: 6 -> 8
  expect_rejected(prefix, idx_path, "not consistent with lengths");
  with_idx([](Bytes* b) { (*b)[34 + 4] = 0xff; (*b)[34 + 7] = 0xff; });  // length 1 negative
  expect_rejected(prefix, idx_path, "negative length");
  with_idx([](Bytes* b) { (*b)[70 + 16] = 0; });  // document indices 0,1,0,3
  expect_rejected(prefix, idx_path, "not monotonic");
  with_idx([](Bytes* b) { (*b)[70 + 24] = 2; });  // document indices 0,1,2,2
  expect_rejected(prefix, idx_path, "ends at 2");
  with_idx([](Bytes* b) { (*b)[70] = 1; });
  expect_rejected(prefix, idx_path, "must start with 0");

  // A lengths change that keeps offsets consistent is caught by the .bin size check.
  Bytes longer = idx;
  longer[34 + 8] = 2;  // sequence 2: 1 -> 2 tokens (last, so no later offset moves)
  write_bytes(idx_path, longer);
  expect_rejected(prefix, bin_path, "truncated");

  // Multimodal datasets append S int8 modes; they are valid and ignored.
  with_idx([](Bytes* b) { b->insert(b->end(), {0, 1, 0}); });
  IndexedDataset ds(prefix);
  EXPECT_EQ(read_sequence(ds, 1), (std::vector<int64_t>{4, 5}));
}

TEST_F(IndexedDatasetTest, OutOfRangeReadsAreLogicErrors) {
  const std::string prefix = path("ds");
  build(prefix, TokenDType::kUInt16, {{1, 2, 3}});
  IndexedDataset ds(prefix);
  int64_t out[4];
  EXPECT_THROW(ds.sequence_length(1), std::out_of_range);
  EXPECT_THROW(ds.read_tokens(1, 0, 1, out), std::out_of_range);
  EXPECT_THROW(ds.read_tokens(0, 1, 3, out), std::out_of_range);
  EXPECT_THROW(ds.read_tokens(0, 4, 0, out), std::out_of_range);
  EXPECT_THROW(ds.read_tokens(0, 1, SIZE_MAX, out), std::out_of_range);
  ds.read_tokens(0, 3, 0, out);  // empty read at the end is fine
}

TEST_F(IndexedDatasetTest, TokenOutOfRangeForDType) {
  const std::string prefix = path("ds");
  IndexedDatasetBuilder builder(prefix, TokenDType::kUInt16);
  const std::vector<int64_t> good = {1, 2}, too_big = {5, 70000}, negative = {-1};
  builder.add_document(good.data(), good.size());
  try {
    builder.add_document(too_big.data(), too_big.size());
    FAIL() << "70000 was accepted as uint16";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("70000"), std::string::npos) << msg;
    EXPECT_NE(msg.find("uint16"), std::string::npos) << msg;
    EXPECT_NE(msg.find("int32"), std::string::npos) << msg;
  }
  EXPECT_THROW(builder.add_document(negative.data(), negative.size()), UserError);
  // The rejected documents left no trace: the builder still writes a consistent dataset.
  builder.add_document(good.data(), good.size());
  builder.finalize();
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.num_sequences(), 2u);
  EXPECT_EQ(ds.num_tokens(), 4);
  EXPECT_THROW(builder.add_document(good.data(), good.size()), std::logic_error);
}

TEST_F(IndexedDatasetTest, UnfinalizedBuilderLeavesNothing) {
  const std::string prefix = path("ds");
  {
    IndexedDatasetBuilder builder(prefix, TokenDType::kInt32);
    const std::vector<int64_t> doc(1000, 3);
    builder.add_document(doc.data(), doc.size());
    EXPECT_TRUE(exists(prefix + ".bin.tmp-" + std::to_string(::getpid())));
    EXPECT_FALSE(exists(prefix + ".bin"));
    EXPECT_FALSE(exists(prefix + ".idx"));
  }
  EXPECT_FALSE(exists(prefix + ".bin"));
  EXPECT_FALSE(exists(prefix + ".idx"));
  EXPECT_TRUE(list_dir().empty());
}

TEST_F(IndexedDatasetTest, FinalizeRequiresClosedDocument) {
  IndexedDatasetBuilder builder(path("ds"), TokenDType::kUInt16);
  const std::vector<int64_t> seq = {1};
  builder.add_sequence(seq.data(), seq.size());
  EXPECT_THROW(builder.finalize(), std::logic_error);
}

TEST_F(IndexedDatasetTest, MergeEqualsDirectBuild) {
  const Docs a = {{1, 2, 3}, {}, {4}}, b = {{5, 6}, {7, 8, 9, 10}, {}};
  build(path("a"), TokenDType::kUInt16, a);
  build(path("b"), TokenDType::kUInt16, b);
  IndexedDatasetBuilder::merge({path("a"), path("b"), path("a")}, path("merged"));
  Docs all = a;
  all.insert(all.end(), b.begin(), b.end());
  all.insert(all.end(), a.begin(), a.end());
  build(path("direct"), TokenDType::kUInt16, all);
  EXPECT_EQ(read_bytes(path("merged.bin")), read_bytes(path("direct.bin")));
  EXPECT_EQ(read_bytes(path("merged.idx")), read_bytes(path("direct.idx")));
  IndexedDataset merged(path("merged"));
  EXPECT_EQ(merged.document_indices().to_vector(),
            (std::vector<int64_t>{0, 1, 1, 2, 3, 4, 4, 5, 5, 6}));

  build(path("wide"), TokenDType::kInt32, {{1}});
  try {
    IndexedDatasetBuilder::merge({path("a"), path("wide")}, path("bad"));
    FAIL() << "merged datasets of different dtypes";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(path("wide")), std::string::npos) << e.what();
  }
  EXPECT_FALSE(exists(path("bad.bin")));
  EXPECT_THROW(IndexedDatasetBuilder::merge({path("missing")}, path("bad")), UserError);
}

// ---- Cross-check against numpy (the way Megatron-LM writes datasets) ------------------------

using test::source_dir;
using test::venv_python;
std::string quote(const std::string& s) { return test::shell_quote(s); }

// Runs make_indexed_reference.py with `args`; fails the test (never skips) if it cannot run.
void run_reference(const std::string& args) {
  const std::string python = venv_python();
  ASSERT_FALSE(python.empty())
      << "no Python venv for the reference check: set MEGATRON_VENV or create "
         "~/.cache/megatron.cpp/venv-* with the project's requirements.txt (numpy)";
  ASSERT_TRUE(exists(python)) << python << " does not exist; set MEGATRON_VENV to a venv with numpy";
  const std::string script = source_dir() + "/tests/data/make_indexed_reference.py";
  ASSERT_TRUE(exists(script)) << script << " not found; build with -DMEGATRON_SOURCE_DIR=<repo> "
                                 "or set MEGATRON_SOURCE_DIR to the repository root";
  const std::string cmd = quote(python) + " " + quote(script) + " " + args;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "reference script failed: " << cmd
                                         << " (is numpy installed in that venv?)";
}

TEST_F(IndexedDatasetTest, MatchesNumpyReferenceUInt16) {
  const Docs docs = {{0, 1, 2}, {65535, 65499}, {}, {300, 301, 302, 303, 304}, {9}};
  std::string spec;
  for (size_t i = 0; i < docs.size(); ++i) {
    if (i > 0) spec += ";";
    for (size_t j = 0; j < docs[i].size(); ++j) spec += (j ? " " : "") + std::to_string(docs[i][j]);
  }
  ASSERT_NO_FATAL_FAILURE(
      run_reference("--prefix " + quote(path("py")) + " --dtype uint16 --tokens " + quote(spec)));
  build(path("cpp"), TokenDType::kUInt16, docs);
  EXPECT_EQ(read_bytes(path("cpp.bin")), read_bytes(path("py.bin")));
  EXPECT_EQ(read_bytes(path("cpp.idx")), read_bytes(path("py.idx")));
  IndexedDataset ds(path("py"));
  EXPECT_EQ(read_sequence(ds, 2), docs[3]);
}

TEST_F(IndexedDatasetTest, MatchesNumpyReferenceInt32FromSeed) {
  ASSERT_NO_FATAL_FAILURE(run_reference(
      "--prefix " + quote(path("py")) +
      " --dtype int32 --seed 1234 --num-docs 200 --vocab 2000000000 --max-len 300"
      " --tokens-out " + quote(path("tokens.txt"))));
  Docs docs;
  std::ifstream in(path("tokens.txt"));
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    docs.emplace_back(std::istream_iterator<int64_t>(fields), std::istream_iterator<int64_t>());
  }
  ASSERT_EQ(docs.size(), 200u);
  build(path("cpp"), TokenDType::kInt32, docs);
  EXPECT_EQ(read_bytes(path("cpp.bin")), read_bytes(path("py.bin")));
  EXPECT_EQ(read_bytes(path("cpp.idx")), read_bytes(path("py.idx")));
  IndexedDataset ds(path("py"));
  EXPECT_EQ(ds.num_documents(), 200u);
}

}  // namespace
}  // namespace megatron
