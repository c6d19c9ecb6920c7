// Seed 003's custom backend in C++: aot_autograd with addmm decomposed and a forward compiler
// that swaps every aten::add.Tensor node for test_add, which prints "call test add". Each call
// of the compiled SimpleNN prints it twice (x = x + x; x = x + x) and returns eager's result, 4
// everywhere for ones(10, 2). Then the same with an interpreter override instead of a graph
// edit. Exits nonzero if a call prints it another number of times or differs from eager.
//
// One difference from Python: the first call traces the forward on the real inputs (computing
// eager's result while recording it) and compiles, so it prints the graphs but no "call test
// add"; Python's first call traces with fake tensors and then runs the compiled code. Every
// later call runs the compiled graph.
#include "custom_ops.h"

#include <iostream>
#include <sstream>
#include <string>

namespace {

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + what.size())) ++n;
  return n;
}

// Runs `call` with std::cout captured, echoes what it printed, returns the prints of test_add.
template <typename F>
size_t test_add_prints(F&& call) {
  std::ostringstream captured;
  std::streambuf* old = std::cout.rdbuf(captured.rdbuf());
  try {
    call();
  } catch (...) {
    std::cout.rdbuf(old);
    throw;
  }
  std::cout.rdbuf(old);
  std::cout << captured.str();
  return count_of(captured.str(), "call test add");
}

int run(const char* title, const torchcompile::Backend& backend) {
  std::cout << "== " << title << " (call 1 traces and compiles; calls 2-4 run the compiled graph)\n";
  custom_ops::SimpleNN model(2);
  auto model_opt = torch::compile(model, backend);
  torch::Tensor inputs = torch::ones({10, 2});
  torch::Tensor expected = model->forward(inputs);
  int failures = 0;
  for (int call = 1; call <= 4; ++call) {
    torch::Tensor out;
    size_t prints = test_add_prints([&] { out = model_opt(inputs); });
    std::cout << out << "\n";
    const size_t expected_prints = call == 1 ? 0 : 2;  // call 1 traces (see the top of the file)
    if (prints != expected_prints) {
      std::cerr << title << ", call " << call << ": printed \"call test add\" " << prints << " times, expected "
                << expected_prints << "\n";
      ++failures;
    }
    if (!torch::equal(out, expected)) {
      std::cerr << title << ", call " << call << ": the result differs from eager\n";
      ++failures;
    }
  }
  return failures;
}

}  // namespace

int main() {
  torch::manual_seed(0);
  int failures = run("test_add as the target of the add nodes", custom_ops::seed_backend());
  failures += run("aten::add.Tensor overridden in the interpreter", custom_ops::seed_backend(custom_ops::override_compiler));
  std::cout << (failures ? "FAILED" : "every compiled call printed \"call test add\" twice and matched eager") << std::endl;
  return failures ? 1 : 0;
}
