// Repro directories and the minifier: when a backend fails to compile a graph, fails while
// running it, or computes a wrong result, the graph, its inputs and attributes, and the backend's
// name (with the plugin it came from) are written to a directory that replays the failure
// without the program; the minifier shrinks it to the few ops that still fail the same way.
//
// Written by the compile pipeline when TORCHCOMPILE_REPRO_AFTER=backend is set:
//   TORCHCOMPILE_REPRO_LEVEL=1  a backend's compile error writes a repro (the default level: 2)
//                            2  also an error while running a compiled graph
//                            3  as 2, and each repro is minified
//                            4  accuracy: every call of a compiled graph is compared with the
//                               interpreter (in float64 where the graph allows); a difference
//                               beyond TORCHCOMPILE_REPRO_TOLERANCE (default 1e-3) is a failure,
//                               written and minified. Levels 2-4 copy each call's inputs.
//   TORCHCOMPILE_REPRO_DIR      where (default ./torchcompile_repro); one subdirectory per graph.
// Read by `torchcompile-minify <dir>` and by the functions below.
#pragma once

#include <torchcompile/ir/graph_module.h>

#include <ATen/core/Tensor.h>

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

namespace torchcompile::repro {

enum class Failure {
  None,          ///< compiled (or declined) and ran, results within tolerance
  CompileError,  ///< the backend threw while compiling the graph
  RunError,      ///< the compiled graph threw when called
  Accuracy,      ///< the compiled graph's results differ from the interpreter's
};
/// "none", "compile_error", "run_error", "accuracy".
const char* failure_name(Failure f);
Failure parse_failure(const std::string& name);

/// One failing graph, as written to a repro directory.
struct Repro {
  std::shared_ptr<ir::GraphModule> gm;  ///< the graph handed to the backend, with its attributes
  std::vector<at::Tensor> inputs;       ///< the call's inputs (placeholders, in order)
  std::string backend;                  ///< the registered backend name
  std::string plugin;                   ///< the plugin library the backend was loaded from, or ""
  Failure failure = Failure::None;      ///< how it failed
  std::string error;                    ///< the error message, or the accuracy report
  double tolerance = 1e-3;              ///< accuracy tolerance (RMSE, as PyTorch's minifier)
  at::Tensor rng_state;                 ///< the CPU generator's state at the call (may be undefined)
  std::string libtorch_version;         ///< of the program that wrote it
};

/// What checking a repro gave.
struct Outcome {
  Failure failure = Failure::None;
  std::string message;  ///< the error, or how the results differ
  /// `compile_error: <message>` (one line per message line), or `ok`.
  std::string describe() const;
};

/// Write `r` into `dir` (created; existing files replaced): graph.txt, tensors.pt (LibTorch's
/// pickle format: `torch.load` reads it too), repro.txt (backend, plugin, failure, tolerance,
/// versions, input metadata), error.txt and a README saying how to replay it. Throws if the graph
/// cannot be written (it calls an opaque module).
void save(const Repro& r, const std::string& dir);
/// Read a repro directory written by save(). Throws naming the file on a malformed directory.
Repro load(const std::string& dir);

/// The backend of `r`: registered, else loaded from `r.plugin`, else looked up by name (which
/// searches TORCHCOMPILE_BACKEND_PATH). Throws if none is found.
void ensure_backend(const Repro& r);

/// Compile `r`'s graph with its backend and run it on copies of its inputs (attributes copied
/// too, the generator set to `r.rng_state`), as the failing program did. With `accuracy`,
/// compare the results with the interpreter's (accuracy_mismatch). Nothing of `r` changes.
Outcome check(const Repro& r, bool accuracy);
/// check() with the kind of check `r.failure` calls for.
Outcome replay(const Repro& r);
/// Whether `o` is `r`'s failure: the same kind and, for errors, the same first line of the
/// message (any error of the same kind with `any_error`).
bool same_failure(const Repro& r, const Outcome& o, bool any_error = false);

/// How `actual` (the compiled graph's results for `inputs`) differs from the interpreter's, or
/// "" if it does not. Floating-point outputs: the reference runs in float64 when the graph
/// allows it (no random ops, every op accepts double) and the compiled result passes if its RMSE
/// against that is at most 2x the float32 interpreter's plus tolerance/10 (PyTorch's `same`
/// with fp64_ref); otherwise allclose(rtol = atol = tolerance) with the float32 interpreter.
/// Other dtypes must be equal. Runs the interpreter on copies of `inputs` and of `gm`'s
/// attributes, with the generator set to `rng_state` (if defined) and restored afterwards.
std::string accuracy_mismatch(const ir::GraphModule& gm, const std::vector<at::Tensor>& inputs,
                              const std::vector<at::Tensor>& actual, double tolerance, const at::Tensor& rng_state);

struct MinifyOptions {
  bool any_error = false;       ///< accept any error of the same kind while shrinking
  std::ostream* log = nullptr;  ///< each accepted step, one line
};
/// Shrink `r` to a smaller graph that still fails the same way (same_failure): truncate the
/// graph after the earliest value that still fails, replace values by new inputs holding what
/// they computed, remove nodes (side effects included) and unused inputs, until no step helps.
/// Returns the minimized repro (`r` is unchanged). Throws if `r` does not fail as recorded.
Repro minify(const Repro& r, const MinifyOptions& options = {});

/// Write a standalone program reproducing `r` into `dir` (which must hold `r`, as save()
/// writes it): repro.cpp, which embeds the graph, loads the tensors from `dir`, loads the
/// plugin, compiles, runs and compares, exiting with status 1 when it fails as recorded; and a
/// CMakeLists.txt using find_package(TorchCompile).
void write_program(const Repro& r, const std::string& dir);

/// A GraphModule from the text format and the attributes `attributes_of` holds (by name).
std::shared_ptr<ir::GraphModule> module_from_text(const std::string& graph_text, const ir::GraphModule& attributes_of);

/// Number of call_function nodes of `g`.
size_t count_calls(const ir::Graph& g);

}  // namespace torchcompile::repro
