// Options of torch::compile.
#pragma once

#include <torchcompile/backends/registry.h>
#include <torchcompile/compile/precision.h>

#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchcompile {

/// How to compile. Implicitly constructible from a backend name or a backend function, so
/// `compile(m, "debug")`, `compile(m, my_backend)` and `compile(m, options)` all work.
struct CompileOptions {
  /// A registered backend name; "default" is the best built-in available.
  std::string backend = "default";
  /// A backend function; when set it is used instead of `backend`.
  Backend backend_fn;
  /// Turn anything that would split or abandon the graph into an error.
  bool fullgraph = false;
  /// Names of the placeholders, one per flattened tensor input (a `std::vector<Tensor>`
  /// argument named `xs` gives `xs_0`, `xs_1`, ...). Defaults: `arg0`, `arg1`, ...
  std::vector<std::string> input_names;
  /// Cached entries per compiled object (and continuations per graph break); beyond it the
  /// call warns once and runs eagerly.
  size_t cache_size_limit = 8;
  /// Run eager LibTorch next to every compiled call (on the same inputs, with the module's
  /// state and the random generator restored in between) and warn about the first output that
  /// differs beyond tolerance: catches forwards whose host logic the trace cannot see
  /// (docs/graph-breaks-and-explain.md). Also switched on by TORCHCOMPILE_VERIFY=1. Slow: for debugging.
  bool verify = false;
  /// Dynamic shapes (docs/dynamic-shapes.md). Unset (the default): automatic — the first trace
  /// is static, and a dimension whose size differs on a later call becomes a size symbol in the
  /// next trace. `true`: every dimension of every input is a symbol from the first trace, except
  /// sizes 0 and 1. `false`: always static (each new size is a new entry). A dimension the
  /// forward's host code reads (`x.size(0)`) stays a symbol of the same entry, which runs the
  /// forward again to trace each new size of it (TORCHCOMPILE_LOGS=dynamic says so).
  /// torchcompile::mark_dynamic / mark_static mark single dimensions.
  std::optional<bool> dynamic;
  /// Reduced precision on request (see Precision). A precision other than Float32 is for
  /// inference: calling the compiled module with grad mode on while a parameter or an input
  /// requires grad is an error.
  Precision precision = Precision::Float32;
  /// Module paths whose Linears keep float32 under a reduced precision (`fc3`, `encoder.layers.0`:
  /// a path and everything below it). Small GEMMs (weight K x N below 16384 elements) keep it by
  /// rule; explain() lists the precision of every GEMM and why.
  std::vector<std::string> keep_float32;
  /// BFloat16 on a CPU without AVX512-BF16 or AMX: round inputs and weights to bfloat16 and
  /// compute in float32 (the same numbers, slower than float32) instead of refusing to compile.
  bool emulate_precision = false;
  /// PyTorch's modes (docs/signatures-and-options.md#mode): "default" compiles each graph with
  /// the backend; "max-autotune" (or "max-autotune-no-cudagraphs") also compiles each inference
  /// graph with the other built-ins that can run it, times them on the call's inputs and keeps
  /// the fastest (cached per graph, shapes, ISA and thread count; on disk with
  /// TORCHCOMPILE_CACHE_DIR). "reduce-overhead" (CUDA graphs in PyTorch) is an error here.
  std::string mode = "default";

  CompileOptions() = default;
  CompileOptions(const char* name) : backend(name) {}
  CompileOptions(std::string name) : backend(std::move(name)) {}
  CompileOptions(Backend fn) : backend("<function>"), backend_fn(std::move(fn)) {}
  template <typename F,
            typename = std::enable_if_t<!std::is_convertible_v<F, std::string> && !std::is_same_v<std::decay_t<F>, Backend> &&
                                        std::is_invocable_r_v<CompiledFn, F, GraphModule&, const std::vector<at::Tensor>&>>>
  CompileOptions(F&& fn) : backend("<function>"), backend_fn(Backend(std::forward<F>(fn))) {}

  CompileOptions& with_backend(std::string name) { backend = std::move(name); backend_fn = nullptr; return *this; }
  CompileOptions& with_fullgraph(bool on = true) { fullgraph = on; return *this; }
  CompileOptions& with_input_names(std::vector<std::string> names) { input_names = std::move(names); return *this; }
  CompileOptions& with_cache_size_limit(size_t n) { cache_size_limit = n; return *this; }
  CompileOptions& with_verify(bool on = true) { verify = on; return *this; }
  CompileOptions& with_dynamic(bool on = true) { dynamic = on; return *this; }
  CompileOptions& with_precision(Precision p) { precision = p; return *this; }
  CompileOptions& with_keep_float32(std::vector<std::string> paths) { keep_float32 = std::move(paths); return *this; }
  CompileOptions& with_emulated_precision(bool on = true) { emulate_precision = on; return *this; }
  CompileOptions& with_mode(std::string m) { mode = std::move(m); return *this; }

  /// The fields the precision pass reads.
  PrecisionOptions precision_options() const { return {precision, keep_float32, emulate_precision}; }
};

}  // namespace torchcompile
