// Runs a body on `world` ranks as threads of the test process, joined in one real Gloo group
// (rendezvous on a local port rank 0 already listens on): collectives tested without launching processes. Failures
// inside a thread are recorded by gtest as usual.
#pragma once

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "distributed/world.h"
#include "support/free_port.h"

namespace megatron::test {

// The same with each rank's World, for bodies that make groups of some of the ranks.
inline void on_gloo_worlds(int world, const std::function<void(int rank, dist::World& w)>& body) {
  const ListeningPort port = listening_port();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      dist::LaunchEnv env;
      env.rank = rank;
      env.world_size = world;
      env.master_port = port.port;
      if (rank == 0) env.master_listen_fd = port.fd;
      dist::World w = dist::World::connect(env, "gloo", std::chrono::seconds(30));
      body(rank, w);
    });
  }
  for (auto& t : threads) t.join();
}

inline void on_gloo_ranks(int world, const std::function<void(int rank, const dist::Group& everyone)>& body) {
  on_gloo_worlds(world, [&](int rank, dist::World& w) { body(rank, w.everyone()); });
}

}  // namespace megatron::test
