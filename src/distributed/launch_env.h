// Where this process sits in a distributed job, read from the environment its launcher left:
// `megatron launch` or torchrun (RANK, WORLD_SIZE, ...), Slurm's srun (SLURM_PROCID, ...), or
// nothing at all (a single process). Rendezvous and ParallelState start from this.
#pragma once

#include <string>
#include <vector>

namespace megatron::dist {

// Set by `megatron launch --master-port 0` for rank 0 only (LaunchEnv::master_listen_fd).
inline constexpr const char* kMasterListenFdVariable = "MEGATRON_MASTER_LISTEN_FD";

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // rank among the processes on this node
  int local_world_size = 1;  // processes on this node
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single";  // which variables it came from: "torchrun", "slurm" or "single"
  // torchrun's agent already serves the rendezvous store at MASTER_ADDR:MASTER_PORT
  // (TORCHELASTIC_USE_AGENT_STORE=True): every rank connects to it as a client, its keys under
  // the restart attempt's prefix (TORCHELASTIC_RESTART_COUNT), as torch.distributed does.
  bool agent_store = false;
  int restart_count = 0;
  // `megatron launch --master-port 0` binds and listens on the port it picks before any rank
  // starts, and hands rank 0 that socket (MEGATRON_MASTER_LISTEN_FD): rank 0's store serves on it
  // instead of binding the port again, which another process could have taken in between.
  // -1: rank 0 binds MASTER_PORT itself.
  int master_listen_fd = -1;
};

// Reads, in this order, torchrun's / `megatron launch`'s variables (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), then Slurm's (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE / SLURM_TASKS_PER_NODE, the node list),
// else a single process. Throws UserError naming the variable on a malformed or inconsistent
// value (e.g. RANK not below WORLD_SIZE).
LaunchEnv launch_env_from_environment();

// Slurm's compressed host lists: "node[01-04,07],gpu5" -> node01 node02 node03 node04 node07
// gpu5. Zero padding follows the range's first bound; several bracket groups in one name
// multiply out. Throws UserError (naming `variable`) on malformed lists.
std::vector<std::string> expand_slurm_nodelist(const std::string& list,
                                               const std::string& variable = "SLURM_JOB_NODELIST");

// Slurm's per-node task counts, "4(x2),3" -> {4, 4, 3}. Throws UserError naming `variable`.
std::vector<int> parse_slurm_tasks_per_node(const std::string& value,
                                            const std::string& variable = "SLURM_TASKS_PER_NODE");

// One line describing `env`, as `megatron _print-env` and the logs show it.
std::string describe(const LaunchEnv& env);

}  // namespace megatron::dist
