// A packed SFT dataset as `megatron preprocess --sft` writes it and training reads it: the input
// is four files joined by a line "#### next ####" (P_input_ids_document.idx, its .bin,
// P_loss_mask_document.idx, its .bin), opened at --seq-length 16 (the two datasets checked
// against each other and the length), then every pack read as a training sample. Invariants:
// every vector of a sample holds seq_length entries, and cu_seqlens rises from 0 to seq_length.
#include <fstream>

#include "core/errors.h"
#include "data/sft_dataset.h"
#include "data/sft_preprocess.h"
#include "fuzz_target.h"

MEGATRON_FUZZ_TARGET(sft_dataset) {
  constexpr int64_t kSeqLength = 16;
  const std::string prefix = megatron::fuzz::scratch_file("sft");
  std::string_view rest = megatron::fuzz::as_text(data, size);
  for (const std::string& file : {megatron::sft_input_ids_prefix(prefix) + ".idx", megatron::sft_input_ids_prefix(prefix) + ".bin",
                                  megatron::sft_loss_mask_prefix(prefix) + ".idx", megatron::sft_loss_mask_prefix(prefix) + ".bin"}) {
    const auto [part, after] = megatron::fuzz::split(rest, "\n#### next ####\n");
    megatron::fuzz::scratch_file(file.substr(file.rfind('/') + 1));
    std::ofstream(file, std::ios::binary | std::ios::trunc).write(part.data(), std::streamsize(part.size()));
    rest = after;
  }
  try {
    const megatron::SftDataset dataset(prefix, kSeqLength, /*pad_id=*/0);
    for (size_t i = 0; i < dataset.size() && i < 1024; ++i) {
      const megatron::LtorSample sample = dataset.get(i);
      if (sample.tokens.size() != size_t(kSeqLength) || sample.labels.size() != size_t(kSeqLength) ||
          sample.loss_mask.size() != size_t(kSeqLength) || sample.position_ids.size() != size_t(kSeqLength)) {
        __builtin_trap();
      }
      if (sample.cu_seqlens.empty() || sample.cu_seqlens.front() != 0 || sample.cu_seqlens.back() != kSeqLength) __builtin_trap();
      for (size_t k = 1; k < sample.cu_seqlens.size(); ++k) {
        if (sample.cu_seqlens[k] <= sample.cu_seqlens[k - 1]) __builtin_trap();
      }
    }
  } catch (const megatron::UserError& e) {
    megatron::fuzz::rejected(e);
  }
}
