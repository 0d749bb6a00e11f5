// The subcommands of the `megatron` binary. Each takes the arguments after its name and
// returns the process exit status; user errors propagate as UserError to main().
#pragma once

#include <string>
#include <vector>

namespace megatron::cli {

using Args = std::vector<std::string>;

int train(const Args& args);
int preprocess(const Args& args);
int version(const Args& args);

}  // namespace megatron::cli
