// Shared by the repro files: copies that a run cannot change, and the generator's state.
#pragma once

#include <torchcompile/backends/backend.h>
#include <torchcompile/ir/graph_module.h>
#include <torchcompile/repro/repro.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torchcompile::repro::detail {

/// A copy of `t` (same strides where dense), in float64 if `to_double` and floating; keeps
/// requires_grad.
at::Tensor copy_tensor(const at::Tensor& t, bool to_double = false);
std::vector<at::Tensor> copy_tensors(const std::vector<at::Tensor>& ts, bool to_double = false);
/// `gm` with copies of its attributes (so running it changes nothing of `gm`).
std::unique_ptr<ir::GraphModule> copy_with_attributes(const ir::GraphModule& gm, bool to_double = false);

/// Sets the default CPU generator to `state` (if defined) and puts back what it was on exit.
class RngScope {
 public:
  explicit RngScope(const at::Tensor& state);
  ~RngScope();
  RngScope(const RngScope&) = delete;
  RngScope& operator=(const RngScope&) = delete;

 private:
  at::Tensor saved_;
};
/// The default CPU generator's state now.
at::Tensor rng_state();

/// TORCHCOMPILE_REPRO_* as read at a compile (nullopt: repros are off).
struct Config {
  int level = 2;
  std::string dir;
  double tolerance = 1e-3;
};
std::optional<Config> config_from_env();

/// Write a repro of `gm` (the graph as handed to the backend) for `failure`, and with level >= 3
/// minify it; warn with the directory. Never throws (a repro that cannot be written is warned
/// about). Returns the directory written, or "".
std::string write_failure(const Config& cfg, const ir::GraphModule& gm, const std::vector<at::Tensor>& inputs,
                          const std::string& backend, Failure failure, const std::string& message,
                          const at::Tensor& rng);

/// The compiled function `fn` of `gm`, watched at cfg.level: 2 and 3 write a repro when a call
/// throws (and rethrow); 4 also compares each call's results with the interpreter's and writes
/// a repro of the first mismatch (the call returns the compiled results, as without the check).
CompiledFn watch(const Config& cfg, std::shared_ptr<const ir::GraphModule> gm, const std::string& backend,
                 CompiledFn fn);

}  // namespace torchcompile::repro::detail
