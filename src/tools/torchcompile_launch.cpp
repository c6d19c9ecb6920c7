// torchcompile-launch: start N processes of a program for data-parallel training, as PyTorch's
// torchrun does: each gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT; their output is forwarded line by line with a "[rank i] " prefix; the exit status
// is the first failing rank's (128 + signal for a rank killed by a signal), 0 when all succeed.
//
//   torchcompile-launch --nproc 2 ./train --epochs 3
//   torchcompile-launch --nnodes 2 --node-rank 0 --nproc 2 --master-addr 10.0.0.1 --master-port 29500 ./train
//
// When a rank fails, the others get --grace seconds (default 60) to notice and exit by
// themselves (a DistributedDataParallel error naming the lost rank), then SIGTERM.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void usage(const char* error) {
  if (error) std::fprintf(stderr, "torchcompile-launch: %s\n", error);
  std::fprintf(stderr,
               "usage: torchcompile-launch [--nproc N] [--nnodes M] [--node-rank R] [--master-addr ADDR]\n"
               "                           [--master-port PORT] [--grace SECONDS] [--] PROGRAM [ARGS...]\n"
               "  --nproc N         processes on this machine (default 1)\n"
               "  --nnodes M        machines (default 1); --node-rank R: this machine's index (default 0)\n"
               "  --master-addr A   address of node 0 (default 127.0.0.1)\n"
               "  --master-port P   port of the rendezvous store on node 0 (default: a free port when\n"
               "                    --nnodes is 1, else 29500)\n"
               "  --grace S         seconds the other ranks get to exit after one fails (default 60)\n");
  std::exit(2);
}

long parse_number(const char* flag, const char* v, long lo, long hi) {
  char* end = nullptr;
  long n = v ? std::strtol(v, &end, 10) : 0;
  if (!v || !*v || *end || n < lo || n > hi) {
    std::string msg = std::string("expected ") + flag + " to be an integer in [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "], got '" + (v ? v : "") + "'";
    usage(msg.c_str());
  }
  return n;
}

int free_port() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (s < 0 || bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("torchcompile-launch: finding a free port");
    std::exit(1);
  }
  close(s);
  return ntohs(a.sin_port);
}

struct Stream {
  int fd = -1;
  FILE* out = nullptr;
  std::string pending;  // a partial line
};

struct Child {
  pid_t pid = -1;
  int rank = 0;
  bool running = true;
  Stream streams[2];
};

void flush_lines(Stream& s, int rank, bool all) {
  size_t start = 0, nl;
  while ((nl = s.pending.find('\n', start)) != std::string::npos) {
    std::fprintf(s.out, "[rank %d] %.*s\n", rank, static_cast<int>(nl - start), s.pending.data() + start);
    start = nl + 1;
  }
  s.pending.erase(0, start);
  if (all && !s.pending.empty()) {
    std::fprintf(s.out, "[rank %d] %s\n", rank, s.pending.c_str());
    s.pending.clear();
  }
  std::fflush(s.out);
}

std::vector<Child>* g_children = nullptr;
void forward_signal(int sig) {
  if (!g_children) return;
  for (const Child& c : *g_children)
    if (c.running) kill(c.pid, sig);
}

}  // namespace

int main(int argc, char** argv) {
  long nproc = 1, nnodes = 1, node_rank = 0, grace = 60, port = -1;
  std::string addr = "127.0.0.1";
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "--") {
      ++i;
      break;
    } else if (a == "--nproc" || a == "--nproc-per-node" || a == "--nproc_per_node") {
      nproc = parse_number("--nproc", value(), 1, 1024);
    } else if (a == "--nnodes") {
      nnodes = parse_number("--nnodes", value(), 1, 1 << 20);
    } else if (a == "--node-rank" || a == "--node_rank") {
      node_rank = parse_number("--node-rank", value(), 0, 1 << 20);
    } else if (a == "--master-addr" || a == "--master_addr") {
      const char* v = value();
      if (!v || !*v) usage("expected an address after --master-addr");
      addr = v;
    } else if (a == "--master-port" || a == "--master_port") {
      port = parse_number("--master-port", value(), 1, 65535);
    } else if (a == "--grace") {
      grace = parse_number("--grace", value(), 0, 1 << 30);
    } else if (a == "-h" || a == "--help") {
      usage(nullptr);
    } else if (a.rfind("--", 0) == 0) {
      usage(("unknown option " + a).c_str());
    } else {
      break;
    }
  }
  if (i >= argc) usage("expected a program to run");
  if (node_rank >= nnodes) usage("expected --node-rank < --nnodes");
  if (port < 0) port = nnodes == 1 ? free_port() : 29500;

  std::vector<Child> children(nproc);
  g_children = &children;
  signal(SIGINT, forward_signal);
  signal(SIGTERM, forward_signal);
  const long world = nproc * nnodes;
  for (long local = 0; local < nproc; ++local) {
    int pipes[2][2];
    if (pipe(pipes[0]) != 0 || pipe(pipes[1]) != 0) {
      std::perror("torchcompile-launch: pipe");
      return 1;
    }
    Child& c = children[local];
    c.rank = static_cast<int>(node_rank * nproc + local);
    c.pid = fork();
    if (c.pid < 0) {
      std::perror("torchcompile-launch: fork");
      return 1;
    }
    if (c.pid == 0) {
      dup2(pipes[0][1], STDOUT_FILENO);
      dup2(pipes[1][1], STDERR_FILENO);
      for (auto& p : pipes) close(p[0]), close(p[1]);
      setenv("RANK", std::to_string(c.rank).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("GROUP_RANK", std::to_string(node_rank).c_str(), 1);
      setenv("MASTER_ADDR", addr.c_str(), 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      execvp(argv[i], argv + i);
      std::fprintf(stderr, "torchcompile-launch: cannot run %s: %s\n", argv[i], std::strerror(errno));
      _exit(127);
    }
    close(pipes[0][1]);
    close(pipes[1][1]);
    c.streams[0] = Stream{pipes[0][0], stdout, ""};
    c.streams[1] = Stream{pipes[1][0], stderr, ""};
  }

  int status_out = 0;
  bool failed = false, terminated = false;
  auto deadline = std::chrono::steady_clock::time_point::max();
  size_t running = children.size();
  while (running > 0) {
    std::vector<pollfd> fds;
    std::vector<Stream*> owners;
    std::vector<int> ranks;
    for (Child& c : children)
      for (Stream& s : c.streams)
        if (s.fd >= 0) {
          fds.push_back(pollfd{s.fd, POLLIN, 0});
          owners.push_back(&s);
          ranks.push_back(c.rank);
        }
    poll(fds.data(), fds.size(), 100);
    for (size_t k = 0; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      ssize_t n = read(fds[k].fd, buf, sizeof(buf));
      if (n > 0) {
        owners[k]->pending.append(buf, n);
        flush_lines(*owners[k], ranks[k], false);
      } else if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
        flush_lines(*owners[k], ranks[k], true);
        close(owners[k]->fd);
        owners[k]->fd = -1;
      }
    }
    for (Child& c : children) {
      if (!c.running) continue;
      int st = 0;
      if (waitpid(c.pid, &st, WNOHANG) != c.pid) continue;
      // Drain what the child wrote before it exited.
      for (Stream& s : c.streams) {
        if (s.fd < 0) continue;
        char buf[4096];
        ssize_t n;
        while ((n = read(s.fd, buf, sizeof(buf))) > 0) s.pending.append(buf, n);
        flush_lines(s, c.rank, true);
        close(s.fd);
        s.fd = -1;
      }
      c.running = false;
      --running;
      int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (code != 0) {
        if (WIFSIGNALED(st))
          std::fprintf(stderr, "torchcompile-launch: rank %d (pid %d) was killed by signal %d (%s)\n", c.rank, c.pid,
                       WTERMSIG(st), strsignal(WTERMSIG(st)));
        else
          std::fprintf(stderr, "torchcompile-launch: rank %d (pid %d) exited with status %d\n", c.rank, c.pid, code);
        if (!failed) {
          failed = true;
          status_out = code;
          deadline = std::chrono::steady_clock::now() + std::chrono::seconds(grace);
        }
      }
    }
    if (failed && running > 0 && std::chrono::steady_clock::now() >= deadline) {
      const int sig = terminated ? SIGKILL : SIGTERM;
      std::fprintf(stderr, "torchcompile-launch: %zu rank(s) still running after the first failure: sending %s\n",
                   running, sig == SIGKILL ? "SIGKILL" : "SIGTERM");
      forward_signal(sig);
      forward_signal(SIGCONT);  // a stopped rank handles SIGTERM only once it runs
      terminated = true;
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    }
  }
  return status_out;
}
