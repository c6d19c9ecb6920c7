#include "backends/verify_text.h"

#include "support/rng_state_guard.h"

#include <torchcompile/ir/parser.h>
#include <torchcompile/ir/passes.h>
#include <torchcompile/ir/printer.h>
#include <torchcompile/ir/split.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <memory>
#include <string>

namespace torchcompile::detail {

namespace {

bool verify_text_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("TORCHCOMPILE_VERIFY_TEXT");
    return env != nullptr && std::string(env) == "1";
  }();
  return enabled;
}

at::Tensor copy_of(const at::Tensor& t) {
  if (!t.defined()) return t;
  return t.detach().clone(at::MemoryFormat::Preserve);
}

// Runs `gm` on copies of the inputs and of its attributes (an in-place op changes neither the
// caller's tensors nor the module's) from the current random state.
std::vector<at::Tensor> run_on_copies(const ir::GraphModule& gm, const std::vector<at::Tensor>& inputs) {
  at::NoGradGuard no_grad;  // the check compares values only
  support::RngStateGuard rng;
  auto copy = ir::copy_module(gm);
  for (const auto& [name, attr] : gm.attributes()) copy->set_attribute(name, copy_of(attr.first), attr.second);
  std::vector<at::Tensor> xs;
  xs.reserve(inputs.size());
  for (const at::Tensor& t : inputs) xs.push_back(copy_of(t));
  return copy->forward(std::move(xs));
}

bool same_result(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  if (at::isFloatingType(a.scalar_type()) || at::isComplexType(a.scalar_type()))
    return at::allclose(a, b, 1e-5, 1e-6, /*equal_nan=*/true);
  return at::equal(a, b);
}

}  // namespace

void verify_text_round_trip(const ir::GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
  if (!verify_text_enabled() || gm.graph().symbols().empty()) return;
  for (const auto& n : gm.graph().nodes())
    if (n->kind() == ir::NodeKind::CallModule) return;  // the text names submodules; their graphs are checked on their own
  const std::string text = ir::to_text(gm.graph());
  std::shared_ptr<ir::Graph> parsed_graph = ir::parse_graph(text);
  const std::string again = ir::to_text(*parsed_graph);
  TORCH_CHECK(again == text, "TORCHCOMPILE_VERIFY_TEXT: a graph with size symbols does not round-trip through the text ",
              "format.\nPrinted:\n", text, "\nParsed and printed again:\n", again);
  ir::GraphModule parsed(parsed_graph);
  for (const auto& [name, attr] : gm.attributes()) parsed.set_attribute(name, attr.first, attr.second);
  const std::vector<at::Tensor> expected = run_on_copies(gm, example_inputs);
  const std::vector<at::Tensor> actual = run_on_copies(parsed, example_inputs);
  TORCH_CHECK(expected.size() == actual.size(), "TORCHCOMPILE_VERIFY_TEXT: the parsed graph returned ", actual.size(),
              " values, the graph ", expected.size(), ":\n", text);
  for (size_t i = 0; i < expected.size(); ++i)
    TORCH_CHECK(same_result(expected[i], actual[i]), "TORCHCOMPILE_VERIFY_TEXT: output ", i,
                " of the parsed graph differs from the graph's at the example inputs:\n", text);
}

}  // namespace torchcompile::detail
