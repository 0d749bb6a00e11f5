// Local TCP ports for tests that start their own rendezvous.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "distributed/launcher.h"

namespace megatron::test {

// A port nobody listens on right now (the kernel's pick for port 0). Another process may take it
// before the test binds it: for rendezvous that must succeed, listening_port() below.
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// A socket already listening on a port the kernel picked, for rank 0's store to serve on
// (LaunchEnv::master_listen_fd), as `megatron launch --master-port 0` hands its rank 0: no other
// process can take the port first. The store owns the socket from then on and closes it.
struct ListeningPort {
  int fd = -1;
  int port = 0;
};

inline ListeningPort listening_port() {
  ListeningPort p;
  p.fd = dist::listen_on_free_port(p.port);
  return p;
}

}  // namespace megatron::test
