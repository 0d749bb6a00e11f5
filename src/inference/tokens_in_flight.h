// A decode step's chosen tokens on their way to the host. On a GPU the copy is enqueued right
// after the step, into pinned memory, and marked with an event: the engine can launch the next
// step (fed these tokens on the device) before it waits, and then waits for this copy alone, not
// for the step behind it (EngineOptions::decode_ahead). Elsewhere the copy is made at once.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <optional>

namespace megatron {

class TokensInFlight {
 public:
  // Enqueues the copy of `on_device` ([b] int64 token ids) to the host.
  explicit TokensInFlight(at::Tensor on_device);
  const at::Tensor& on_device() const { return on_device_; }
  // [b] on the host, once the copy has landed (waits for it on a GPU).
  const at::Tensor& on_host();

 private:
  at::Tensor on_device_;
  at::Tensor on_host_;
  std::optional<c10::Event> copied_;
};

}  // namespace megatron
