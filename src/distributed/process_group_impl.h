// The c10d side of Group and Work, shared by process_group.cpp and world.cpp only.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "distributed/process_group.h"

namespace megatron::dist {

struct Group::Impl {
  c10::intrusive_ptr<c10d::Backend> backend;  // null for a single process
  int rank = 0;
  int size = 1;
  std::vector<int> global_ranks{0};
  bool supports_avg = false;
};

struct Work::Impl {
  c10::intrusive_ptr<c10d::Work> work;
  std::vector<at::Tensor> keep_alive;  // the tensors the backend reads or writes until done
};

}  // namespace megatron::dist
