// init_process_group: a c10d store for the rendezvous (TCP served by rank 0, or a file) and
// c10d's Gloo process group over it.
#include <torchcompile/compat.h>
#include <torchcompile/distributed/ddp.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace torchcompile {
namespace {

constexpr const char* kWho = "torchcompile::init_process_group";

// A non-negative integer from `value` (the variable or option `what`), or an error saying what
// was expected.
int64_t parse_int(const std::string& value, const std::string& what) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(value.c_str(), &end, 10);
  TORCH_CHECK(!value.empty() && end && *end == '\0' && errno == 0 && v >= 0, kWho, ": expected ", what,
              " to be a non-negative integer, got '", value, "'");
  return v;
}

int from_env(int given, const char* var, const char* field) {
  if (given >= 0) return given;
  const char* v = std::getenv(var);
  TORCH_CHECK(v != nullptr, kWho, ": ", var, " is not set and ProcessGroupOptions::", field,
              " was not given (torchcompile-launch and torchrun set ", var, " for each process)");
  return static_cast<int>(parse_int(v, std::string("the environment variable ") + var));
}

std::string env_or_error(const char* var, const char* why) {
  const char* v = std::getenv(var);
  TORCH_CHECK(v != nullptr && *v, kWho, ": init_method env:// needs ", var, " (", why, ")");
  return v;
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

}  // namespace

std::chrono::milliseconds default_timeout(const std::optional<std::chrono::milliseconds>& timeout) {
  if (timeout) {
    TORCH_CHECK(timeout->count() > 0, "torchcompile: a distributed timeout must be positive, got ",
                timeout->count(), " ms");
    return *timeout;
  }
  if (const char* v = std::getenv("TORCHCOMPILE_DIST_TIMEOUT")) {
    char* end = nullptr;
    double s = std::strtod(v, &end);
    TORCH_CHECK(*v && end && *end == '\0' && s > 0, "torchcompile: TORCHCOMPILE_DIST_TIMEOUT must be a positive ",
                "number of seconds, got '", v, "'");
    return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0 + 0.5));
  }
  return std::chrono::minutes(30);
}

c10::intrusive_ptr<c10d::ProcessGroup> init_process_group(const ProcessGroupOptions& options) {
  TORCH_CHECK(options.backend == "gloo", kWho, ": expected backend \"gloo\" (the CPU backend; this build has no ",
              "other), got \"", options.backend, "\"");
  const int world = from_env(options.world_size, "WORLD_SIZE", "world_size");
  const int rank = from_env(options.rank, "RANK", "rank");
  TORCH_CHECK(world >= 1, kWho, ": expected a world size of at least 1, got ", world);
  TORCH_CHECK(rank < world, kWho, ": expected a rank in [0, ", world, "), got ", rank);
  const std::chrono::milliseconds timeout = default_timeout(options.timeout);

  const std::string& m = options.init_method;
  c10::intrusive_ptr<c10d::Store> store;
  std::string master_host;
  if (m.rfind("file://", 0) == 0) {
    std::string path = m.substr(7);
    TORCH_CHECK(!path.empty(), kWho, ": expected init_method file:///path/to/file, got '", m, "'");
    auto fs = c10::make_intrusive<c10d::FileStore>(path, world);
    fs->setTimeout(timeout);
    store = fs;
  } else {
    std::string port_text;
    if (m == "env://") {
      master_host = env_or_error("MASTER_ADDR", "the address of rank 0's machine");
      port_text = env_or_error("MASTER_PORT", "a free port on rank 0's machine");
    } else if (m.rfind("tcp://", 0) == 0) {
      std::string hp = m.substr(6);
      auto colon = hp.rfind(':');
      TORCH_CHECK(colon != std::string::npos && colon > 0, kWho, ": expected init_method tcp://host:port, got '", m,
                  "'");
      master_host = hp.substr(0, colon);
      port_text = hp.substr(colon + 1);
    } else {
      TORCH_CHECK(false, kWho, ": expected init_method \"env://\", \"tcp://host:port\" or \"file:///path\", got '", m,
                  "'");
    }
    int64_t port = parse_int(port_text, "the master port");
    TORCH_CHECK(port >= 1 && port <= 65535, kWho, ": expected a master port in [1, 65535], got ", port);
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(port);
    so.isServer = rank == 0;
    so.numWorkers = static_cast<size_t>(world);
    so.waitWorkers = true;
    so.timeout = timeout;
    compat::classic_tcp_store(so);
    try {
      store = c10::make_intrusive<c10d::TCPStore>(master_host, so);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, kWho, ": rank ", rank, " of ", world, " could not join the store at ", master_host, ":", port,
                  " (rank 0 serves it; every rank must start within the timeout of ", timeout.count() / 1000.0,
                  " s): ", e.what());
    }
  }

  auto gloo_options = c10d::ProcessGroupGloo::Options::create();
  gloo_options->timeout = timeout;
  std::string iface = options.hostname;
  if (iface.empty() && is_loopback(master_host)) iface = "127.0.0.1";
  gloo_options->devices.push_back(iface.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                                                : c10d::ProcessGroupGloo::createDeviceForHostname(iface));
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
  try {
    gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, gloo_options);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, kWho, ": rank ", rank, " of ", world, " could not connect to its peers within ",
                timeout.count() / 1000.0, " s: ", e.what());
  }
  return compat::gloo_process_group<c10d::ProcessGroup>(store, rank, world, std::move(gloo));
}

}  // namespace torchcompile
