// Opt-in diagnostic logs (public: backends log through it too), selected with TORCHCOMPILE_LOGS (Python's TORCH_LOGS):
//
//   TORCHCOMPILE_LOGS=recompiles,guards,dynamic,graph        a comma list (spaces ignored)
//   TORCHCOMPILE_LOGS=all                                     everything ("+all" too; a leading
//                                                             '+' on any name is accepted)
//
//   recompiles     why a call missed the cache (the first failing guard of the newest entry)
//   guards         the guard list of each new cache entry
//   graph          each captured graph
//   graph_breaks   each graph break, with its reason and the op that caused it
//   passes         each step of the compile pipeline with its time, and the graph after each
//                  step that changed it; which backend compiled each graph and every decline
//   dynamic        every dynamic-shape decision: which dimension became a symbol, which stayed
//                  static and why, and each specialization of a dynamic entry for new sizes
//
// The variable is read once, on the first log_enabled() call; unknown names warn once, listing
// the valid ones (on stderr). set_logs() overrides it (tests). Off by default, and zero cost when off:
// log_enabled() is an inline relaxed load and a bit test, and TORCHCOMPILE_LOG builds its
// message only when the kind is enabled.
//
//   TORCHCOMPILE_LOG(LogKind::Recompiles, "torch::compile(", name, "): recompiling: ", reason);
//   if (log_enabled(LogKind::Guards)) for (auto& line : guards.describe()) ...
#pragma once

#include <c10/macros/Macros.h>
#include <c10/util/StringUtil.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace torchcompile::logging {

enum class LogKind : uint32_t {
  Recompiles = 1u << 0,
  Guards = 1u << 1,
  Graph = 1u << 2,
  GraphBreaks = 1u << 3,
  Passes = 1u << 4,
  Dynamic = 1u << 5,
};

namespace detail {
/// The enabled kinds, or kLogsUnread before TORCHCOMPILE_LOGS was read. Constant-initialized.
extern std::atomic<uint32_t> log_mask;
constexpr uint32_t kLogsUnread = 1u << 31;
/// Reads TORCHCOMPILE_LOGS (once; later calls return the current mask).
uint32_t init_logs_from_env();
}  // namespace detail

/// Whether `kind` is enabled.
inline bool log_enabled(LogKind kind) {
  uint32_t mask = detail::log_mask.load(std::memory_order_relaxed);
  if (C10_UNLIKELY(mask & detail::kLogsUnread)) mask = detail::init_logs_from_env();
  return (mask & static_cast<uint32_t>(kind)) != 0;
}

/// Writes `message` to stderr as one block prefixed `[torchcompile:<kind>] ` (whole messages
/// from concurrent threads do not interleave). Does not check log_enabled().
void log(LogKind kind, const std::string& message);

/// Enables exactly the kinds in `spec` (same syntax as TORCHCOMPILE_LOGS; "" turns all off),
/// overriding the environment. Unknown names warn (on stderr) and are ignored.
void set_logs(const std::string& spec);
/// Forgets set_logs(): TORCHCOMPILE_LOGS is read again on the next log_enabled() (tests).
void reset_logs();

/// The mask `spec` selects; unknown names are appended to `unknown` (if non-null).
uint32_t parse_log_spec(const std::string& spec, std::vector<std::string>* unknown = nullptr);
/// "recompiles", "guards", "graph", "graph_breaks", "passes".
const char* log_kind_name(LogKind kind);
/// "recompiles, guards, graph, graph_breaks, passes, dynamic, all": for messages.
std::string valid_log_names();

}  // namespace torchcompile::logging

/// Logs the concatenation of the arguments (c10::str) if `kind` is enabled; the arguments are
/// not evaluated otherwise.
#define TORCHCOMPILE_LOG(kind, ...)                                                    \
  do {                                                                                 \
    if (::torchcompile::logging::log_enabled(kind))                                    \
      ::torchcompile::logging::log((kind), ::c10::str(__VA_ARGS__));                   \
  } while (0)
