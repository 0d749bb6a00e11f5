// A .safetensors file (HF shards, native checkpoints) opened as every reader opens it: the header
// validated (JSON, dtypes, shapes, offsets inside the file, no overlaps, no unindexed bytes), the
// crc32 of the data checked when the metadata holds one, then every tensor viewed and its bytes
// read (floating tensors summed, as loading copies them).
#include <ATen/ATen.h>

#include <fstream>

#include "checkpoint/safetensors.h"
#include "core/errors.h"
#include "fuzz_target.h"

MEGATRON_FUZZ_TARGET(safetensors) {
  const std::string path = megatron::fuzz::scratch_file("model.safetensors");
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), std::streamsize(size));
  try {
    const megatron::SafetensorsFile file(path);
    file.verify_checksum();
    for (const std::string& name : file.names()) {
      const at::Tensor t = file.view(name);
      if (at::isFloatingType(t.scalar_type())) {
        (void)file.view_floating(name).to(at::kDouble).sum().item<double>();
      } else {
        (void)t.clone();  // every byte read
      }
    }
  } catch (const megatron::UserError& e) {
    megatron::fuzz::rejected(e);
  }
}
