// Generation under tensor and pipeline parallelism where requests reach one rank only (the
// server). Every rank runs an engine over its shard of the model; the engines stay in step when
// each is asked the same things in the same order (every rank ends a forward with the same whole
// logits, so each draws the same tokens; engine.h). The first rank's engine leads: what it is
// asked between two steps (requests submitted, cancelled) goes to the other ranks with the step,
// over the group given (the model-parallel group: TP x PP), and their engines do the same before
// stepping (follow_leading_engine).
//
//   rank 0:  LeadingEngine lead(engine, group);  ... lead.submit(r); lead.step(); ...  lead.finish();
//   others:  follow_leading_engine(engine, group);  // returns after lead.finish()
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
  LeadingEngine(Engine& engine, dist::Group group, const c10::Device& device);

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
  dist::Group group_;  // the ranks that run the engines
  c10::Device device_;
  std::vector<std::string> record_;  // JSON of each call since the last send
  bool finished_ = false;
};

// Runs the engine as the first rank of `group` leads it, until the leader finishes.
void follow_leading_engine(Engine& engine, const dist::Group& group, const c10::Device& device);

}  // namespace megatron
