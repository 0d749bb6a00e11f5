// SentencePiece .model files through libsentencepiece, with the semantics of Megatron's
// GPTSentencePieceTokenizer (vocab = pieces, EOD = EOS, nothing added) and Llama2Tokenizer
// (BOS added when special tokens are requested).
#include "tokenizer/sentencepiece_tokenizer.h"

#include <sys/stat.h>

#include <sentencepiece_processor.h>

#include "core/errors.h"
#include "core/files.h"

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

// Protocol Buffers' wire format, as far as check_pieces needs it: a varint, or false past the end.
bool read_varint(std::string_view bytes, size_t* at, uint64_t* value) {
  *value = 0;
  for (int shift = 0; shift < 64 && *at < bytes.size(); shift += 7) {
    const auto byte = static_cast<uint8_t>(bytes[(*at)++]);
    *value |= uint64_t(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

// The fields of one message: calls on_field(number, payload) for each length-delimited field
// (the others are skipped); false when the bytes are not a well-formed message.
template <typename OnField>
bool for_each_field(std::string_view bytes, OnField on_field) {
  size_t at = 0;
  while (at < bytes.size()) {
    uint64_t key = 0, value = 0;
    if (!read_varint(bytes, &at, &key)) return false;
    switch (key & 7) {
      case 0: if (!read_varint(bytes, &at, &value)) return false; break;
      case 1: at += 8; break;
      case 5: at += 4; break;
      case 2:
        if (!read_varint(bytes, &at, &value) || value > bytes.size() - at) return false;
        on_field(key >> 3, bytes.substr(at, value));
        at += value;
        break;
      default: return false;
    }
    if (at > bytes.size()) return false;
  }
  return true;
}

// libsentencepiece throws from code that cannot pass an exception on (std::terminate: the
// process aborts) when a piece is empty or holds a NUL byte (its trie takes C strings and refuses
// zero-length keys). A ModelProto's field 1 is a SentencePiece whose field 1 is the piece's
// text: such a piece is refused here, naming its index. Bytes that are not a well-formed message
// are left to libsentencepiece's parser, which reports them.
void check_pieces(std::string_view model, const std::string& path) {
  int64_t index = 0;
  for_each_field(model, [&](uint64_t field, std::string_view payload) {
    if (field != 1) return;
    std::string_view text;
    for_each_field(payload, [&](uint64_t piece_field, std::string_view value) {
      if (piece_field == 1) text = value;
    });
    if (text.empty() || text.find('\0') != std::string_view::npos) {
      throw UserError("--tokenizer-model " + path + ": piece " + std::to_string(index) + (text.empty() ? " is empty" : " holds a NUL byte") +
                      ", which SentencePiece cannot load: the file is damaged or not a SentencePiece model");
    }
    ++index;
  });
}

class SentencePieceTokenizer : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, bool add_bos) : path_(path), add_bos_(add_bos) {
    struct stat st {};
    if (path.empty()) throw UserError("--tokenizer-model is required for a SentencePiece tokenizer");
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      throw UserError("--tokenizer-model " + path + ": no such file; pass a SentencePiece .model file");
    }
    const std::string model = read_file(path);
    check_pieces(model, path);
    auto status = sp_.LoadFromSerializedProto(model);
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
    const auto status = sp_.Encode(text, &pieces);
    if (!status.ok()) {  // a model whose normalizer and pieces do not fit together
      throw UserError("--tokenizer-model " + path_ + ": SentencePiece could not encode a text (" + status.ToString() +
                      "): the model is damaged");
    }
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
  std::string path_;
  bool add_bos_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path, bool add_bos) {
  return std::make_unique<SentencePieceTokenizer>(path, add_bos);
}

}  // namespace megatron::tok
