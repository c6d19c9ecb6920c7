// User functions as call_function targets, and the registry of named ones.
#include <torchcompile/ir/callable.h>

#include "text_internal.h"

#include <cctype>
#include <map>
#include <mutex>

namespace torchcompile {

namespace ir {

namespace {

bool valid_callable_name(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != ':') return false;
  return true;
}

}  // namespace

std::shared_ptr<const Callable> make_callable(std::string name, CallableFn fn) {
  TORCH_CHECK(valid_callable_name(name), "make_callable: expected a name of letters, digits, '_', '.' and ':' ",
              "not starting with a digit (like 'test_add' or 'mylib::fast_add'), got '", name, "'");
  TORCH_CHECK(fn != nullptr, "make_callable('", name, "'): expected a function, got an empty one");
  return std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
}

namespace detail {

std::string registered_callable_names() {
  std::string known;
  for (const auto& k : list_callables()) known += (known.empty() ? "" : ", ") + k;
  return known.empty() ? "none" : known;
}

}  // namespace detail

}  // namespace ir

namespace {

struct CallableRegistry {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<const ir::Callable>> callables;
};

CallableRegistry& callable_registry() {
  static auto* registry = new CallableRegistry;  // never destroyed: usable from static destructors
  return *registry;
}

}  // namespace

void register_callable(const std::string& name, ir::CallableFn fn) {
  auto callable = ir::make_callable(name, std::move(fn));
  auto& r = callable_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  TORCH_CHECK(r.callables.emplace(name, std::move(callable)).second, "register_callable: a callable named '", name,
              "' is already registered");
}

bool unregister_callable(const std::string& name) {
  auto& r = callable_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.callables.erase(name) != 0;
}

std::shared_ptr<const ir::Callable> lookup_callable(const std::string& name) {
  auto& r = callable_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.callables.find(name);
  return it == r.callables.end() ? nullptr : it->second;
}

std::vector<std::string> list_callables() {
  auto& r = callable_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, callable] : r.callables) names.push_back(name);
  return names;
}

}  // namespace torchcompile
