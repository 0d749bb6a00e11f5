// A .npy file as the dataset index caches are read back (memory-mapped, header parsed, size
// checked against the shape), then every element read.
#include <fstream>
#include <stdexcept>

#include "data/npy_file.h"
#include "fuzz_target.h"

MEGATRON_FUZZ_TARGET(npy) {
  const std::string path = megatron::fuzz::scratch_file("cache.npy");
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), std::streamsize(size));
  try {
    const megatron::NpyArray array = megatron::NpyArray::map_file(path);
    uint64_t sum = 0;  // wraps: it only makes every element read
    for (size_t i = 0; i < array.size(); ++i) sum += uint64_t(array[i]);
    (void)sum;
  } catch (const std::runtime_error&) {  // map_file's documented answer to a bad file
  }
}
