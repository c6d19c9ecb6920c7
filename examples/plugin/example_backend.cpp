// An example backend plugin. Build it as a shared library linked with torchcompile; then
//
//     torchcompile::load_backend_library("path/to/libtorchcompile_backend_example.so");
//     auto fast = torch::compile(model, "example");
//
// or put its directory on TORCHCOMPILE_BACKEND_PATH and just use the name "example".
//
// The backend counts the graphs it compiles, prints one line per graph, and runs each graph
// with the interpreter: the skeleton of a real backend, which would transform `gm` here. It
// declines graphs with an input that is not float32 (`return torchcompile::decline("...")`): the
// reason shows in explain() and in TORCHCOMPILE_LOGS=passes, and the graph runs with the
// interpreter.
#include <torchcompile/backends/registry.h>

#include <atomic>
#include <iostream>
#include <utility>
#include <vector>

// The registered name; the tests build a second copy of this plugin under another name.
#ifndef TORCHCOMPILE_EXAMPLE_BACKEND_NAME
#define TORCHCOMPILE_EXAMPLE_BACKEND_NAME "example"
#endif

namespace {

std::atomic<int> graphs_compiled{0};

torchcompile::CompiledFn example_backend(torchcompile::GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
  for (const torchcompile::ir::Node* p : gm.graph().placeholders()) {
    const torchcompile::ir::TensorMeta& m = p->output_meta().at(0);
    if (m.defined && m.dtype != c10::ScalarType::Float) return torchcompile::decline("it takes float32 inputs only");
  }
  const int n = ++graphs_compiled;
  std::cerr << "[" TORCHCOMPILE_EXAMPLE_BACKEND_NAME " backend] compiling graph #" << n << " with "
            << gm.graph().size() << " nodes and " << example_inputs.size() << " inputs\n";
  // The GraphModule outlives the CompiledFn made from it.
  return [&gm](std::vector<at::Tensor> inputs) { return gm.forward(std::move(inputs)); };
}

}  // namespace

TORCHCOMPILE_PLUGIN(registrar) {
  registrar.register_backend(TORCHCOMPILE_EXAMPLE_BACKEND_NAME, example_backend);
}
