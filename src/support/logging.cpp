#include <torchcompile/support/logging.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace torchcompile::logging {

namespace detail {
std::atomic<uint32_t> log_mask{kLogsUnread};
}  // namespace detail

namespace {

constexpr LogKind kAllKinds[] = {LogKind::Recompiles, LogKind::Guards, LogKind::Graph, LogKind::GraphBreaks,
                                 LogKind::Passes, LogKind::Dynamic};
constexpr uint32_t kAllMask = 0x3Fu;

std::mutex& env_mutex() {
  static std::mutex m;
  return m;
}

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

uint32_t parse_and_warn(const std::string& spec, const char* source) {
  std::vector<std::string> unknown;
  const uint32_t mask = parse_log_spec(spec, &unknown);
  if (!unknown.empty()) {
    std::string names;
    for (const auto& u : unknown) names += (names.empty() ? "'" : ", '") + u + "'";
    const std::string line = std::string("[torchcompile] warning: ") + source + ": unknown log name" +
                             (unknown.size() > 1 ? "s " : " ") + names + " ignored; valid names: " + valid_log_names() +
                             "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
  }
  return mask;
}

}  // namespace

const char* log_kind_name(LogKind kind) {
  switch (kind) {
    case LogKind::Recompiles: return "recompiles";
    case LogKind::Guards: return "guards";
    case LogKind::Graph: return "graph";
    case LogKind::GraphBreaks: return "graph_breaks";
    case LogKind::Passes: return "passes";
    case LogKind::Dynamic: return "dynamic";
  }
  return "?";
}

std::string valid_log_names() {
  std::string out;
  for (LogKind k : kAllKinds) out += std::string(log_kind_name(k)) + ", ";
  return out + "all";
}

uint32_t parse_log_spec(const std::string& spec, std::vector<std::string>* unknown) {
  uint32_t mask = 0;
  size_t begin = 0;
  while (begin <= spec.size()) {
    size_t end = spec.find(',', begin);
    if (end == std::string::npos) end = spec.size();
    std::string name = trim(spec.substr(begin, end - begin));
    begin = end + 1;
    if (!name.empty() && name[0] == '+') name = trim(name.substr(1));
    if (name.empty()) continue;
    if (name == "all") {
      mask |= kAllMask;
      continue;
    }
    bool found = false;
    for (LogKind k : kAllKinds) {
      if (name == log_kind_name(k)) {
        mask |= static_cast<uint32_t>(k);
        found = true;
      }
    }
    if (!found && unknown) unknown->push_back(name);
  }
  return mask;
}

uint32_t detail::init_logs_from_env() {
  std::lock_guard<std::mutex> lock(env_mutex());
  uint32_t mask = log_mask.load(std::memory_order_relaxed);
  if (!(mask & kLogsUnread)) return mask;  // another thread (or set_logs) got here first
  const char* env = std::getenv("TORCHCOMPILE_LOGS");
  mask = env ? parse_and_warn(env, "TORCHCOMPILE_LOGS") : 0;
  log_mask.store(mask, std::memory_order_relaxed);
  return mask;
}

void set_logs(const std::string& spec) {
  const uint32_t mask = parse_and_warn(spec, "torchcompile::logging::set_logs");
  std::lock_guard<std::mutex> lock(env_mutex());
  detail::log_mask.store(mask, std::memory_order_relaxed);
}

void reset_logs() {
  std::lock_guard<std::mutex> lock(env_mutex());
  detail::log_mask.store(detail::kLogsUnread, std::memory_order_relaxed);
}

void log(LogKind kind, const std::string& message) {
  std::string block = std::string("[torchcompile:") + log_kind_name(kind) + "] " + message;
  if (block.empty() || block.back() != '\n') block += '\n';
  static std::mutex out_mutex;
  std::lock_guard<std::mutex> lock(out_mutex);
  std::fwrite(block.data(), 1, block.size(), stderr);
  std::fflush(stderr);
}

}  // namespace torchcompile::logging
