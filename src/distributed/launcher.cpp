// The process side of `megatron launch`: fork/exec one child per local rank in its own process
// group, relay their output line by line with a "[rank R] " prefix, and supervise them. One
// poll() loop watches the children's pipes and a self-pipe fed by the signal handlers, so
// output, exits and signals are handled in one place without threads.
#include "distributed/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <optional>
#include <thread>

#include "core/errors.h"
#include "distributed/heartbeat.h"
#include "distributed/launch_env.h"

namespace megatron::dist {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kTailLines = 10;        // lines of a failed rank shown in the report
constexpr size_t kMaxLine = 64 * 1024;   // a "line" this long without '\n' is relayed as is
constexpr double kDrainSeconds = 2.0;    // after the last exit, how long leftover writers may hold a pipe

// Written by the signal handlers, read by the poll loop (the self-pipe trick).
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // e.g. EPIPE when our reader went away: keep supervising regardless
    done += static_cast<size_t>(n);
  }
}

std::string signal_name(int sig) {
  static const std::pair<int, const char*> names[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"},
      {SIGSEGV, "SIGSEGV"}, {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},
      {SIGUSR1, "SIGUSR1"}, {SIGUSR2, "SIGUSR2"}};
  for (const auto& [number, name] : names) {
    if (number == sig) return name;
  }
  return "signal " + std::to_string(sig);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "was killed by " + signal_name(WTERMSIG(status)) + " (" + std::to_string(WTERMSIG(status)) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

// Rank 0's store will listen on `port` of this node: in use (another job, a previous run still
// alive), the ranks would wait out the rendezvous timeout. Said now instead.
void check_port_free(int port) {
  if (!port_is_free(port)) {
    throw UserError("--master-port " + std::to_string(port) + " is already in use on this node (another job, or a run still "
                    "exiting): pass another port, or --master-port 0 (or --standalone) to pick a free one");
  }
}

struct Stream {
  int fd = -1;          // read end of the child's stdout or stderr pipe; -1 after EOF
  int out_fd = 1;       // where the launcher relays it
  std::string partial;  // bytes after the last '\n'
};

struct Child {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;  // also its process group id
  bool running = false;
  int status = 0;  // wait status once it has exited
  Stream out, err;
  std::deque<std::string> tail;  // its last lines, both streams, for the failure report
  std::optional<Clock::time_point> first_error;  // when its first "error: ..." line arrived
  int heartbeat_fd = -1;                           // our end of its heartbeat socket (heartbeat.h)
  std::optional<Clock::time_point> last_beat;      // when it last beat; watched once it has
  std::optional<Clock::time_point> frozen_after;   // its last beat, once found frozen (and killed)
  std::FILE* log = nullptr;
  std::string prefix;
};

class Supervisor {
 public:
  Supervisor(const LaunchOptions& options, const std::string& program) : options_(options), program_(program) {}
  ~Supervisor();
  int run();

 private:
  void install_signal_handlers();
  void spawn(Child& child, std::vector<std::string> environment);
  std::vector<std::string> child_environment(const Child& child, int master_port) const;
  void relay(Child& child, Stream& stream);
  void emit(Child& child, const Stream& stream, const std::string& line);
  void reap();
  void on_launcher_signal(int sig);
  void stop_all(int sig);  // `sig` to every rank's process group (not only stop signals)
  void drain_heartbeat(Child& child);
  void check_heartbeats(Clock::time_point now);
  void report_failure() const;
  const Child& cause() const;

  const LaunchOptions& options_;
  const std::string program_;
  std::vector<Child> children_;
  std::optional<size_t> failed_;            // index of the first rank that failed on its own
  int interrupted_by_ = 0;                  // signal the launcher received, if any
  std::optional<Clock::time_point> kill_at_;  // when stopping ranks get SIGKILL
  std::optional<Clock::time_point> drain_until_;
  struct sigaction old_actions_[6]{};
  int master_listen_fd_ = -1;  // --master-port 0: rank 0's listening socket until rank 0 holds it
};

// SIGCHLD wakes the loop; SIGINT and SIGTERM stop the job; SIGUSR1 and SIGUSR2 are passed on to
// every rank untouched (a run started with --exit-signal SIGUSR1 saves and stops on it, as under
// SLURM's --signal); SIGPIPE, last, is ignored.
constexpr int kHandled[6] = {SIGCHLD, SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGPIPE};
constexpr int kCaught = 5;  // the first five run on_signal

Supervisor::~Supervisor() {
  for (auto& c : children_) {
    // Only when run() threw halfway: never leave ranks running without a supervisor.
    if (c.running) {
      ::killpg(c.pid, SIGKILL);
      ::waitpid(c.pid, nullptr, 0);
    }
    for (Stream* s : {&c.out, &c.err}) {
      if (s->fd >= 0) ::close(s->fd);
    }
    if (c.heartbeat_fd >= 0) ::close(c.heartbeat_fd);
    if (c.log != nullptr) std::fclose(c.log);
  }
  if (master_listen_fd_ >= 0) ::close(master_listen_fd_);
  for (int i = 0; i < 6; ++i) ::sigaction(kHandled[i], &old_actions_[i], nullptr);
  for (int& fd : g_signal_pipe) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

void Supervisor::install_signal_handlers() {
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw std::runtime_error(std::string("launch: pipe2 failed: ") + std::strerror(errno));
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int i = 0; i < kCaught; ++i) ::sigaction(kHandled[i], &sa, &old_actions_[i]);
  // A closed stdout (`megatron launch ... | head`) must not kill the launcher while it still
  // has ranks to stop.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, &old_actions_[kCaught]);
}

std::vector<std::string> Supervisor::child_environment(const Child& child, int master_port) const {
  const int world = options_.nnodes * options_.nproc_per_node;
  const std::pair<const char*, std::string> ours[] = {
      {"RANK", std::to_string(child.rank)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_RANK", std::to_string(child.local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(options_.nproc_per_node)},
      {"GROUP_RANK", std::to_string(options_.node_rank)},
      {"NODE_RANK", std::to_string(options_.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(options_.nnodes)},
      {"MASTER_ADDR", options_.master_addr},
      {"MASTER_PORT", std::to_string(master_port)},
      // stdout is a pipe now; main() switches to line buffering so lines arrive as printed and
      // are not lost when a rank is stopped.
      {"MEGATRON_LINE_BUFFERED", "1"},
  };
  std::vector<std::string> env;
  bool has_omp = false;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& [ours_name, value] : ours) overridden = overridden || name == ours_name;
    overridden = overridden || name == kMasterListenFdVariable;  // only ever this launcher's own
    has_omp = has_omp || name == "OMP_NUM_THREADS";
    if (!overridden) env.push_back(entry);
  }
  for (const auto& [name, value] : ours) env.push_back(std::string(name) + "=" + value);
  if (child.rank == 0 && master_listen_fd_ >= 0) {
    env.push_back(std::string(kMasterListenFdVariable) + "=" + std::to_string(master_listen_fd_));
  }
  // N ranks each starting one thread per core would oversubscribe the node N times over.
  if (!has_omp && options_.nproc_per_node > 1) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const unsigned per_rank = std::max(1u, cores / static_cast<unsigned>(options_.nproc_per_node));
    env.push_back("OMP_NUM_THREADS=" + std::to_string(per_rank));
  }
  return env;
}

void Supervisor::spawn(Child& child, std::vector<std::string> environment) {
  int out[2], err[2], beat[2];
  // O_CLOEXEC: a rank must not inherit the other ranks' pipes, or their EOF would never come.
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("launch: pipe2 failed: ") + std::strerror(errno));
  }
  // The heartbeat socket: beat[1] goes to the rank (kept across its exec below), beat[0] is ours.
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, beat) != 0) {
    throw std::runtime_error(std::string("launch: socketpair failed: ") + std::strerror(errno));
  }
  environment.push_back(std::string(kHeartbeatFdVariable) + "=" + std::to_string(beat[1]));
  // Everything the child needs is built before fork(): between fork and exec only
  // async-signal-safe calls are allowed.
  std::vector<std::string> args = {"megatron"};
  args.insert(args.end(), options_.command.begin(), options_.command.end());
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (const auto& e : environment) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const std::string exec_failed = "launch: cannot execute " + program_ + "\n";
  const pid_t launcher = ::getpid();

  // Until exec, the child runs our handlers, which write to the launcher's self-pipe: a
  // SIGTERM sent to a just-forked rank would look like one sent to the launcher. So signals
  // stay blocked across fork until the child has restored the default dispositions.
  sigset_t handled, previous;
  sigemptyset(&handled);
  for (int sig : kHandled) sigaddset(&handled, sig);
  ::sigprocmask(SIG_BLOCK, &handled, &previous);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);  // own group: Ctrl-C reaches only the launcher, and killpg reaches descendants
    for (int sig : kHandled) ::signal(sig, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    // If the launcher itself is SIGKILLed it cannot stop anyone; the kernel then does.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(128 + SIGKILL);  // it died before prctl took effect
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull > 0) {  // N ranks cannot share one terminal's input
      ::dup2(devnull, 0);
      ::close(devnull);
    }
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::fcntl(beat[1], F_SETFD, 0);  // this rank's own heartbeat socket survives exec
    if (child.rank == 0 && master_listen_fd_ >= 0) ::fcntl(master_listen_fd_, F_SETFD, 0);  // and rank 0's store socket
    ::execve(program_.c_str(), argv.data(), envp.data());
    [[maybe_unused]] ssize_t n = ::write(2, exec_failed.data(), exec_failed.size());
    ::_exit(127);
  }
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) throw std::runtime_error(std::string("launch: fork failed: ") + std::strerror(errno));
  ::setpgid(pid, pid);  // also here, so killpg works even before the child has run
  ::close(out[1]);
  ::close(err[1]);
  ::close(beat[1]);
  child.pid = pid;
  child.running = true;
  child.heartbeat_fd = beat[0];
  child.out.fd = out[0];
  child.out.out_fd = 1;
  child.err.fd = err[0];
  child.err.out_fd = 2;
}

void Supervisor::emit(Child& child, const Stream& stream, const std::string& line) {
  write_all(stream.out_fd, child.prefix + line + "\n");
  if (child.log != nullptr) {
    std::fputs(line.c_str(), child.log);
    std::fputc('\n', child.log);
    std::fflush(child.log);
  }
  child.tail.push_back(line);
  if (child.tail.size() > kTailLines) child.tail.pop_front();
  // megatron programs report a failure as "error: ..." / "internal error: ..." (report_errors.cpp).
  if (&stream == &child.err && !child.first_error && (line.rfind("error: ", 0) == 0 || line.rfind("internal error: ", 0) == 0)) {
    child.first_error = Clock::now();
  }
}

void Supervisor::relay(Child& child, Stream& stream) {
  char buffer[65536];
  const ssize_t n = ::read(stream.fd, buffer, sizeof(buffer));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {  // EOF (or an error, treated alike): flush an unterminated last line
    if (!stream.partial.empty()) emit(child, stream, stream.partial);
    stream.partial.clear();
    ::close(stream.fd);
    stream.fd = -1;
    return;
  }
  stream.partial.append(buffer, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t nl; (nl = stream.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    emit(child, stream, stream.partial.substr(start, nl - start));
  }
  stream.partial.erase(0, start);
  if (stream.partial.size() >= kMaxLine) {
    emit(child, stream, stream.partial);
    stream.partial.clear();
  }
}

void Supervisor::stop_all(int sig) {
  // Exited leaders are included: their group may still hold descendants.
  for (const auto& c : children_) ::killpg(c.pid, sig);
}

void Supervisor::drain_heartbeat(Child& child) {
  char beats[256];
  const ssize_t n = ::read(child.heartbeat_fd, beats, sizeof(beats));
  if (n > 0) {
    child.last_beat = Clock::now();
  } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
    // Closed: the rank exited (reap() says how) or stopped beating on purpose.
    ::close(child.heartbeat_fd);
    child.heartbeat_fd = -1;
    child.last_beat.reset();
  }
}

// A running rank silent for --heartbeat-timeout is stopped or frozen: no thread of it runs. It is
// the failure's cause, killed at once (it cannot act on SIGTERM); the others are stopped as for
// any failure. Not while the job is already stopping: ranks saving a checkpoint may be slow.
void Supervisor::check_heartbeats(Clock::time_point now) {
  if (options_.heartbeat_timeout_s <= 0 || failed_ || kill_at_) return;
  const auto timeout = std::chrono::duration<double>(options_.heartbeat_timeout_s);
  for (size_t i = 0; i < children_.size(); ++i) {
    Child& c = children_[i];
    // A rank that never beat (a program of its own that does not) is not watched.
    if (!c.running || !c.last_beat || now - *c.last_beat < timeout) continue;
    c.frozen_after = c.last_beat;
    failed_ = i;
    std::fprintf(stderr, "launch: rank %d sent no heartbeat for %g s (stopped or frozen); killing it and stopping the other ranks\n",
                 c.rank, options_.heartbeat_timeout_s);
    ::killpg(c.pid, SIGKILL);
    stop_all(SIGTERM);
    kill_at_ = now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.kill_timeout_s));
    return;
  }
}

void Supervisor::reap() {
  for (size_t i = 0; i < children_.size(); ++i) {
    Child& c = children_[i];
    if (!c.running) continue;
    int status = 0;
    const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
    if (r != c.pid) continue;
    c.running = false;
    c.status = status;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    // Only the first failure is the cause; ranks dying after we began stopping them are effects.
    if (!ok && !failed_ && !kill_at_) {
      failed_ = i;
      std::fprintf(stderr, "launch: rank %d %s; stopping the other ranks\n", c.rank, describe_status(status).c_str());
      stop_all(SIGTERM);
      kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(options_.kill_timeout_s));
    }
  }
  bool any_running = false;
  for (const auto& c : children_) any_running = any_running || c.running;
  if (!any_running && !drain_until_) {
    drain_until_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(kDrainSeconds));
  }
}

void Supervisor::on_launcher_signal(int sig) {
  if (sig == SIGUSR1 || sig == SIGUSR2) {
    // Not a stop: what the ranks do with it is theirs (--exit-signal), the job goes on.
    std::fprintf(stderr, "launch: received %s; passing it to all ranks\n", signal_name(sig).c_str());
    stop_all(sig);
    return;
  }
  if (interrupted_by_ != 0) {
    // A second Ctrl-C means "now": do not wait out the grace period.
    std::fprintf(stderr, "launch: received %s again; killing all ranks\n", signal_name(sig).c_str());
    stop_all(SIGKILL);
    return;
  }
  interrupted_by_ = sig;
  std::fprintf(stderr, "launch: received %s; forwarding it to all ranks\n", signal_name(sig).c_str());
  stop_all(sig);
  if (!kill_at_) {
    kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(options_.kill_timeout_s));
  }
}

// The rank whose failure started it: of the ranks that failed, the one whose first error line
// arrived earliest. The first rank to exit is often an effect (a peer's "connection closed"
// exits at once while the cause is still writing its report); without error lines, the first
// that exited.
// A frozen rank is the cause unless another rank's error came while it still beat.
const Child& Supervisor::cause() const {
  const Child* earliest = &children_[*failed_];
  for (const Child& c : children_) {
    const bool failed = !(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) && !c.running;
    if (!failed || !c.first_error) continue;
    if (earliest->frozen_after ? *c.first_error < *earliest->frozen_after
                         : !earliest->first_error || *c.first_error < *earliest->first_error) {
      earliest = &c;
    }
  }
  return *earliest;
}

void Supervisor::report_failure() const {
  const Child& c = cause();
  char silent[32];
  std::snprintf(silent, sizeof(silent), "%g s", options_.heartbeat_timeout_s);
  const std::string how = c.frozen_after ? std::string("sent no heartbeat for ") + silent + " (stopped or frozen) and was killed"
                                   : describe_status(c.status);
  std::string text = "launch: rank " + std::to_string(c.rank) + " (local rank " + std::to_string(c.local_rank) +
                     ", pid " + std::to_string(c.pid) + ") " + how + "\n";
  if (c.tail.empty()) {
    text += "launch: rank " + std::to_string(c.rank) + " printed nothing\n";
  } else {
    text += "launch: last " + std::to_string(c.tail.size()) + " lines of rank " + std::to_string(c.rank) + ":\n";
    for (const auto& line : c.tail) text += "  " + line + "\n";
  }
  std::string others;
  for (const auto& o : children_) {
    if (&o == &c) continue;
    others += (others.empty() ? "" : ", ") + std::to_string(o.rank) + ": " + describe_status(o.status);
  }
  if (!others.empty()) text += "launch: the other ranks: " + others + "\n";
  write_all(2, text);
}

int Supervisor::run() {
  int master_port = options_.master_port;
  if (master_port == 0) master_listen_fd_ = listen_on_free_port(master_port);
  if (options_.master_port != 0 && options_.node_rank == 0) check_port_free(master_port);
  if (!options_.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options_.log_dir, ec);
    if (ec) throw UserError("--log-dir " + options_.log_dir + ": cannot create it: " + ec.message());
  }
  children_.resize(static_cast<size_t>(options_.nproc_per_node));
  for (int local = 0; local < options_.nproc_per_node; ++local) {
    Child& c = children_[static_cast<size_t>(local)];
    c.local_rank = local;
    c.rank = options_.node_rank * options_.nproc_per_node + local;
    c.prefix = (c.rank == 0 && !options_.prefix_rank0) ? "" : "[rank " + std::to_string(c.rank) + "] ";
    if (!options_.log_dir.empty()) {
      const std::string path = options_.log_dir + "/rank_" + std::to_string(c.rank) + ".log";
      c.log = std::fopen(path.c_str(), "we");  // "e": close-on-exec, so no rank inherits another's log
      if (c.log == nullptr) throw UserError("--log-dir: cannot write " + path + ": " + std::strerror(errno));
    }
  }
  install_signal_handlers();
  for (auto& c : children_) spawn(c, child_environment(c, master_port));
  if (master_listen_fd_ >= 0) {  // rank 0 holds it now; the port stays taken while rank 0 lives
    ::close(master_listen_fd_);
    master_listen_fd_ = -1;
  }

  while (true) {
    reap();  // also catches exits whose SIGCHLD arrived before the handler saw a poll
    std::vector<pollfd> fds = {{g_signal_pipe[0], POLLIN, 0}};
    std::vector<std::pair<Child*, Stream*>> owners = {{nullptr, nullptr}};
    for (auto& c : children_) {
      for (Stream* s : {&c.out, &c.err}) {
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          owners.emplace_back(&c, s);
        }
      }
      if (c.heartbeat_fd >= 0) {
        fds.push_back({c.heartbeat_fd, POLLIN, 0});
        owners.emplace_back(&c, nullptr);
      }
    }
    const auto now = Clock::now();
    check_heartbeats(now);
    if (drain_until_ && (fds.size() == 1 || now >= *drain_until_)) break;
    if (kill_at_ && now >= *kill_at_) {
      std::fprintf(stderr, "launch: ranks still running %g s after SIGTERM; sending SIGKILL\n", options_.kill_timeout_s);
      stop_all(SIGKILL);
      kill_at_ = Clock::time_point::max();  // sent; keeps "stopping" true without re-arming
    }
    // Awake at least every heartbeat interval while heartbeats are watched.
    int timeout_ms = options_.heartbeat_timeout_s > 0 && !failed_ && !kill_at_ ? static_cast<int>(kHeartbeatIntervalSeconds * 1000) : -1;
    for (const auto& t : {kill_at_, drain_until_}) {
      if (!t || *t == Clock::time_point::max()) continue;
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(*t - now).count() + 1;
      timeout_ms = timeout_ms < 0 ? static_cast<int>(ms) : std::min(timeout_ms, static_cast<int>(ms));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      throw std::runtime_error(std::string("launch: poll failed: ") + std::strerror(errno));
    }
    if (fds[0].revents & POLLIN) {
      unsigned char sigs[64];
      const ssize_t n = ::read(g_signal_pipe[0], sigs, sizeof(sigs));
      for (ssize_t k = 0; k < n; ++k) {
        if (sigs[k] != SIGCHLD) on_launcher_signal(sigs[k]);
      }
    }
    for (size_t k = 1; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      if (owners[k].second == nullptr) {
        drain_heartbeat(*owners[k].first);
      } else {
        relay(*owners[k].first, *owners[k].second);
      }
    }
  }
  // Whatever is left in the groups of a job we are ending (e.g. a stuck rank's helpers) goes too.
  if (failed_ || interrupted_by_ != 0) stop_all(SIGKILL);
  for (auto& c : children_) {
    for (Stream* s : {&c.out, &c.err}) {
      if (!s->partial.empty()) emit(c, *s, s->partial);
      s->partial.clear();
    }
  }
  if (failed_) {
    report_failure();
    return 1;
  }
  if (interrupted_by_ != 0) {
    std::fprintf(stderr, "launch: stopped all ranks after %s\n", signal_name(interrupted_by_).c_str());
    return 128 + interrupted_by_;
  }
  return 0;
}

}  // namespace

// `--master-port 0`: a socket on a port the kernel picks, already listening, that rank 0's store
// then serves on (MEGATRON_MASTER_LISTEN_FD). Picking a port, closing it and letting rank 0 bind
// it again later (torchrun's way) lets another process take the port in between, which parallel
// test runs did now and then. Connections that arrive before rank 0 accepts wait in the backlog.
int listen_on_free_port(int& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw UserError(std::string("--master-port 0: cannot open a socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, SOMAXCONN) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    throw UserError("--master-port 0: cannot listen on a free port: " + why);
  }
  port = ntohs(addr.sin_port);
  return fd;
}

// SO_REUSEADDR as the store's own socket, so a port left in TIME_WAIT counts as free.
bool port_is_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return true;  // nothing to learn; the store reports its own failure
  const int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool in_use = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 && errno == EADDRINUSE;
  ::close(fd);
  return !in_use;
}

int run_launch(const LaunchOptions& options, const std::string& program) {
  Supervisor supervisor(options, program);
  return supervisor.run();
}

}  // namespace megatron::dist
