// `megatron launch`: start N ranks of a subcommand on this node, like torchrun.
#include <cstdio>

#include "cli/commands.h"
#include "distributed/launcher.h"

namespace megatron::cli {

int launch(const Args& args) {
  const dist::LaunchOptions options = dist::parse_launch_arguments(args);
  if (options.help) {
    std::fputs(dist::launch_help().c_str(), stdout);
    return 0;
  }
  std::fflush(stdout);  // the children share our stdout; nothing of ours may come after theirs
  return dist::run_launch(options);
}

}  // namespace megatron::cli
