#include "torchscript_backend.h"
#include "torchscript_graph.h"

#include <torchcompile/ir/op_properties.h>

#include <ATen/core/grad_mode.h>
#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/common_subexpression_elimination.h>
#include <torch/csrc/jit/passes/constant_pooling.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/fuse_linear.h>
#include <torch/csrc/jit/passes/fuse_relu.h>
#include <torch/csrc/jit/passes/remove_dropout.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <cctype>
#include <memory>
#include <optional>
#include <unordered_map>

namespace torchcompile::backends {

namespace torchscript {

namespace {

namespace jit = torch::jit;

using Env = std::unordered_map<ir::Value, jit::Value*, ir::ValueHash>;

// A valid, readable TorchScript debug name for a placeholder or attribute (`fc1.weight` ->
// `fc1_weight`; debug names may not be plain numbers).
std::string debug_name(const std::string& name) {
  std::string s;
  for (char c : name) s += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) s = "v_" + s;
  return s;
}

std::string describe(const ir::Node* n) { return "node '" + n->name() + "' (" + n->target() + ")"; }

bool is_defined(const ir::Value& v) { return v.node->output_meta().at(v.index).defined; }

// A tensor argument. An undefined tensor (an optional output the example run did not produce)
// is None, as the interpreter passes it.
jit::Value* tensor_input(jit::Graph& g, const Env& env, const ir::Value& v, bool optional, const ir::Node* user) {
  if (!is_defined(v)) {
    TORCH_CHECK(optional, describe(user), ": an undefined tensor is passed where the schema requires a Tensor");
    return g.insertConstant(c10::IValue());
  }
  auto it = env.find(v);
  TORCH_INTERNAL_ASSERT(it != env.end(), describe(user), ": argument ", v.node->name(), " has no TorchScript value");
  return it->second;
}

// A constant argument as a prim::Constant of the type TorchScript's schema matching expects.
// TorchScript spells SymInt as int, and ScalarType/Layout/MemoryFormat as int (as boxed).
jit::Value* constant_input(jit::Graph& g, const c10::IValue& v, c10::TypePtr formal, const ir::Node* user) {
  if (v.isNone()) return g.insertConstant(c10::IValue());
  if (auto opt = formal->cast<c10::OptionalType>()) formal = opt->getElementType();
  c10::IValue c = v;
  if (v.isSymInt()) {
    c = v.toSymInt().expect_int();
  } else if (v.isList() && formal->kind() == c10::TypeKind::ListType) {
    auto elem = formal->castRaw<c10::ListType>()->getElementType()->kind();
    if (elem == c10::TypeKind::IntType || elem == c10::TypeKind::SymIntType) {
      c10::List<int64_t> ints;
      for (const c10::IValue& e : v.toListRef()) {
        TORCH_CHECK(e.isInt() || e.isSymInt(), describe(user), ": int list argument holds a ", e.tagKind());
        ints.push_back(e.isInt() ? e.toInt() : e.toSymInt().expect_int());
      }
      c = std::move(ints);
    }
  }
  auto value = jit::tryInsertConstant(g, c);
  TORCH_CHECK(value, describe(user), ": TorchScript has no constant for a ", v.tagKind(), " argument");
  return *value;
}

void convert_call(jit::Graph& g, ir::Node* n, Env& env) {
  const c10::FunctionSchema& schema = n->schema();
  const auto& formals = schema.arguments();
  std::vector<jit::Value*> inputs;
  inputs.reserve(n->args().size());
  for (size_t i = 0; i < n->args().size(); ++i) {
    const ir::Argument& a = n->args()[i];
    c10::TypePtr formal = formals.at(i).type();
    if (a.is_constant()) {
      inputs.push_back(constant_input(g, a.constant(), formal, n));
    } else if (a.is_value()) {
      inputs.push_back(tensor_input(g, env, a.value(), ir::is_optional_tensor_type(formal), n));
    } else {
      // Tensor[] / Tensor?[]: a prim::ListConstruct of the elements, None for a missing one.
      if (auto opt = formal->cast<c10::OptionalType>()) formal = opt->getElementType();
      auto list_type = formal->cast<c10::ListType>();
      TORCH_INTERNAL_ASSERT(list_type, describe(n), ": tensor list for a non-list parameter");
      const bool optional_elements = ir::is_optional_tensor_type(list_type->getElementType());
      std::vector<jit::Value*> elems;
      for (const auto& e : a.list()) {
        if (!e) {
          TORCH_CHECK(optional_elements, describe(n), ": None element in a Tensor[] argument");
          elems.push_back(g.insertConstant(c10::IValue()));
        } else {
          elems.push_back(tensor_input(g, env, *e, optional_elements, n));
        }
      }
      auto elem_type = optional_elements ? c10::OptionalType::ofTensor() : c10::TensorType::get();
      inputs.push_back(g.insertNode(g.createList(elem_type, elems))->output());
    }
  }
  // TorchScript's RemoveExpands (run by every executor) drops expands marked implicit.
  if (schema.name() == "aten::expand") {
    auto implicit = jit::toIValue(inputs.back());
    TORCH_CHECK(implicit && implicit->isBool() && !implicit->toBool(), describe(n),
                ": TorchScript removes expands with implicit=True");
  }

  const auto& returns = schema.returns();
  jit::Node* node = g.insertNode(g.create(c10::Symbol::fromQualString(schema.name()), inputs, returns.size()));
  for (size_t r = 0; r < returns.size(); ++r) node->output(r)->setType(returns[r].type());
  // TorchScript picks the first overload whose schema accepts the input types; it must be the
  // traced one (it is not for overloads TorchScript blocks or cannot tell apart).
  const c10::FunctionSchema* chosen = node->maybeSchema();
  TORCH_CHECK(chosen, describe(n), ": no TorchScript overload of ", schema.name(), " accepts these arguments");
  TORCH_CHECK(chosen->name() == schema.name() && chosen->overload_name() == schema.overload_name(), describe(n),
              ": TorchScript selects ", chosen->name(), ".", chosen->overload_name(), " for these arguments");

  // Outputs: a Tensor[] return unpacks into as many values as the traced call produced.
  const auto& counts = n->return_counts();
  size_t o = 0;
  for (size_t r = 0; r < returns.size(); ++r) {
    const uint32_t count = counts.empty() ? 1 : counts.at(r);
    jit::Value* rv = node->output(r);
    if (rv->type()->kind() == c10::TypeKind::ListType) {
      jit::Node* unpack = g.insertNode(g.createListUnpack(rv, count));
      for (uint32_t k = 0; k < count; ++k) env[n->output(o++)] = unpack->output(k);
    } else {
      env[n->output(o++)] = rv;
    }
  }
  TORCH_INTERNAL_ASSERT(o == n->num_outputs(), describe(n), ": ", o, " TorchScript outputs for ", n->num_outputs(),
                        " graph values");
}

// Fold constants on a copy and keep the result only when it is safe: no folded tensor may
// reach an output (every call would return the same tensor, where eager returns a new one),
// and none may be 0-dim (the executor's CanonicalizeOps turns a 0-dim `other` of add/sub/mul/div
// into a Scalar, which changes type promotion).
void fold_constants(std::shared_ptr<jit::Graph>& graph) {
  auto folded = graph->copy();
  if (!jit::ConstantPropagation(folded)) return;
  jit::ConstantPooling(folded);
  std::vector<jit::Value*> tensors;
  for (jit::Node* n : folded->nodes()) {
    if (n->kind() != c10::prim::Constant || !n->output()->type()->cast<c10::TensorType>()) continue;
    if (jit::toIValue(n->output())->toTensor().dim() == 0) return;
    tensors.push_back(n->output());
  }
  if (!tensors.empty() && jit::AliasDb(folded).mayContainAlias(tensors, folded->outputs())) return;
  graph = std::move(folded);
}

}  // namespace

Program convert(const ir::GraphModule& gm) {
  Program p;
  p.graph = std::make_shared<jit::Graph>();
  jit::Graph& g = *p.graph;
  Env env;
  for (ir::Node* ph : gm.graph().placeholders())
    env[ph->output()] = g.addInput(debug_name(ph->name()))->setType(c10::TensorType::get());
  // Attributes become inputs after the placeholders, in order of first read: the CompiledFn
  // passes the GraphModule's tensors at each call, so parameters are never baked in.
  std::unordered_map<std::string, jit::Value*> attribute_inputs;
  for (const auto& owned : gm.graph().nodes()) {
    ir::Node* n = owned.get();
    if (n->kind() != ir::NodeKind::GetAttr) continue;
    auto it = attribute_inputs.find(n->target());
    if (it == attribute_inputs.end()) {
      gm.attribute(n->target());  // throws, naming it, if the attribute is missing
      jit::Value* in = g.addInput(debug_name(n->target()))->setType(c10::TensorType::get());
      it = attribute_inputs.emplace(n->target(), in).first;
      p.attributes.push_back(n->target());
    }
    env[n->output()] = it->second;
  }

  for (const auto& owned : gm.graph().nodes()) {
    ir::Node* n = owned.get();
    switch (n->kind()) {
      case ir::NodeKind::Placeholder:
      case ir::NodeKind::GetAttr:
        break;
      case ir::NodeKind::CallModule:
        TORCH_CHECK(false, describe(n), ": call_module runs an opaque C++ callable");
      case ir::NodeKind::CallFunction:
        convert_call(g, n, env);
        break;
      case ir::NodeKind::Output: {
        std::vector<jit::Value*> outputs;
        for (const auto& e : n->args().at(0).list()) {
          TORCH_CHECK(e.has_value(), "the output node returns None");
          outputs.push_back(env.at(*e));
        }
        g.registerOutput(g.insertNode(g.createTuple(outputs))->output());
        break;
      }
    }
  }
  g.lint();
  return p;
}

PassOptions pass_options(const ir::GraphModule& gm, bool grad_enabled) {
  PassOptions o;
  bool needs_grad = false;
  std::optional<c10::ScalarType> dtype;
  bool one_float_dtype = true;
  for (const auto& owned : gm.graph().nodes()) {
    const ir::Node* n = owned.get();
    if (n->kind() == ir::NodeKind::CallFunction && ir::op_is_random(n->op())) o.fold_and_dedup = false;
    for (const ir::TensorMeta& m : n->output_meta()) {
      if (!m.defined) continue;
      needs_grad |= m.requires_grad;
      one_float_dtype &= (m.dtype == at::kFloat || m.dtype == at::kDouble) && m.device.is_cpu() &&
                         (!dtype || *dtype == m.dtype);
      dtype = m.dtype;
    }
  }
  o.fuse_add_relu = !(grad_enabled && needs_grad) && one_float_dtype;
  return o;
}

void optimize(std::shared_ptr<jit::Graph>& graph, const PassOptions& options) {
  jit::removeDropout(graph);  // only dropouts with a constant train=False (they return their input)
  jit::EliminateDeadCode(graph);
  if (options.fold_and_dedup) {
    fold_constants(graph);
    jit::EliminateCommonSubexpression(graph);  // alias-aware: skips written values, keeps outputs apart
  }
  jit::FuseLinear(graph);
  if (options.fuse_add_relu) jit::FuseAddRelu(graph);
  jit::EliminateDeadCode(graph);
  graph->lint();
  // Compile once to interpreter code now, so an operation TorchScript cannot run fails here
  // (and falls back) rather than at the first call.
  jit::Code check(graph, "torchscript_backend");
}

}  // namespace torchscript

namespace {

// What a compiled graph needs at each call.
struct Compiled {
  Compiled(std::shared_ptr<torch::jit::Graph> graph, size_t inputs)
      : executor(graph, "torchscript_backend", torch::jit::ExecutorExecutionMode::SIMPLE), num_inputs(inputs) {}
  torch::jit::GraphExecutor executor;
  size_t num_inputs;
  std::vector<const at::Tensor*> attributes;  // the GraphModule's entries, read at each call
};

}  // namespace

CompiledFn torchscript_backend(GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
  // The converted graph holds the example sizes: one per combination of size symbols.
  if (!gm.graph().symbols().empty()) return compile_per_shape(gm, example_inputs, &torchscript_backend);
  std::shared_ptr<Compiled> compiled;
  try {
    torchscript::Program program = torchscript::convert(gm);
    torchscript::optimize(program.graph, torchscript::pass_options(gm, at::GradMode::is_enabled()));
    // The SIMPLE executor runs only TorchScript's required passes on top of ours: no profiling,
    // no specialization, no autodiff graphs (gradients are eager's), and no constant folding
    // of its own that could share a tensor between calls.
    compiled = std::make_shared<Compiled>(program.graph, gm.graph().placeholders().size());
    for (const auto& name : program.attributes) compiled->attributes.push_back(&gm.attribute(name));
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    TORCH_WARN("torchscript backend: cannot express the graph in TorchScript: ",
               c10_error ? c10_error->what_without_backtrace() : e.what(), "; running it with the interpreter");
    return [&gm](std::vector<at::Tensor> inputs) { return gm.forward(std::move(inputs)); };
  }
  return [compiled](std::vector<at::Tensor> inputs) {
    TORCH_CHECK(inputs.size() == compiled->num_inputs, "graph expects ", compiled->num_inputs, " inputs, got ",
                inputs.size());
    torch::jit::Stack stack;
    stack.reserve(inputs.size() + compiled->attributes.size());
    for (auto& t : inputs) stack.emplace_back(std::move(t));
    inputs.clear();
    for (const at::Tensor* a : compiled->attributes) stack.emplace_back(*a);
    compiled->executor.run(stack);
    TORCH_INTERNAL_ASSERT(stack.size() == 1 && stack.back().isTuple(), "torchscript backend: unexpected graph result");
    auto tuple = std::move(stack.back()).toTuple();
    std::vector<at::Tensor> outputs;
    outputs.reserve(tuple->elements().size());
    for (const c10::IValue& v : tuple->elements()) outputs.push_back(v.isTensor() ? v.toTensor() : at::Tensor());
    return outputs;
  };
}

void register_torchscript_backend() { register_backend("torchscript", &torchscript_backend); }

}  // namespace torchcompile::backends
