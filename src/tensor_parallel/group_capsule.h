// Carries a dist::Group through an autograd context (ctx->saved_data holds IValues only).
#pragma once

#include <ATen/core/ivalue.h>

#include "distributed/process_group.h"

namespace megatron::tp {

struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(dist::Group g) : group(std::move(g)) {}
  dist::Group group;
};

inline at::IValue to_ivalue(const dist::Group& g) { return at::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(g)); }

inline dist::Group group_of(const at::IValue& v) {
  return c10::static_intrusive_pointer_cast<GroupCapsule>(v.toCapsule())->group;
}

}  // namespace megatron::tp
