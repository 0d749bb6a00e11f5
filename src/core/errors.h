// User-facing errors. Anything caused by user input (flags, config files, data files,
// checkpoints) throws UserError with what was wrong, where, and what to do; the CLI prints
// "error: <message>" and exits with status 2. Internal invariants use TORCH_CHECK instead.
#pragma once

#include <stdexcept>
#include <string>

namespace megatron {

class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace megatron
