// Liveness of a rank, as `megatron launch` watches it. The launcher hands each rank one end of a
// socket pair (its descriptor number in MEGATRON_HEARTBEAT_FD); a thread of the rank sends one
// byte on it every kHeartbeatIntervalSeconds. A rank waiting in a collective for a peer keeps
// beating; a rank that is stopped (SIGSTOP, a debugger, a frozen container) falls silent, and the
// launcher names it before the peers' collective timeouts would blame themselves.
#pragma once

namespace megatron::dist {

inline constexpr const char* kHeartbeatFdVariable = "MEGATRON_HEARTBEAT_FD";
inline constexpr double kHeartbeatIntervalSeconds = 1.0;

// Rank side: when MEGATRON_HEARTBEAT_FD names a socket, starts the thread that beats on it
// (detached; it ends with the process, or when the launcher's end closes). Does nothing
// otherwise (a rank started by another launcher).
void start_heartbeat_from_environment();

}  // namespace megatron::dist
