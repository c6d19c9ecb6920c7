// Compiling TorchScript modules: a torch::jit::Module, as torch::jit::load returns it.
//
//     torch::jit::Module m = torch::jit::load("model.pt");
//     auto fast = torch::compile(m, "default");
//     torch::jit::IValue out = fast.forward({x});   // as m.forward({x})
//     at::Tensor y = fast(x).toTensor();              // the same, with tensors as arguments
//     auto enc = torchcompile::compile_method(m, "encode", "default");
//
// The method runs under the tracer as a C++ forward does: TorchScript's interpreter calls ATen
// through the dispatcher, so its ops are recorded like any other. The module's parameters,
// buffers and other tensor attributes, recursively, are the graph's attributes, read live: an
// in-place update (`p.copy_()`, an optimizer step) is seen by the compiled graph, and a tensor
// replaced by `setattr` or `register_parameter` is seen by the guards (the call traces again).
// `train()` / `eval()` of the module and its submodules are guarded. A scalar, string or list
// attribute changed after compiling (`m.setattr("scale", 2.0)`) drops the compiled entries: the
// next call traces again. A method that changes the module's attributes itself (a counter, a
// cached tensor) runs eagerly, with the reason in explain and the logs: the compiled graph
// could not repeat it. Scripted control flow on tensor data (`if bool(x.sum() > 0)`) is a
// graph break, as `item()` in C++.
//
// Arguments and results: tensors, None, bool, int, float, str, and tuples, lists and dicts of
// these, nested; keyword arguments and defaults as the method's schema gives them. Scalars and
// strings among the arguments are specialized (another value is another cache entry).
#pragma once

#include <torchcompile/runtime/compile_options.h>
#include <torchcompile/runtime/compiled_function.h>

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/module.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchcompile {

namespace detail {
class ScriptModuleState;
}  // namespace detail

/// A compiled method of a TorchScript module. Called like the method (`fast.forward({x})`,
/// `fast(x)`), returning the same IValue. Copies share one cache. Thread-safe as the compiled
/// objects of C++ modules are.
class CompiledScriptModule {
 public:
  /// Calls the compiled method with `inputs` (without `self`) and keyword arguments, as
  /// `torch::jit::Method::operator()` takes them.
  c10::IValue forward(std::vector<c10::IValue> inputs,
                      const std::unordered_map<std::string, c10::IValue>& kwargs = {}) const;

  /// `fast(x, y)`: forward({x, y}).
  template <typename... Args>
  c10::IValue operator()(Args&&... args) const {
    return forward(std::vector<c10::IValue>{c10::IValue(std::forward<Args>(args))...});
  }

  /// The module (the same object the caller holds: TorchScript modules are references).
  const torch::jit::Module& module() const;
  /// The compiled method's name ("forward" unless compile_method named another).
  const std::string& method_name() const;
  /// The cache and its statistics (a new one after an attribute change dropped the entries).
  runtime::CompiledFunction& state() const;

 private:
  friend CompiledScriptModule compile_method(torch::jit::Module module, const std::string& method,
                                             CompileOptions options);
  explicit CompiledScriptModule(std::shared_ptr<detail::ScriptModuleState> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<detail::ScriptModuleState> impl_;
};

/// Compile the method `method` of a TorchScript module (`torch::jit::load`ed, or scripted in
/// C++). Throws if the module has no such method.
CompiledScriptModule compile_method(torch::jit::Module module, const std::string& method, CompileOptions options = {});

/// Compile a TorchScript module's `forward`.
inline CompiledScriptModule compile(torch::jit::Module module, CompileOptions options = {}) {
  return compile_method(std::move(module), "forward", std::move(options));
}

}  // namespace torchcompile

namespace torch {
using torchcompile::compile;  // the overload above, next to those of frontend/compiled.h
}  // namespace torch
