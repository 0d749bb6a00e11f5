// What every entry point of a megatron program does around its subcommand: line-buffered stdout
// and a heartbeat under `megatron launch`, and user errors as "error: ..." with exit status 2.
#include <c10/util/Exception.h>
#include <gloo/common/error.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "cli/commands.h"
#include "core/errors.h"
#include "distributed/heartbeat.h"
#include "distributed/world.h"

namespace megatron::cli {

void set_up_under_launch() {
  // Gloo writes to its peers' sockets with writev, which raises SIGPIPE once a peer has gone: a
  // rank sending when its peer was killed died of the signal instead of reporting the failed
  // collective and the peer's address (a CI run of TwoNodes missed that report; it depends on
  // whether the rank is sending or receiving at the time). Ignored, the write fails with EPIPE,
  // which Gloo throws as an IoException, reported below.
  std::signal(SIGPIPE, SIG_IGN);
  // Under `megatron launch` stdout is a pipe, which stdio would block-buffer: lines would
  // arrive late and be lost when a rank is stopped.
  if (std::getenv("MEGATRON_LINE_BUFFERED") != nullptr) std::setvbuf(stdout, nullptr, _IOLBF, 0);
  dist::turn_off_flight_recorder_unless_asked();
  dist::start_heartbeat_from_environment();  // the launcher tells a frozen rank by its silence
}

int run_reporting_errors(const std::function<int()>& run) {
  try {
    return run();
  } catch (const UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const ::gloo::IoException& e) {
    // A peer's connection closed or reset, or a collective timed out: not this rank's fault, and
    // the peer's address in the message says which node to look at.
    std::fprintf(stderr,
                 "error: communication with another rank failed (%s): a rank of this job stopped, is stuck, or its node "
                 "became unreachable; the launcher of its node reports which and why. Resume from the last checkpoint "
                 "with --load\n",
                 e.what());
    return 1;
  } catch (const std::exception& e) {  // e.g. a failed fork or pipe in the launcher
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 1;
  }
}

}  // namespace megatron::cli
