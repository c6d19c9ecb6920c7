// The registry of named backends (built-in, registered in code, or loaded from shared-library
// plugins): one table from a name to its backend, its optional claim and its tags. What a backend
// is: backends/backend.h. Compositions of registered backends (fallback_chain,
// partitioned_backend) are the compile stage's: compile/chain.h, compile/partitioner.h.
#pragma once

#include <torchcompile/backends/backend.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace torchcompile {

/// Register `fn` under `name`. Throws if the name is empty or already registered. `tags`
/// label the entry (`debug`, `experimental`), as Dynamo's registry does.
void register_backend(const std::string& name, Backend fn, std::vector<std::string> tags = {});

/// Register `fn` under `name` with the claim compositions use to give it the nodes it compiles
/// (compile/partitioner.h). Same rules as above; `claim` must not be empty.
void register_backend(const std::string& name, Backend fn, Claim claim, std::vector<std::string> tags = {});

/// Attach `claim` to the registered backend `name`. Throws if `name` is not registered or
/// already has a claim.
void register_claim(const std::string& name, Claim claim);

/// Whether the registered backend `name` has a claim.
bool has_claim(const std::string& name);

/// The claim of the registered backend `name`, or an empty Claim (unknown name, or no claim).
Claim lookup_claim(const std::string& name);

/// The backend registered as `name`. An unknown name first searches the directories listed in
/// TORCHCOMPILE_BACKEND_PATH (colon-separated) for a plugin named
/// `libtorchcompile_backend_<name>.so` (or `torchcompile_backend_<name>.so`) and loads it; if
/// that fails too, throws an error listing the known backends.
Backend lookup_backend(const std::string& name);

/// Whether `name` is registered (no plugin search).
bool has_backend(const std::string& name);

/// Registered backend names, sorted. Backends tagged with one of `exclude_tags` are left out
/// (by default `debug` and `experimental`, as torch._dynamo.list_backends() does).
std::vector<std::string> list_backends(const std::vector<std::string>& exclude_tags = {"debug", "experimental"});

/// The ABI version of the plugin interface; a plugin built against another version is refused.
constexpr uint32_t kPluginAbiVersion = 1;

/// What a plugin's registration function receives.
class PluginRegistrar {
 public:
  virtual ~PluginRegistrar() = default;
  /// Register a backend; same rules as register_backend.
  virtual void register_backend(const std::string& name, Backend fn, std::vector<std::string> tags = {}) = 0;
};

/// Load a backend plugin from `path` and run its registration function. Throws, naming the
/// file, if the file cannot be opened (with dlerror()), a required symbol is missing, the ABI
/// version differs, or a backend name is already registered. Loading the same file twice is a
/// no-op. Returns the names the plugin registered.
std::vector<std::string> load_backend_library(const std::string& path);

}  // namespace torchcompile

// Symbols a plugin exports (declared here so plugins and the loader agree on them).
#define TORCHCOMPILE_PLUGIN_ABI_SYMBOL "torchcompile_plugin_abi_version"
#define TORCHCOMPILE_PLUGIN_REGISTER_SYMBOL "torchcompile_plugin_register"

/// Define a plugin's entry points:
///
///     TORCHCOMPILE_PLUGIN(registrar) {
///       registrar.register_backend("my_backend", my_backend_fn);
///     }
#define TORCHCOMPILE_PLUGIN(registrar_name)                                                          \
  extern "C" __attribute__((visibility("default"))) uint32_t torchcompile_plugin_abi_version() {    \
    return ::torchcompile::kPluginAbiVersion;                                                        \
  }                                                                                                  \
  extern "C" __attribute__((visibility("default"))) void torchcompile_plugin_register(               \
      ::torchcompile::PluginRegistrar& registrar_name)

#define TORCHCOMPILE_CONCAT_INNER_(a, b) a##b
#define TORCHCOMPILE_CONCAT_(a, b) TORCHCOMPILE_CONCAT_INNER_(a, b)

/// Register a backend from a library or executable linked with torchcompile, at static
/// initialization:  `TORCHCOMPILE_REGISTER_BACKEND(my_backend, my_backend_fn);`
#define TORCHCOMPILE_REGISTER_BACKEND(name, fn)                                                      \
  static const bool TORCHCOMPILE_CONCAT_(torchcompile_backend_registered_, __LINE__) = [] {          \
    ::torchcompile::register_backend(#name, fn);                                                     \
    return true;                                                                                     \
  }()
