// Megatron's --check-for-nan-in-loss-and-grad (on by default): a run whose loss or gradient norm
// stops being finite ends at that iteration with an error naming it, instead of skipping the
// update and going on (--no-check-for-nan-in-loss-and-grad keeps skipping and counting, as
// Megatron's "number of nan iterations"). Off under --fp16 with a dynamic loss scale, where an
// overflowing step is the scaler's signal, not a divergence (as Megatron turns it off).
//
// Megatron reads the loss back every micro-batch; here each iteration's loss and gradient norm
// are copied to host memory without waiting and read one iteration later, when the GPU has long
// finished them, so the check never stalls the host on the step in flight. Nothing is saved in
// between: a checkpoint first checks every iteration before it (check_all).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>

#include <deque>
#include <optional>
#include <string>

namespace megatron {

class DivergenceCheck {
 public:
  DivergenceCheck(bool enabled, const c10::Device& device);
  // After iteration `iteration`'s step was queued: its loss [] and gradient norm [] (any float dtype).
  void add(int64_t iteration, const at::Tensor& loss, const at::Tensor& grad_norm);
  // The first iteration with a loss or gradient norm that is not finite, as an error message; nullopt
  // if none. check_lagged() leaves the latest iteration for later (on a GPU its copy may be in
  // flight); check_all() waits for it: before a checkpoint or the end of the run.
  std::optional<std::string> check_lagged() { return check(1); }
  std::optional<std::string> check_all() { return check(0); }

 private:
  struct Pending {
    int64_t iteration = 0;
    at::Tensor host;                  // [2] fp64: loss, gradient norm (in host memory once ready)
    std::optional<c10::Event> ready;  // recorded after the copy (GPU runs)
  };
  std::optional<std::string> check(size_t keep);
  bool enabled_;
  c10::Device device_;
  std::deque<Pending> pending_;
};

}  // namespace megatron
