// Files torch.save wrote (its zip format, PyTorch >= 1.6), read without Python: the archive's
// data.pkl through pickle::parse, tensors rebuilt over the storages under data/ on demand.
// Megatron's legacy checkpoints (model_optim_rng.pt), its torch_dist common.pt and each tensor
// item inside a distributed checkpoint's .distcp files are such files.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "checkpoint/pickle.h"

namespace caffe2::serialize {
class PyTorchStreamReader;
}

namespace megatron {

class TorchSaveFile {
 public:
  // A file on disk.
  explicit TorchSaveFile(const std::string& path);
  // `bytes` in memory (kept); `what` names them in errors (file and item).
  TorchSaveFile(std::string bytes, std::string what);
  ~TorchSaveFile();
  TorchSaveFile(const TorchSaveFile&) = delete;
  TorchSaveFile& operator=(const TorchSaveFile&) = delete;

  // What was saved.
  const pickle::Value& root() const { return *root_; }
  // Whether `v` is a saved tensor (torch._utils._rebuild_tensor_v2 over a storage).
  static bool is_tensor(const pickle::Value& v);
  // The tensor `v` stands for, as a CPU tensor owning its data. UserError naming the file when
  // `v` is no tensor or its storage is missing.
  at::Tensor tensor(const pickle::Value& v) const;

 private:
  void open(std::shared_ptr<caffe2::serialize::PyTorchStreamReader> reader);
  // [numel] of its dtype, read from the archive at each call: nothing is kept, so reading a
  // checkpoint tensor by tensor holds one tensor at a time.
  at::Tensor storage(const pickle::Value& persistent_id) const;

  std::string what_;
  std::string bytes_;  // the in-memory file, when there is one
  std::shared_ptr<caffe2::serialize::PyTorchStreamReader> reader_;
  pickle::ValuePtr root_;
};

}  // namespace megatron
