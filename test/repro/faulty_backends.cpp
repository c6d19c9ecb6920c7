// A backend plugin with deliberate defects, for the repro and minifier tests:
//   gelu_throws      throws when compiling any graph that contains aten::gelu
//   sigmoid_wrong    compiles every graph, but its aten::sigmoid returns sigmoid(x) + 0.25
//   tanh_run_throws  compiles every graph; calling one that contains aten::tanh throws
// Every other graph runs with the interpreter, correctly.
#include <torchcompile/backends/registry.h>
#include <torchcompile/ir/interpreter.h>

#include <c10/util/Exception.h>

#include <memory>

namespace {

using torchcompile::CompiledFn;
using torchcompile::GraphModule;
namespace ir = torchcompile::ir;

bool contains(const GraphModule& gm, const std::string& op) {
  for (const auto& n : gm.graph().nodes())
    if (n->kind() == ir::NodeKind::CallFunction && n->target().rfind(op, 0) == 0) return true;
  return false;
}

CompiledFn gelu_throws(GraphModule& gm, const std::vector<at::Tensor>&) {
  TORCH_CHECK(!contains(gm, "aten::gelu"), "gelu_throws: cannot lower aten::gelu");
  return ir::interpreter_fn(gm);
}

CompiledFn sigmoid_wrong(GraphModule& gm, const std::vector<at::Tensor>&) {
  auto interp = std::make_shared<ir::Interpreter>(gm);
  interp->override("aten::sigmoid", [](const std::vector<c10::IValue>& args) {
    return std::vector<at::Tensor>{args.at(0).toTensor().sigmoid().add(0.25)};
  });
  return [interp](std::vector<at::Tensor> inputs) { return interp->run(std::move(inputs)); };
}

CompiledFn tanh_run_throws(GraphModule& gm, const std::vector<at::Tensor>&) {
  const bool has_tanh = contains(gm, "aten::tanh");
  CompiledFn run = ir::interpreter_fn(gm);
  return [has_tanh, run](std::vector<at::Tensor> inputs) {
    TORCH_CHECK(!has_tanh, "tanh_run_throws: the tanh kernel crashed");
    return run(std::move(inputs));
  };
}

}  // namespace

TORCHCOMPILE_PLUGIN(registrar) {
  registrar.register_backend("gelu_throws", gelu_throws, {"debug"});
  registrar.register_backend("sigmoid_wrong", sigmoid_wrong, {"debug"});
  registrar.register_backend("tanh_run_throws", tanh_run_throws, {"debug"});
}
