// The message of the UserError a call throws ("" when it returns): tests of bad input assert on
// what the user is told.
#pragma once

#include <functional>
#include <string>

#include "core/errors.h"

namespace megatron::test {

inline std::string user_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace megatron::test
