// The "debugging backend" examples of PyTorch's custom-backends guide, in C++: a custom backend that prints the captured
// graph and returns a callable running it, used on a function and on a module.
#include <torch/torch.h>
#include <torchcompile/torchcompile.h>

#include <iostream>
#include <utility>
#include <vector>

// A backend: receives the captured graph and the example inputs, returns the compiled graph.
torchcompile::CompiledFn my_compiler(torchcompile::GraphModule& gm, const std::vector<torch::Tensor>& example_inputs) {
  std::cout << "my_compiler() called with FX graph:\n";
  gm.print_tabular(std::cout);
  std::cout << std::endl;
  // Python returns gm.forward; here a CompiledFn calling it. The GraphModule outlives the
  // CompiledFn made from it, so capturing it by reference is safe.
  return [&gm](std::vector<torch::Tensor> inputs) { return gm.forward(std::move(inputs)); };
}

torch::Tensor fn(torch::Tensor x, torch::Tensor y) {
  torch::Tensor a = torch::cos(x);
  torch::Tensor b = torch::sin(y);
  return a + b;
}

struct MockModuleImpl : torch::nn::Module {
  MockModuleImpl() : relu(register_module("relu", torch::nn::ReLU())) {}
  torch::Tensor forward(torch::Tensor x) { return relu(torch::cos(x)); }
  torch::nn::ReLU relu;
};
TORCH_MODULE(MockModule);

int main() {
  torch::manual_seed(0);
  int failures = 0;

  // A function; the placeholders are named after fn's parameters.
  {
    auto opt_fn = torch::compile(fn, torchcompile::CompileOptions(my_compiler).with_input_names({"x", "y"}));
    torch::Tensor x = torch::randn({10}), y = torch::randn({10});
    torch::Tensor out = opt_fn(x, y);   // traces and calls my_compiler
    torch::Tensor again = opt_fn(x, y); // cache hit: runs the compiled graph, no new compile
    if (!torch::allclose(out, fn(x, y)) || !torch::allclose(again, fn(x, y))) {
      std::cerr << "fn: compiled result differs from eager\n";
      ++failures;
    }
  }

  // A module with a registered submodule.
  {
    MockModule mod;
    auto optimized_mod = torch::compile(mod, my_compiler);
    torch::Tensor x = torch::randn({10});
    torch::Tensor out = optimized_mod(x);
    if (!torch::allclose(out, mod(x))) {
      std::cerr << "MockModule: compiled result differs from eager\n";
      ++failures;
    }
  }

  std::cout << (failures ? "FAILED" : "both compiled results match eager") << std::endl;
  return failures ? 1 : 0;
}
