// Custom backends registered by name, and the composable backend of PyTorch's custom-backends guide.
#include <torch/torch.h>
#include <torchcompile/torchcompile.h>

#include <atomic>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace {

std::atomic<int> graphs_seen{0};

// A backend that counts the graphs it compiles and runs them with the interpreter.
torchcompile::CompiledFn counting_backend(torchcompile::GraphModule& gm, const std::vector<torch::Tensor>& example_inputs) {
  ++graphs_seen;
  std::cout << "[counting backend] graph #" << graphs_seen << ": " << gm.graph().size() << " nodes, "
            << example_inputs.size() << " inputs\n";
  return [&gm](std::vector<torch::Tensor> inputs) { return gm.forward(std::move(inputs)); };
}

// A backend that declines (returns an empty CompiledFn) graphs with more than 4 nodes, as a
// specialised compiler would decline graphs it does not support.
torchcompile::CompiledFn small_graphs_only(torchcompile::GraphModule& gm, const std::vector<torch::Tensor>&) {
  if (gm.graph().size() > 4) {
    std::cout << "[small_graphs_only] declining a graph of " << gm.graph().size() << " nodes\n";
    return {};
  }
  std::cout << "[small_graphs_only] compiling a graph of " << gm.graph().size() << " nodes\n";
  return [&gm](std::vector<torch::Tensor> inputs) { return gm.forward(std::move(inputs)); };
}

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

// Registered at static initialization under the name "counting" (Python: @register_backend).
TORCHCOMPILE_REGISTER_BACKEND(counting, counting_backend);

// The guide's composable backend, written by hand: try each backend in turn, skipping those
// that are not available, throw or decline, and fall back to running the graph as captured.
torchcompile::CompiledFn my_compiler(torchcompile::GraphModule& gm, const std::vector<torch::Tensor>& example_inputs) {
  for (const char* name : {"tensorrt", "small_graphs_only"}) {
    try {
      if (torchcompile::CompiledFn fn = torchcompile::lookup_backend(name)(gm, example_inputs)) {
        std::cout << "my_compiler: using backend '" << name << "'\n";
        return fn;
      }
    } catch (const c10::Error& e) {
      std::cout << "my_compiler: backend '" << name << "' failed: " << e.what_without_backtrace() << "\n";
    } catch (const std::exception& e) {
      std::cout << "my_compiler: backend '" << name << "' failed: " << e.what() << "\n";
    }
  }
  std::cout << "my_compiler: falling back to gm.forward\n";
  return [&gm](std::vector<torch::Tensor> inputs) { return gm.forward(std::move(inputs)); };
}

int main() {
  torch::manual_seed(0);
  int failures = 0;
  auto check = [&](const char* what, const torch::Tensor& got, const torch::Tensor& want) {
    const bool ok = torch::allclose(got, want);
    std::cout << what << ": " << (ok ? "matches eager" : "MISMATCH") << "\n\n";
    if (!ok) ++failures;
  };

  // Registered at run time, with a tag: tagged "experimental", it is left out of
  // list_backends() by default, as in torch._dynamo.list_backends().
  torchcompile::register_backend("small_graphs_only", small_graphs_only, {"experimental"});

  std::cout << "list_backends():   " << join(torchcompile::list_backends()) << "\n";
  std::cout << "list_backends({}): " << join(torchcompile::list_backends({})) << "\n\n";

  auto small = [](torch::Tensor x) { return torch::relu(x) * 2; };
  auto large = [](torch::Tensor a, torch::Tensor b) { return (a.cos() + b.sin()).relu() * a - b; };
  torch::Tensor a = torch::randn({4, 4}), b = torch::randn({4, 4});

  // 1. A backend registered in code, used by name.
  {
    auto f = torch::compile(large, "counting");
    check("compile(large, \"counting\")", f(a, b), large(a, b));
  }

  // 2. The hand-written composable backend: "tensorrt" is unknown, "small_graphs_only"
  // compiles the small graph and declines the large one, which then runs as captured.
  {
    auto f = torch::compile(small, my_compiler);
    check("compile(small, my_compiler)", f(a), small(a));
    auto g = torch::compile(large, my_compiler);
    check("compile(large, my_compiler)", g(a, b), large(a, b));
  }

  // 3. The same with torchcompile::fallback_chain: the plugin backend "example" when it can be
  // found on TORCHCOMPILE_BACKEND_PATH, otherwise (with a warning) "eager".
  {
    auto f = torch::compile(large, torchcompile::fallback_chain({"example", "eager"}));
    check("compile(large, fallback_chain({\"example\", \"eager\"}))", f(a, b), large(a, b));
  }

  std::cout << "the counting backend compiled " << graphs_seen << " graph(s)\n";
  return failures ? 1 : 0;
}
