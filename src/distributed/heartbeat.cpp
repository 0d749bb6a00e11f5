#include "distributed/heartbeat.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

namespace megatron::dist {

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
  std::thread([socket = static_cast<int>(fd)] {
    const char beat = 1;
    while (true) {
      // MSG_NOSIGNAL: a launcher gone away ends the beating, not the rank (no SIGPIPE).
      const ssize_t n = ::send(socket, &beat, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN && errno != EINTR) break;
      std::this_thread::sleep_for(std::chrono::duration<double>(kHeartbeatIntervalSeconds));
    }
    ::close(socket);
  }).detach();
}

}  // namespace megatron::dist
