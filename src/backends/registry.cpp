// The registry of named backends: name -> {backend, optional claim, tags, origin}.
//
// One process-wide table, a function-local static guarded by a mutex. The built-in backends
// are registered lazily, exactly once, by the first registry operation (not by static
// constructors: linkers drop them and their order is undefined). register_builtin_backends()
// itself calls register_backend(); a thread-local flag lets those calls through without
// re-entering std::call_once, which would deadlock.
#include <torchcompile/backends/registry.h>

#include "backends/builtin.h"
#include "backends/registry_internal.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace torchcompile {
namespace {

struct Entry {
  Backend fn;
  Claim claim;  // empty: the backend cannot be part of a partitioned composition
  std::vector<std::string> tags;
  std::string origin;  // "built-in", "registered in code", "plugin '/path/libx.so'"
};

struct Registry {
  std::mutex mutex;
  std::map<std::string, Entry> entries;  // sorted by name, which list_backends relies on
};

Registry& registry() {
  static Registry r;
  return r;
}

// True on the thread running register_builtin_backends(), while it runs.
thread_local bool t_registering_builtins = false;

// Set if register_builtin_backends() threw: every later operation reports it, rather than
// retrying and failing on the backends the first attempt did register.
std::string& builtin_failure() {
  static std::string message;
  return message;
}

// Register the built-in backends before the first registry operation. Other threads wait in
// call_once until it is done; the registering thread itself passes straight through.
void ensure_builtins() {
  if (t_registering_builtins) return;
  static std::once_flag once;
  std::call_once(once, [] {
    t_registering_builtins = true;
    try {
      detail::register_builtin_backends();
    } catch (const c10::Error& e) {
      builtin_failure() = e.what_without_backtrace();
    } catch (const std::exception& e) {
      builtin_failure() = e.what();
    } catch (...) {
      builtin_failure() = "unknown exception";
    }
    t_registering_builtins = false;
  });
  TORCH_CHECK(builtin_failure().empty(), "registering the built-in backends failed: ", builtin_failure());
}

std::string current_origin() { return t_registering_builtins ? "built-in" : "registered in code"; }

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

std::vector<std::string> all_names() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  names.reserve(r.entries.size());
  for (const auto& kv : r.entries) names.push_back(kv.first);
  return names;
}

// The backend registered as `name`, or an empty Backend.
Backend find(const std::string& name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.entries.find(name);
  return it == r.entries.end() ? Backend() : it->second.fn;
}

// A name that can be part of a plugin file name: no path separators, no "..".
bool searchable_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name.find("..") == std::string::npos;
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> dirs;
  std::string::size_type start = 0;
  while (start <= path.size()) {
    auto end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    if (end > start) dirs.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  return dirs;
}

bool is_regular_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

}  // namespace

namespace detail {

void register_backends_atomically(std::vector<PendingBackend> backends, const std::string& origin) {
  ensure_builtins();
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::set<std::string> seen;
  for (const auto& b : backends) {
    TORCH_CHECK(!b.name.empty(), origin, " registers a backend with an empty name");
    TORCH_CHECK(b.fn, origin, " registers backend '", b.name, "' with an empty backend function");
    auto it = r.entries.find(b.name);
    TORCH_CHECK(it == r.entries.end(), origin, " registers backend '", b.name,
                "', which is already registered (", it == r.entries.end() ? "" : it->second.origin, ")");
    TORCH_CHECK(seen.insert(b.name).second, origin, " registers backend '", b.name, "' twice");
  }
  for (auto& b : backends) r.entries[b.name] = Entry{std::move(b.fn), Claim(), std::move(b.tags), origin};
}

}  // namespace detail

namespace {

// Both register_backend overloads: checks, then inserts the entry (with its claim, which may be
// empty) under one lock, so no thread ever sees a backend registered with a claim without it.
void insert_backend(const std::string& name, Backend fn, Claim claim, std::vector<std::string> tags) {
  ensure_builtins();
  TORCH_CHECK(!name.empty(), "register_backend: the backend name must not be empty");
  TORCH_CHECK(fn, "register_backend: the backend function for '", name, "' is empty");
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.entries.find(name);
  TORCH_CHECK(it == r.entries.end(), "register_backend: backend '", name, "' is already registered (",
              it == r.entries.end() ? "" : it->second.origin, ")");
  r.entries.emplace(name, Entry{std::move(fn), std::move(claim), std::move(tags), current_origin()});
}

}  // namespace

void register_backend(const std::string& name, Backend fn, std::vector<std::string> tags) {
  insert_backend(name, std::move(fn), Claim(), std::move(tags));
}

void register_backend(const std::string& name, Backend fn, Claim claim, std::vector<std::string> tags) {
  TORCH_CHECK(claim, "register_backend: expected a claim function for backend '", name, "'");
  insert_backend(name, std::move(fn), std::move(claim), std::move(tags));
}

void register_claim(const std::string& name, Claim claim) {
  ensure_builtins();
  TORCH_CHECK(claim, "register_claim: expected a claim function for backend '", name, "'");
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.entries.find(name);
  TORCH_CHECK(it != r.entries.end(), "register_claim: expected a registered backend, got '", name,
              "' (register the backend before its claim)");
  TORCH_CHECK(!it->second.claim, "register_claim: backend '", name, "' already has a claim");
  it->second.claim = std::move(claim);
}

bool has_claim(const std::string& name) {
  ensure_builtins();
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.entries.find(name);
  return it != r.entries.end() && it->second.claim;
}

Claim lookup_claim(const std::string& name) {
  ensure_builtins();
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.entries.find(name);
  return it == r.entries.end() ? Claim() : it->second.claim;
}

Backend lookup_backend(const std::string& name) {
  ensure_builtins();
  if (Backend fn = find(name)) return fn;

  // Not registered: look for a plugin on TORCHCOMPILE_BACKEND_PATH. The registry lock is not
  // held here, since loading a plugin registers backends.
  const char* env = std::getenv("TORCHCOMPILE_BACKEND_PATH");
  const std::string search_path = env ? env : "";
  std::string notes;
  if (searchable_name(name)) {
    for (const std::string& dir : split_path(search_path)) {
      for (const std::string& file : {"libtorchcompile_backend_" + name + ".so", "torchcompile_backend_" + name + ".so"}) {
        const std::string candidate = dir + "/" + file;
        if (!is_regular_file(candidate)) continue;
        // A plugin that fails to load throws an error naming the file: more useful than
        // "unknown backend", so it propagates.
        load_backend_library(candidate);
        if (Backend fn = find(name)) return fn;
        notes += "; " + candidate + " was loaded but does not register '" + name + "'";
      }
    }
  }

  const std::vector<std::string> known = all_names();
  const std::string where = search_path.empty() ? "TORCHCOMPILE_BACKEND_PATH is not set"
                                                : "searched TORCHCOMPILE_BACKEND_PATH: " + search_path;
  TORCH_CHECK(false, "unknown backend '", name, "'; known backends: ", known.empty() ? "(none)" : join(known, ", "),
              " (", where, notes, ")");
}

bool has_backend(const std::string& name) {
  ensure_builtins();
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.entries.count(name) != 0;
}

std::vector<std::string> list_backends(const std::vector<std::string>& exclude_tags) {
  ensure_builtins();
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, entry] : r.entries) {
    const bool excluded = std::any_of(entry.tags.begin(), entry.tags.end(), [&](const std::string& tag) {
      return std::find(exclude_tags.begin(), exclude_tags.end(), tag) != exclude_tags.end();
    });
    if (!excluded) names.push_back(name);
  }
  return names;  // already sorted: std::map
}

}  // namespace torchcompile
