// Rendezvous of all ranks of a job over c10d's TCPStore (rank 0 serves it at MASTER_ADDR:
// MASTER_PORT), and creation of process groups over it. Gloo on CPU, NCCL on CUDA.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distributed/launch_env.h"
#include "distributed/process_group.h"

namespace megatron::dist {

class World {
 public:
  // A single process: no store, every group trivial.
  World();

  // Joins the job `env` describes with backend "gloo" or "nccl". Every rank calls this; it
  // returns when all WORLD_SIZE ranks have arrived, or throws UserError after `timeout` naming
  // the address and how many ranks came.
  static World connect(const LaunchEnv& env, const std::string& backend, std::chrono::milliseconds timeout);

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& backend() const { return backend_; }

  // The group of `ranks` (sorted global ranks, this rank among them). Collective over its
  // members: each must ask for it, and every rank must ask for its groups in the same order.
  // Asking again for the same ranks returns the same group.
  Group group(const std::vector<int>& ranks);
  Group everyone();

  // Closes every group's communicators (NCCL's finalize + destroy; a no-op for Gloo), as
  // destroy_process_group does. Only after a normal end, with no collective pending: a rank
  // leaving on an error skips it, since a communicator whose peer has gone cannot finish.
  void shutdown();

 private:
  struct Shared;
  std::shared_ptr<Shared> shared_;
  int rank_ = 0, size_ = 1;
  std::string backend_ = "gloo";
};

// Turns PyTorch's collective flight recorder off unless TORCH_FR_BUFFER_SIZE asks for it. It is
// on by default (Gloo included), gathers a traceback per collective for a dump that only its
// Python tooling reads, and registers each new group in a map outside its lock, so two groups
// first used from two threads at once (ranks run as threads, a reduction issued from autograd's
// thread) can crash the process. Sets an environment variable: call before any thread starts.
void turn_off_flight_recorder_unless_asked();

}  // namespace megatron::dist
