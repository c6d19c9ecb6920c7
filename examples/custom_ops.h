// Seed 003's last step in C++: a backend that swaps every aten::add.Tensor node for a function of
// its own that prints "call test add", under aot_autograd with addmm decomposed. Shared by
// examples/custom_ops.cpp and the test that counts the calls (test/ir/test_user_functions.cpp).
#pragma once

#include <torch/torch.h>
#include <torchcompile/torchcompile.h>

#include <iostream>
#include <memory>
#include <utility>
#include <vector>

namespace custom_ops {

// The seed's SimpleNN: its Linear layers are registered but, as in the seed's last version,
// forward does not call fc3 (`# x = self.fc3(x)`), only the two additions.
struct SimpleNNImpl : torch::nn::Module {
  explicit SimpleNNImpl(int64_t input_dim)
      : fc1(register_module("fc1", torch::nn::Linear(input_dim, 64))),
        fc2(register_module("fc2", torch::nn::Linear(64, 32))),
        fc3(register_module("fc3", torch::nn::Linear(input_dim, 12))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = x + x;
    x = x + x;
    return x;
  }

  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(SimpleNN);

// The seed's test_add(lhs, rhs). A node of aten::add.Tensor passes its schema's arguments,
// (self, other, alpha), defaults included.
inline at::Tensor test_add(const at::Tensor& lhs, const at::Tensor& rhs, const c10::Scalar& alpha) {
  std::cout << "call test add" << std::endl;
  return at::add(lhs, rhs, alpha);
}

// The seed's compiler_demo_inner: prints the graph, then points every aten::add.Tensor node at
// test_add (Python: `node.target = test_add`) and returns the graph module's forward.
inline torchcompile::CompiledFn compiler_demo_inner(torchcompile::GraphModule& gm,
                                                    const std::vector<at::Tensor>& /*example_inputs*/) {
  gm.print_readable(std::cout);
  gm.print_tabular(std::cout);
  auto fn = torchcompile::ir::make_callable("test_add", torchcompile::ir::typed_callable(test_add));
  for (const auto& node : gm.graph().nodes())
    if (node->target() == "aten::add.Tensor") gm.graph().set_target(node.get(), fn);
  gm.recompile();  // the graph changed: prepare the interpreter's plan again
  gm.print_tabular(std::cout);
  return [&gm](std::vector<at::Tensor> inputs) { return gm.forward(std::move(inputs)); };
}

// The same without touching the graph: the compiler runs it with an interpreter of its own in
// which aten::add.Tensor is overridden (FX's Interpreter subclass overriding call_function).
inline torchcompile::CompiledFn override_compiler(torchcompile::GraphModule& gm,
                                                  const std::vector<at::Tensor>& /*example_inputs*/) {
  auto interp = std::make_shared<torchcompile::ir::Interpreter>(gm);
  interp->override("aten::add.Tensor", torchcompile::ir::typed_callable(test_add));
  return [interp](std::vector<at::Tensor> inputs) { return interp->run(std::move(inputs)); };
}

// aot_autograd(fw_compiler=compiler, decompositions=get_decompositions({aten.addmm})).
inline torchcompile::Backend seed_backend(torchcompile::Backend compiler = compiler_demo_inner) {
  return torchcompile::aot_autograd(std::move(compiler), nullptr, torchcompile::get_decompositions({"aten::addmm"}));
}

}  // namespace custom_ops
