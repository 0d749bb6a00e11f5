#include "train/batch_transfer.h"

#include <ATen/ATen.h>

#include <string>

#include "core/errors.h"

namespace megatron {
namespace {

// `f` applied to each defined tensor of `b`, extra fields too (undefined ones stay undefined).
template <typename F>
Batch map_batch(const Batch& b, F&& f) {
  Batch out = b;
  out.for_each([&](const std::string&, at::Tensor& t) {
    if (t.defined()) t = f(t);
  });
  return out;
}

}  // namespace

Batch pinned(const Batch& b) {
  return map_batch(b, [](const at::Tensor& t) { return t.pin_memory(); });
}

Batch to_device(Batch b, const at::Device& device) {
  if (device.is_cpu()) return b;
  return map_batch(b, [&](const at::Tensor& t) { return t.to(device, /*non_blocking=*/true); });
}

void copy_batch(const Batch& from, Batch& into, const at::Device& device) {
  from.for_each([&](const std::string& name, const at::Tensor& src) {
    at::Tensor& dst = into.field(name);
    if (!dst.defined() && src.defined()) dst = at::empty(src.sizes(), src.options().device(device).pinned_memory(false));
    if (src.defined() != dst.defined() || (src.defined() && !src.sizes().equals(dst.sizes()))) {
      throw UserError(std::string("--cuda-graph-impl: the batch's ") + name +
                      " changed shape between iterations; a captured step needs the same shapes every iteration "
                      "(train without --cuda-graph-impl)");
    }
    if (src.defined()) dst.copy_(src, /*non_blocking=*/true);
  });
}

}  // namespace megatron
