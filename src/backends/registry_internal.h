// Private: what the plugin loader needs from the backend registry.
#pragma once

#include <torchcompile/backends/registry.h>

#include <string>
#include <vector>

namespace torchcompile::detail {

/// A backend waiting to be registered.
struct PendingBackend {
  std::string name;
  Backend fn;
  std::vector<std::string> tags;
};

/// Register all of `backends` or none of them: under one lock, every name is checked (not
/// empty, not registered yet, not repeated in `backends`) before any is inserted. `origin`
/// says where they come from (`plugin '/path/libx.so'`) and appears in errors.
void register_backends_atomically(std::vector<PendingBackend> backends, const std::string& origin);

/// The path of the plugin library that registered `name`, or "" (registered in code, or unknown).
std::string plugin_of_backend(const std::string& name);

}  // namespace torchcompile::detail
