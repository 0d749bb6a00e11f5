#include "distributed/heartbeat.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

namespace megatron::dist {
namespace {

// One byte on the socket; false once the launcher's end is gone. MSG_NOSIGNAL: a launcher gone
// away ends the beating, not the rank (no SIGPIPE); a full socket (EAGAIN) is a beat not needed.
bool beat(int socket) {
  const char byte = 1;
  return ::send(socket, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT) >= 0 || errno == EAGAIN || errno == EINTR;
}

}  // namespace

void start_heartbeat_from_environment() {
  const char* value = std::getenv(kHeartbeatFdVariable);
  if (value == nullptr || *value == '\0') return;
  char* end = nullptr;
  const long fd = std::strtol(value, &end, 10);
  struct stat st {};
  // Only a socket: a stale variable naming some other descriptor must not be written to.
  if (*end != '\0' || fd < 3 || fd > 1 << 20 || ::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) return;
  // Not for this rank's own children (a nested launch, helpers it runs): they would hold the
  // socket open without beating.
  ::unsetenv(kHeartbeatFdVariable);
  ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  // The first beat is sent here, before this returns: from then on the launcher watches this
  // rank. Left to the thread, a rank that froze at once (before the thread first ran, as on a
  // loaded machine) would never be watched, and its launch would wait for it forever.
  const int socket = static_cast<int>(fd);
  if (!beat(socket)) {
    ::close(socket);
    return;
  }
  std::thread([socket] {
    // Signals are for the rank's own threads: a process-directed SIGTERM delivered to this one
    // would take its default action (exit) even where the rank waits for it with sigwait, as
    // `megatron serve` does to drain before stopping.
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    do {
      std::this_thread::sleep_for(std::chrono::duration<double>(kHeartbeatIntervalSeconds));
    } while (beat(socket));
    ::close(socket);
  }).detach();
}

}  // namespace megatron::dist
