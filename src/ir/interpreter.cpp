#include <torchcompile/ir/interpreter.h>

#include <torchcompile/ir/op_step.h>

#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>

#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace torchcompile::ir {

struct Interpreter::Plan {
  enum class Kind : uint8_t { Call, GetAttr, Module, User };
  struct Step {
    Kind kind = Kind::Call;
    uint32_t user = 0;                      // User: index into `users` (in kind's padding)
    std::optional<OpStep> call;             // Call and User: the prepared arguments
    const at::Tensor* attribute = nullptr;  // GetAttr: the GraphModule's entry, read live
    const ModuleFn* module = nullptr;
    std::vector<uint32_t> module_args;
    std::vector<uint32_t> out_slots;
    std::vector<uint32_t> free_after;  // slots whose last use is this step
    std::string name;                  // for error messages
  };

  // What a User step runs, kept out of Step so that the steps of a plan without user
  // functions are laid out as they were before there were any.
  struct User {
    std::shared_ptr<const NodeFn> fn;
    const Node* node = nullptr;
    bool overridden = false;  // an override (else the node's own function)
  };

  size_t num_slots = 0;
  std::vector<uint32_t> input_slots;
  std::vector<Step> steps;
  std::vector<const Node*> nodes;  // each step's node, for describe()
  std::vector<User> users;
  std::vector<uint32_t> output_slots;
  // Graphs with size expressions as arguments: where each symbol is bound (input, dimension).
  std::vector<std::pair<size_t, int64_t>> symbol_bindings;
};

Interpreter::Interpreter(const GraphModule& gm) : gm_(gm) { prepare(); }

size_t Interpreter::override(const std::string& target, CallableFn fn) {
  TORCH_CHECK(fn != nullptr, "Interpreter::override('", target, "'): expected a function, got an empty one");
  return override_if([target](const Node& n) { return n.target() == target; },
                     [fn = std::move(fn)](const Node&, const std::vector<c10::IValue>& args) { return fn(args); });
}

size_t Interpreter::override_if(std::function<bool(const Node&)> select, NodeFn fn) {
  TORCH_CHECK(select != nullptr && fn != nullptr, "Interpreter::override_if: expected a selector and a function");
  size_t applies = 0;
  for (const auto& n : gm_.graph().nodes())
    if (n->kind() == NodeKind::CallFunction && select(*n)) ++applies;
  overrides_.push_back({std::move(select), std::make_shared<const NodeFn>(std::move(fn))});
  prepare();
  return applies;
}

void Interpreter::prepare() {
  auto plan = std::make_unique<Plan>();
  Plan& p = *plan;
  const GraphModule& gm = gm_;
  std::unordered_map<Value, uint32_t, ValueHash> slot_of;
  auto slot = [&](const Value& v) -> uint32_t {
    auto it = slot_of.find(v);
    TORCH_INTERNAL_ASSERT(it != slot_of.end(), "interpreter: value of node ", v.node->name(), " used before definition");
    return it->second;
  };
  auto new_slots = [&](Node* n) {
    std::vector<uint32_t> s;
    for (size_t i = 0; i < n->num_outputs(); ++i) {
      slot_of[n->output(i)] = static_cast<uint32_t>(p.num_slots);
      s.push_back(static_cast<uint32_t>(p.num_slots++));
    }
    return s;
  };
  std::unordered_set<const Node*> user_nodes;  // nodes whose step calls a user function
  // last_use[slot] = index of the last step reading it (or SIZE_MAX for outputs/never).
  std::vector<size_t> last_use;
  auto note_use = [&](uint32_t s) {
    if (last_use.size() <= s) last_use.resize(s + 1, SIZE_MAX - 1);
    last_use[s] = p.steps.size();
  };

  for (const auto& owned : gm.graph().nodes()) {
    Node* n = owned.get();
    switch (n->kind()) {
      case NodeKind::Placeholder:
        p.input_slots.push_back(new_slots(n).at(0));
        break;
      case NodeKind::GetAttr: {
        Plan::Step step;
        step.kind = Plan::Kind::GetAttr;
        step.attribute = &gm.attribute(n->target());
        step.out_slots = new_slots(n);
        step.name = n->name();
        p.steps.push_back(std::move(step));
        p.nodes.push_back(n);
        break;
      }
      case NodeKind::CallModule: {
        Plan::Step step;
        step.kind = Plan::Kind::Module;
        step.module = &gm.submodule(n->target());
        for (const Argument& a : n->args()) {
          TORCH_CHECK(a.is_value(), "call_module ", n->name(), ": arguments must be tensor values");
          uint32_t s = slot(a.value());
          note_use(s);
          step.module_args.push_back(s);
        }
        step.out_slots = new_slots(n);
        step.name = n->name();
        p.steps.push_back(std::move(step));
        p.nodes.push_back(n);
        break;
      }
      case NodeKind::CallFunction: {
        Plan::Step step;
        step.call = OpStep(*n, slot, new_slots(n), /*allow_user_function=*/true);
        for (uint32_t s : step.call->reads()) note_use(s);
        step.name = n->name();
        Plan::User user{nullptr, n, false};
        for (auto o = overrides_.rbegin(); o != overrides_.rend() && !user.fn; ++o) {
          if (o->select(*n)) {
            user.fn = o->fn;
            user.overridden = true;
          }
        }
        if (!user.fn && n->callable()) {
          user.fn = std::make_shared<const NodeFn>(
              [c = n->callable()](const Node&, const std::vector<c10::IValue>& args) { return c->fn(args); });
        }
        if (user.fn) {
          step.kind = Plan::Kind::User;
          step.user = static_cast<uint32_t>(p.users.size());
          p.users.push_back(std::move(user));
          user_nodes.insert(n);
        }
        p.steps.push_back(std::move(step));
        p.nodes.push_back(n);
        break;
      }
      case NodeKind::Output: {
        const Argument& a = n->args().at(0);
        for (const auto& e : a.list()) {
          TORCH_INTERNAL_ASSERT(e.has_value(), "interpreter: the output node returns None");
          uint32_t s = slot(*e);
          if (last_use.size() <= s) last_use.resize(s + 1, SIZE_MAX - 1);
          last_use[s] = SIZE_MAX;  // never freed early
          p.output_slots.push_back(s);
        }
        break;
      }
    }
  }
  if (gm.graph().has_size_expressions()) p.symbol_bindings = gm.graph().symbol_bindings();
  last_use.resize(p.num_slots, SIZE_MAX - 1);
  for (uint32_t s = 0; s < p.num_slots; ++s) {
    if (last_use[s] < p.steps.size()) p.steps[last_use[s]].free_after.push_back(s);
  }
  // A step may compute in place in its first argument when that argument dies there, unless
  // the step or the argument's producer is a user function (which may return any tensor).
  size_t index = 0;
  for (const auto& owned : gm.graph().nodes()) {
    const Node* n = owned.get();
    if (n->kind() == NodeKind::Placeholder || n->kind() == NodeKind::Output) continue;
    Plan::Step& step = p.steps[index++];
    if (step.kind != Plan::Kind::Call || step.call->reads().empty()) continue;
    const uint32_t self = step.call->reads().front();
    const Argument& first = n->args().front();
    if (first.is_value() && user_nodes.count(first.value().node)) continue;
    if (last_use[self] == index - 1) step.call->enable_self_reuse(*n);
  }
  plan_ = std::move(plan);
}

Interpreter::~Interpreter() = default;

size_t Interpreter::num_inputs() const { return plan_->input_slots.size(); }

std::vector<at::Tensor> Interpreter::run(std::vector<at::Tensor> inputs) const {
  const Plan& p = *plan_;
  TORCH_CHECK(inputs.size() == p.input_slots.size(), "graph expects ", p.input_slots.size(), " inputs, got ",
              inputs.size());
  // Decided once per call from the inputs; an attribute that may carry a forward gradient turns
  // it off from its get_attr on (no earlier step can read it).
  bool below_autograd = may_dispatch_below_autograd(inputs.data(), inputs.size());
  // The size symbols' values in this call, for size-expression arguments.
  c10::SmallVector<int64_t, 8> symbols;
  for (const auto& [input, dim] : p.symbol_bindings) {
    const at::Tensor& t = inputs[input];
    TORCH_CHECK(t.defined() && dim < t.dim(), "graph input ", input, " should have a dimension ", dim,
                " (it binds a size symbol), got ", t.defined() ? std::to_string(t.dim()) + " dimensions" : "an undefined tensor");
    symbols.push_back(t.size(dim));
  }
  const int64_t* symbol_values = symbols.empty() ? nullptr : symbols.data();
  c10::SmallVector<at::Tensor, 64> slots(p.num_slots);
  for (size_t i = 0; i < inputs.size(); ++i) slots[p.input_slots[i]] = std::move(inputs[i]);
  inputs.clear();

  ScratchStack scratch;
  torch::jit::Stack& stack = scratch.get();
  for (const Plan::Step& step : p.steps) {
    switch (step.kind) {
      case Plan::Kind::GetAttr:
        slots[step.out_slots[0]] = *step.attribute;
        if (below_autograd) below_autograd = may_dispatch_below_autograd(step.attribute, 1);
        continue;
      case Plan::Kind::Module: {
        std::vector<at::Tensor> args;
        args.reserve(step.module_args.size());
        for (uint32_t s : step.module_args) args.push_back(slots[s]);
        std::vector<at::Tensor> outs = (*step.module)(args);
        TORCH_CHECK(outs.size() == step.out_slots.size(), "call_module ", step.name, " returned ", outs.size(),
                    " tensors, the graph expects ", step.out_slots.size());
        for (size_t i = 0; i < outs.size(); ++i) slots[step.out_slots[i]] = std::move(outs[i]);
        break;
      }
      case Plan::Kind::Call:
        step.call->run(slots.data(), stack, below_autograd, symbol_values);
        break;
      case Plan::Kind::User: {
        const Plan::User& user = p.users[step.user];
        step.call->run_instead(*user.fn, *user.node, slots.data(), stack, symbol_values);
        break;
      }
    }
    for (uint32_t s : step.free_after) slots[s].reset();
  }
  std::vector<at::Tensor> outputs;
  outputs.reserve(p.output_slots.size());
  for (uint32_t s : p.output_slots) outputs.push_back(slots[s]);
  return outputs;
}

std::string Interpreter::describe() const {
  std::ostringstream os;
  for (size_t i = 0; i < plan_->steps.size(); ++i) {
    const Plan::Step& step = plan_->steps[i];
    const std::string& target = plan_->nodes[i]->target();
    switch (step.kind) {
      case Plan::Kind::GetAttr: os << step.name << " = get_attr " << target << "\n"; continue;
      case Plan::Kind::Module: os << step.name << " = call_module " << target << "\n"; continue;
      case Plan::Kind::User:
        os << step.name << " = " << target
           << (plan_->users[step.user].overridden ? "  (override)" : "  (user function)") << "\n";
        continue;
      case Plan::Kind::Call:
        os << step.name << " = " << target;
        if (step.call->self_reuse_enabled()) os << "  (in place)";
        if (step.call->scalar_operand_prepared()) os << "  (scalar operand prepared)";
        os << "\n";
        continue;
    }
  }
  return os.str();
}

std::vector<at::Tensor> run_target(const Node& node, const std::vector<c10::IValue>& args) {
  TORCH_CHECK(node.kind() == NodeKind::CallFunction, "run_target: expected a call_function node, got '", node.name(),
              "' (", to_string(node.kind()), ")");
  if (node.callable()) return node.callable()->fn(args);
  torch::jit::Stack stack(args);
  node.op().callBoxed(&stack);
  std::vector<at::Tensor> outs;
  outs.reserve(node.num_outputs());
  for (const c10::IValue& rv : stack) {
    if (rv.isList()) {
      for (const c10::IValue& e : rv.toListRef()) outs.push_back(e.isTensor() ? e.toTensor() : at::Tensor());
    } else {
      outs.push_back(rv.isTensor() ? rv.toTensor() : at::Tensor());
    }
  }
  return outs;
}

std::function<std::vector<at::Tensor>(std::vector<at::Tensor>)> interpreter_fn(const GraphModule& gm) {
  auto interpreter = std::make_shared<Interpreter>(gm);
  return [interpreter](std::vector<at::Tensor> inputs) { return interpreter->run(std::move(inputs)); };
}

}  // namespace torchcompile::ir
