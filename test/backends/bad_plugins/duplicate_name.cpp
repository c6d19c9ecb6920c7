// A plugin registering a fresh name and one that duplicates a built-in backend ("eager"): the
// loader must refuse it, naming "eager" and this file, and register neither name.
#include <torchcompile/backends/registry.h>

#include <utility>
#include <vector>

namespace {
torchcompile::CompiledFn run_graph(torchcompile::GraphModule& gm, const std::vector<at::Tensor>&) {
  return [&gm](std::vector<at::Tensor> inputs) { return gm.forward(std::move(inputs)); };
}
}  // namespace

TORCHCOMPILE_PLUGIN(registrar) {
  registrar.register_backend("bad_dup_ok", run_graph);
  registrar.register_backend("eager", run_graph);
}
