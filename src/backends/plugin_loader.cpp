// Loading backend plugins: shared libraries exporting TORCHCOMPILE_PLUGIN's two symbols.
//
// A plugin's registrations are collected first and registered all at once, so a plugin with
// one bad name registers nothing. Handles stay open for the life of the process: the
// registered backends point into the library's code.
#include <torchcompile/backends/registry.h>

#include "backends/registry_internal.h"

#include <c10/util/Exception.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace torchcompile {
namespace {

using AbiVersionFn = uint32_t (*)();
using RegisterFn = void (*)(PluginRegistrar&);

// Collects what a plugin registers, to be checked and registered as a whole afterwards.
class CollectingRegistrar final : public PluginRegistrar {
 public:
  void register_backend(const std::string& name, Backend fn, std::vector<std::string> tags) override {
    pending_.push_back(detail::PendingBackend{name, std::move(fn), std::move(tags)});
  }
  std::vector<detail::PendingBackend>& pending() { return pending_; }

 private:
  std::vector<detail::PendingBackend> pending_;
};

struct LoadedPlugins {
  // Recursive: a plugin's registration function may itself look up a backend, which can
  // load another plugin from TORCHCOMPILE_BACKEND_PATH.
  std::recursive_mutex mutex;
  std::map<std::string, std::vector<std::string>> names_by_path;  // canonical path -> names
};

LoadedPlugins& loaded_plugins() {
  static LoadedPlugins p;
  return p;
}

std::string last_dlerror() {
  const char* e = dlerror();
  return e ? e : "no error reported by dlerror()";
}

// A symbol's address; throws naming the file and the symbol if it is missing.
void* required_symbol(void* handle, const char* symbol, const std::string& path) {
  dlerror();  // clear any earlier error
  void* sym = dlsym(handle, symbol);
  if (sym) return sym;
  TORCH_CHECK(false, "backend plugin '", path, "' does not export the symbol '", symbol,
              "' (define it with TORCHCOMPILE_PLUGIN): ", last_dlerror());
  return nullptr;
}

}  // namespace

std::vector<std::string> load_backend_library(const std::string& path) {
  TORCH_CHECK(!path.empty(), "load_backend_library: the plugin path is empty");

  // An existing file is identified by its canonical path, so two spellings of one file load
  // it once. Anything else goes to dlopen as given, which reports why it cannot be opened.
  std::string key = path;
  {
    std::error_code ec;
    auto canonical = std::filesystem::canonical(path, ec);
    if (!ec) key = canonical.string();
  }

  auto& plugins = loaded_plugins();
  std::lock_guard<std::recursive_mutex> lock(plugins.mutex);
  if (auto it = plugins.names_by_path.find(key); it != plugins.names_by_path.end()) return it->second;

  dlerror();
  void* handle = dlopen(key.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(handle, "cannot load backend plugin '", path, "': ", last_dlerror());
  // From here on the handle is never closed, even on error: the library's static
  // constructors may already have handed out pointers into it.

  auto abi_version = reinterpret_cast<AbiVersionFn>(required_symbol(handle, TORCHCOMPILE_PLUGIN_ABI_SYMBOL, path));
  auto register_fn = reinterpret_cast<RegisterFn>(required_symbol(handle, TORCHCOMPILE_PLUGIN_REGISTER_SYMBOL, path));
  const uint32_t found = abi_version();
  TORCH_CHECK(found == kPluginAbiVersion, "backend plugin '", path, "' was built for plugin ABI version ", found,
              ", but this torchcompile expects ABI version ", kPluginAbiVersion, "; rebuild the plugin");

  CollectingRegistrar registrar;
  try {
    register_fn(registrar);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "backend plugin '", path, "' failed in its registration function: ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "backend plugin '", path, "' failed in its registration function: ", e.what());
  }

  std::vector<std::string> names;
  names.reserve(registrar.pending().size());
  for (const auto& b : registrar.pending()) names.push_back(b.name);
  detail::register_backends_atomically(std::move(registrar.pending()), "backend plugin '" + path + "'");

  plugins.names_by_path.emplace(key, names);
  return names;
}

namespace detail {

std::string plugin_of_backend(const std::string& name) {
  auto& plugins = loaded_plugins();
  std::lock_guard<std::recursive_mutex> lock(plugins.mutex);
  for (const auto& [path, names] : plugins.names_by_path)
    if (std::find(names.begin(), names.end(), name) != names.end()) return path;
  return "";
}

}  // namespace detail

}  // namespace torchcompile
