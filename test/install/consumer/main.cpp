// Uses the installed torchcompile: compile a lambda, compare with eager. Exit code 0 on success.
#include <torchcompile/torchcompile.h>

#include <ATen/Functions.h>
#include <torch/nn/modules/linear.h>

#include <iostream>

int main() {
  auto fn = [](torch::Tensor a, torch::Tensor b) { return a.cos() * b + b.sin(); };
  auto fast = torch::compile(fn);
  for (int i = 0; i < 3; ++i) {  // the first call traces and compiles, later ones replay
    at::Tensor a = at::randn({8, 4});
    at::Tensor b = at::randn({8, 4});
    at::Tensor expected = fn(a, b);
    at::Tensor actual = fast(a, b);
    if (!at::allclose(expected, actual, /*rtol=*/1e-5, /*atol=*/1e-6)) {
      std::cerr << "consumer: compiled result differs from eager on call " << i << "\n";
      return 1;
    }
  }
  // The installed hook API: a forward hook on a compiled Linear fires on every call.
  torch::nn::Linear lin(4, 2);
  int fired = 0;
  torchcompile::register_forward_hook(lin, [&](torch::nn::Module&, const torchcompile::Tensors&,
                                               const torchcompile::Tensors&) { ++fired; });
  auto fast_lin = torch::compile(lin);
  for (int i = 0; i < 3; ++i) fast_lin(at::randn({3, 4}));
  if (fired != 3) {
    std::cerr << "consumer: the forward hook fired " << fired << " times in 3 compiled calls\n";
    return 1;
  }
  std::cout << "consumer: torch::compile via find_package(TorchCompile) matches eager\n";
  return 0;
}
