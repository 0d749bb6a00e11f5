#include "distributed/world.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "core/errors.h"
#include "distributed/process_group_impl.h"

namespace megatron::dist {

struct World::Shared {
  c10::intrusive_ptr<c10d::Store> store;
  std::chrono::milliseconds timeout{0};
  std::string master;                                   // "addr:port", for messages
  std::shared_ptr<::gloo::transport::Device> gloo_device;
  std::map<std::vector<int>, Group> groups;
  std::vector<c10::intrusive_ptr<c10d::Backend>> backends;  // every group's, for shutdown()
};

namespace {

std::string seconds(std::chrono::milliseconds t) { return std::to_string(t.count() / 1000.0).substr(0, 6) + " s"; }

// Gloo binds to an interface: GLOO_SOCKET_IFNAME when set (as PyTorch), loopback for a job on
// this host, else whatever address this host's name resolves to.
std::shared_ptr<::gloo::transport::Device> make_gloo_device(const std::string& master_addr) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname != '\0') {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  if (master_addr == "127.0.0.1" || master_addr == "localhost") {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

World::World() = default;

World World::connect(const LaunchEnv& env, const std::string& backend, std::chrono::milliseconds timeout) {
  World w;
  w.rank_ = env.rank;
  w.size_ = env.world_size;
  w.backend_ = backend;
  if (backend != "gloo" && backend != "nccl") throw UserError("unknown distributed backend '" + backend + "'");
#ifndef USE_C10D_NCCL
  if (backend == "nccl") throw UserError("this build has no NCCL: build with CUDA (-DMEGATRON_CUDA=ON) or train on CPU");
#endif
  w.shared_ = std::make_shared<Shared>();
  w.shared_->timeout = timeout;
  w.shared_->master = env.master_addr + ":" + std::to_string(env.master_port);
  if (env.world_size == 1) return w;

  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(env.master_port);
  o.isServer = env.rank == 0 && !env.agent_store;  // under torchrun's agent, its store is the server
  o.numWorkers = static_cast<size_t>(env.world_size);
  o.waitWorkers = false;  // we count arrivals ourselves, to say how many came
  o.timeout = timeout;
  if (o.isServer && env.master_listen_fd >= 0) o.masterListenFd = env.master_listen_fd;
  try {
    w.shared_->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
    if (env.agent_store) {
      // The agent's store outlives a restart: each attempt's keys apart, as torch.distributed's.
      w.shared_->store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + std::to_string(env.restart_count), w.shared_->store);
    }
    w.shared_->store->add("megatron/joined", 1);
    if (env.rank == 0) {
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      while (w.shared_->store->add("megatron/joined", 0) < env.world_size) {
        if (std::chrono::steady_clock::now() > deadline) {
          throw UserError("rendezvous at " + w.shared_->master + " timed out after " + seconds(timeout) + ": " +
                          std::to_string(w.shared_->store->add("megatron/joined", 0)) + " of " +
                          std::to_string(env.world_size) +
                          " ranks joined. Start every rank (WORLD_SIZE processes) with the same MASTER_ADDR and "
                          "MASTER_PORT, or raise --distributed-timeout-minutes");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      w.shared_->store->set("megatron/ready", std::vector<uint8_t>{1});
    } else {
      w.shared_->store->wait({"megatron/ready"}, timeout);
    }
  } catch (const UserError&) {
    throw;
  } catch (const c10::Error& e) {
    throw UserError("rank " + std::to_string(env.rank) + ": rendezvous at " + w.shared_->master + " failed after " +
                    seconds(timeout) + " (" + e.what_without_backtrace() +
                    "). Check that rank 0 runs and every rank uses the same MASTER_ADDR and MASTER_PORT, or raise "
                    "--distributed-timeout-minutes");
  }
  if (backend == "gloo") w.shared_->gloo_device = make_gloo_device(env.master_addr);
  return w;
}

void World::shutdown() {
  if (!shared_) return;
  for (auto& backend : shared_->backends) backend->shutdown();
  shared_->backends.clear();
}

Group World::everyone() {
  std::vector<int> all(size_);
  for (int i = 0; i < size_; ++i) all[i] = i;
  return group(all);
}

Group World::group(const std::vector<int>& ranks) {
  TORCH_CHECK(!ranks.empty() && std::is_sorted(ranks.begin(), ranks.end()), "World::group: ranks must be sorted");
  auto self = std::find(ranks.begin(), ranks.end(), rank_);
  TORCH_CHECK(self != ranks.end(), "World::group: rank ", rank_, " is not a member");
  if (ranks.size() == 1) return Group();
  if (auto it = shared_->groups.find(ranks); it != shared_->groups.end()) return it->second;

  auto impl = std::make_shared<Group::Impl>();
  impl->rank = static_cast<int>(self - ranks.begin());
  impl->size = static_cast<int>(ranks.size());
  impl->global_ranks = ranks;
  impl->supports_avg = backend_ == "nccl";
  std::string key = "megatron/group";
  for (int r : ranks) key += "_" + std::to_string(r);
  auto store = c10::make_intrusive<c10d::PrefixStore>(key, shared_->store);
  try {
    if (backend_ == "gloo") {
      auto options = c10d::ProcessGroupGloo::Options::create(shared_->timeout);
      options->devices.push_back(shared_->gloo_device);
      impl->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, impl->rank, impl->size, options);
    } else {
#ifdef USE_C10D_NCCL
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = shared_->timeout;
      impl->backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, impl->rank, impl->size, options);
#endif
    }
  } catch (const c10::Error& e) {
    throw UserError("rank " + std::to_string(rank_) + ": creating the " + backend_ + " process group of ranks " +
                    Group(impl).describe() + " failed: " + e.what_without_backtrace());
  }
  shared_->backends.push_back(impl->backend);
  Group g(impl);
  shared_->groups.emplace(ranks, g);
  return g;
}

void turn_off_flight_recorder_unless_asked() { setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0); }

}  // namespace megatron::dist
