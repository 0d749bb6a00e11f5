// A Megatron .idx file (the input) beside a .bin of 4096 bytes: opened as training opens it
// (every header field and array validated), then every sequence's tokens read.
#include <fstream>

#include "core/errors.h"
#include "data/indexed_dataset.h"
#include "fuzz_target.h"

MEGATRON_FUZZ_TARGET(indexed_dataset) {
  const std::string prefix = megatron::fuzz::scratch_file("data");
  megatron::fuzz::scratch_file("data.idx");
  megatron::fuzz::scratch_file("data.bin");
  std::ofstream(prefix + ".idx", std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), std::streamsize(size));
  static const std::string bin = [] {
    std::string bytes(4096, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 7);
    return bytes;
  }();
  std::ofstream(prefix + ".bin", std::ios::binary | std::ios::trunc) << bin;
  try {
    const megatron::IndexedDataset dataset(prefix);
    std::vector<int64_t> tokens;
    for (size_t i = 0; i < dataset.num_sequences() && i < 4096; ++i) {
      const int64_t n = dataset.sequence_length(i);
      tokens.resize(size_t(n));
      dataset.read_tokens(i, 0, size_t(n), tokens.data());
    }
    (void)dataset.document_indices().to_vector();
  } catch (const megatron::UserError&) {
  }
}
