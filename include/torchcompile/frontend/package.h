// Packages: a compiled model saved to one file and loaded where its code is not.
//
//     auto fast = torch::compile(model, "default");          // a C++ module, or a TorchScript one
//     fast(x);                                              // each signature to serve, once
//     torchcompile::save(fast, "model.tcpkg");
//
//     // Another program, linked only with torchcompile (no model code):
//     torchcompile::LoadedModule m = torchcompile::load("model.tcpkg", "default");
//     at::Tensor y = m(x).toTensor();                       // or m.forward({x})
//
// A package holds what the compiled object captured: every cache entry's graphs (the text
// format, with size symbols where the entry has them), its guards, the graph breaks' branch
// values seen so far, how arguments and results are encoded, the weights (one `torch.save`
// file inside the package) and the versions of the format and of LibTorch that wrote it. Loading
// compiles the graphs with the backend given to load(), for the CPU that loads them. A call the
// package has no graph for (another signature, a size outside every entry, a branch value
// never seen) throws an error that names what was not captured. docs/deploying.md says more.
#pragma once

#include <torchcompile/runtime/compile_options.h>
#include <torchcompile/runtime/compiled_function.h>

#include <ATen/core/ivalue.h>

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace torchcompile {

template <typename Callable>
class Compiled;
class CompiledScriptModule;

namespace detail {
class LoadedState;
/// How a package's callers pass arguments and get results.
struct PackageInterface {
  /// A TorchScript method: its schema without `self` (`forward(Tensor x, int n=2) -> Tensor`);
  /// empty for a C++ forward (arguments flattened as torch::compile flattens them).
  std::string script_schema;
};
void save_package(const runtime::CompiledFunction& state, const PackageInterface& interface, const std::string& path);
}  // namespace detail

/// Save what `compiled` has captured so far to `path` (overwritten). Throws if the object has
/// captured nothing that can be saved (no entry, or only entries that ran eagerly), or if a
/// graph holds something a file cannot (a module called opaquely, a user function).
template <typename Callable>
void save(const Compiled<Callable>& compiled, const std::string& path) {
  detail::save_package(compiled.state(), detail::PackageInterface{}, path);
}
void save(const CompiledScriptModule& compiled, const std::string& path);

/// A package loaded by torchcompile::load. Thread-safe: calls may run concurrently (and with
/// load_state_dict, which waits for running calls).
class LoadedModule {
 public:
  /// Call the saved forward. Arguments as the compiled object took them: for a TorchScript
  /// method, as `torch::jit::Method` takes them (keyword arguments and defaults included); for
  /// a C++ forward, its arguments in order (tensors, `None` for an absent optional tensor, ints,
  /// doubles, bools, lists of tensors; a tuple or struct argument as a tuple IValue). The result
  /// is the method's IValue, or for a C++ forward its return value as an IValue (a tensor; a
  /// std::vector as a list; a tuple, pair or struct as a tuple; an absent optional as None).
  c10::IValue forward(std::vector<c10::IValue> inputs,
                      const std::unordered_map<std::string, c10::IValue>& kwargs = {}) const;

  /// `m(x, y)`: forward({x, y}).
  template <typename... Args>
  c10::IValue operator()(Args&&... args) const {
    return forward(std::vector<c10::IValue>{c10::IValue(std::forward<Args>(args))...});
  }

  /// The weights by name (`fc.weight`; graph constants as `constant.<k>`): the tensors the
  /// compiled graphs read.
  std::map<std::string, at::Tensor> state_dict() const;
  /// Replace weights in place (the same dtype and sizes; values copied): later calls use them,
  /// as AOTInductor's constant-buffer swap does. With `strict`, every weight of the package
  /// must be given; names the package does not have are an error either way.
  void load_state_dict(const std::map<std::string, at::Tensor>& weights, bool strict = true);

  /// The name of the saved object (the module's name).
  const std::string& name() const;
  /// One line per saved entry: its signature (sizes, symbols and their ranges, scalars) and
  /// its graphs and graph breaks, and how its graphs were compiled at load.
  std::vector<std::string> describe() const;
  /// Number of saved entries and the number of graphs compiled at load.
  size_t num_entries() const;
  size_t num_graphs() const;
  /// The graphs of every entry in the text format, in order.
  std::vector<std::string> graph_texts() const;
  /// Arguments that entry `entry` accepts, for tools and smoke tests: tensors of its sizes (the
  /// traced ones for symbols) and dtypes, floating ones standard normal, integers zero, bools
  /// random; its scalars. Throws for an entry whose arguments hold containers of a TorchScript
  /// method (give the arguments yourself).
  std::vector<c10::IValue> example_inputs(size_t entry = 0) const;

 private:
  friend LoadedModule load(const std::string& path, CompileOptions options);
  explicit LoadedModule(std::shared_ptr<detail::LoadedState> state) : state_(std::move(state)) {}
  std::shared_ptr<detail::LoadedState> state_;
};

/// Load a package written by torchcompile::save and compile its graphs with `options` (a
/// backend name or CompileOptions; `dynamic` and cache settings do not apply: the package
/// says which sizes are symbols). A file that is not a package, is truncated or corrupted, was
/// written in another format version, or needs an operator this LibTorch lacks gives an error
/// naming the file and the problem.
LoadedModule load(const std::string& path, CompileOptions options = {});

}  // namespace torchcompile
