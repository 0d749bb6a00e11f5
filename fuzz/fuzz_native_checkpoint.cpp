// A native checkpoint's state.json (the input) beside the model file of a real one (a tiny Llama
// trained one step, once per process), read as `megatron convert --from native --to hf` reads
// it: format version, the saved model configuration, the saved layout, then every tensor through
// the resharding reader and out as an HF checkpoint. Whatever state.json says -- sizes, layouts,
// types -- must end in an error naming the file, or in a checkpoint written.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli/commands.h"
#include "core/errors.h"
#include "fuzz_target.h"

namespace {

// The checkpoint directory (iter_0000001 of a one-step run), made once.
const std::string& trained_checkpoint() {
  static const std::string dir = [] {
    const std::string save = megatron::fuzz::scratch_file("ckpt");
#ifdef MEGATRON_LIBFUZZER
    // The training and conversion logs would bury libFuzzer's own; errors still reach stderr.
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
#endif
    const int status = megatron::cli::train({"--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
                                             "--ffn-hidden-size", "32", "--seq-length", "8", "--max-position-embeddings", "8",
                                             "--tokenizer-type", "NullTokenizer", "--vocab-size", "31", "--mock-data",
                                             "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "1",
                                             "--lr", "1e-3", "--save", save, "--cpu-threads", "1", "--device", "cpu",
                                             "--no-save-optim", "--no-save-rng"});
    if (status != 0) std::abort();
    return save + "/iter_0000001";
  }();
  return dir;
}

}  // namespace

MEGATRON_FUZZ_TARGET(native_checkpoint) {
  const std::string& dir = trained_checkpoint();
  static const std::string original = [&] {
    std::ifstream in(dir + "/state.json", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }();
  std::ofstream(dir + "/state.json", std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), std::streamsize(size));
  const std::string out = megatron::fuzz::scratch_file("hf");
  std::filesystem::remove_all(out);  // the last input's export
  try {
    (void)megatron::cli::convert({"--from", "native", "--to", "hf", "--load", dir, "--save", out});
  } catch (const megatron::UserError& e) {
    megatron::fuzz::rejected(e);
  }
  std::ofstream(dir + "/state.json", std::ios::binary | std::ios::trunc) << original;
}
