// SentencePiece .model files through libsentencepiece, with the semantics of Megatron's
// GPTSentencePieceTokenizer (vocab = pieces, EOD = EOS, nothing added) and Llama2Tokenizer
// (BOS added when special tokens are requested).
#include "tokenizer/sentencepiece_tokenizer.h"

#include <sys/stat.h>

#include <sentencepiece_processor.h>

#include "core/errors.h"

// Room for both programs' FLAGS_minloglevel. Debian's libsentencepiece defines one (its absl
// flag object, 24 bytes with a vtable) and LibTorch's libc10 another (an int of 4); the dynamic
// linker binds every reference to the first definition it meets, which was libc10's, and
// libsentencepiece's constructor then wrote its 24 bytes over libc10's neighbouring globals:
// FLAGS_caffe2_use_fatal_for_enforce turned true, so every failed allocation (a model too large
// for the machine) aborted the process instead of throwing an error. Defined here, in the
// program itself, the symbol binds to this buffer for both libraries: libsentencepiece builds its
// flag in it and libc10's own globals stay as LibTorch set them (tests/tokenizer/
// test_sentencepiece.cpp checks). libc10 reads the buffer's first bytes as its log threshold,
// as it did before; it never writes it.
alignas(64) unsigned char FLAGS_minloglevel[64];

namespace megatron::tok {

namespace {

class SentencePieceTokenizer : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, bool add_bos) : add_bos_(add_bos) {
    struct stat st {};
    if (path.empty()) throw UserError("--tokenizer-model is required for a SentencePiece tokenizer");
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      throw UserError("--tokenizer-model " + path + ": no such file; pass a SentencePiece .model file");
    }
    auto status = sp_.Load(path);
    if (!status.ok()) {
      throw UserError("--tokenizer-model " + path + ": not a SentencePiece model (" +
                      status.ToString() + "); pass the tokenizer.model file, or use "
                      "--tokenizer-type HuggingFaceTokenizer for a tokenizer.json");
    }
  }

  std::string decode(const std::vector<int64_t>& ids) const override {
    std::vector<int> pieces;
    pieces.reserve(ids.size());
    for (int64_t id : ids) {
      if (id >= 0 && id < sp_.GetPieceSize()) pieces.push_back(static_cast<int>(id));
    }
    std::string out;
    sp_.Decode(pieces, &out).IgnoreError();
    return out;
  }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  std::optional<int64_t> bos_id() const override { return optional_id(sp_.bos_id()); }
  std::optional<int64_t> eos_id() const override { return optional_id(sp_.eos_id()); }
  std::optional<int64_t> token_to_id(std::string_view token) const override {
    int id = sp_.PieceToId(std::string(token));
    // PieceToId answers unk for unknown pieces; only the unk piece itself maps to unk.
    if (id == sp_.unk_id() && sp_.IdToPiece(id) != token) return std::nullopt;
    return id;
  }
  std::optional<std::string> id_to_token(int64_t id) const override {
    if (id < 0 || id >= sp_.GetPieceSize()) return std::nullopt;
    return sp_.IdToPiece(static_cast<int>(id));
  }

 protected:
  std::vector<int64_t> do_encode(std::string_view text, bool add_special_tokens) const override {
    std::vector<int> pieces;
    sp_.Encode(text, &pieces).IgnoreError();
    std::vector<int64_t> ids;
    ids.reserve(pieces.size() + 1);
    if (add_special_tokens && add_bos_ && sp_.bos_id() >= 0) ids.push_back(sp_.bos_id());
    ids.insert(ids.end(), pieces.begin(), pieces.end());
    return ids;
  }

 private:
  static std::optional<int64_t> optional_id(int id) {
    return id >= 0 ? std::optional<int64_t>(id) : std::nullopt;
  }
  sentencepiece::SentencePieceProcessor sp_;
  bool add_bos_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path, bool add_bos) {
  return std::make_unique<SentencePieceTokenizer>(path, add_bos);
}

}  // namespace megatron::tok
