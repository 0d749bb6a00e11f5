// Generation under tensor parallelism where requests reach one rank only (the server). Every TP
// rank runs an engine over its shard of the model; the engines stay in step when each is asked the
// same things in the same order (the logits are gathered whole, so every rank draws the same
// tokens; engine.h). The first rank's engine leads: what it is asked between two steps (requests
// submitted, cancelled) goes to the other ranks with the step, over the TP group, and their
// engines do the same before stepping (follow_leading_engine).
//
//   rank 0:  LeadingEngine lead(engine, tp);  ... lead.submit(r); lead.step(); ...  lead.finish();
//   others:  follow_leading_engine(engine, tp);  // returns after lead.finish()
//
// One rank alone: the calls go straight to the engine, nothing is sent.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "inference/engine.h"

namespace megatron {

class LeadingEngine {
 public:
  // `device`: where the TP group's backend takes tensors (CUDA for NCCL).
  LeadingEngine(Engine& engine, dist::Group tp, const c10::Device& device);

  Engine& engine() { return engine_; }
  // As Engine::submit and cancel; recorded for the followers once the engine has taken them.
  int64_t submit(GenerationRequest request);
  bool cancel(int64_t id);
  // Sends what was asked since the last step, then steps (the followers step with it).
  void step();
  // Nothing to step while waiting for requests: tells the followers so, before a collective's
  // timeout would end their wait (the server calls it every few seconds when idle).
  void keep_alive();
  // The followers return; no call after it.
  void finish();

 private:
  void send(bool step, bool stop);

  Engine& engine_;
  dist::Group tp_;
  c10::Device device_;
  std::vector<std::string> record_;  // JSON of each call since the last send
  bool finished_ = false;
};

// Runs the engine as the first rank of `tp` leads it, until the leader finishes.
void follow_leading_engine(Engine& engine, const dist::Group& tp, const c10::Device& device);

}  // namespace megatron
