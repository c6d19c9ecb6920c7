#include <torchcompile/ir/interpreter.h>

#include <torchcompile/ir/op_step.h>

#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>

#include <unordered_map>

namespace torchcompile::ir {

struct Interpreter::Plan {
  enum class Kind : uint8_t { Call, GetAttr, Module };
  struct Step {
    Kind kind = Kind::Call;
    std::optional<OpStep> call;
    const at::Tensor* attribute = nullptr;  // GetAttr: the GraphModule's entry, read live
    const ModuleFn* module = nullptr;
    std::vector<uint32_t> module_args;
    std::vector<uint32_t> out_slots;
    std::vector<uint32_t> free_after;  // slots whose last use is this step
    std::string name;                  // for error messages
  };

  size_t num_slots = 0;
  std::vector<uint32_t> input_slots;
  std::vector<Step> steps;
  std::vector<uint32_t> output_slots;
};

Interpreter::Interpreter(const GraphModule& gm) : plan_(std::make_unique<Plan>()), gm_(gm) {
  Plan& p = *plan_;
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
        break;
      }
      case NodeKind::CallFunction: {
        Plan::Step step;
        step.call.emplace(*n, slot, new_slots(n));
        for (uint32_t s : step.call->reads()) note_use(s);
        step.name = n->name();
        p.steps.push_back(std::move(step));
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
  last_use.resize(p.num_slots, SIZE_MAX - 1);
  for (uint32_t s = 0; s < p.num_slots; ++s) {
    if (last_use[s] < p.steps.size()) p.steps[last_use[s]].free_after.push_back(s);
  }
  // A step may compute in place in its first argument when that argument dies there.
  size_t index = 0;
  for (const auto& owned : gm.graph().nodes()) {
    const Node* n = owned.get();
    if (n->kind() == NodeKind::Placeholder || n->kind() == NodeKind::Output) continue;
    Plan::Step& step = p.steps[index++];
    if (!step.call || step.call->reads().empty()) continue;
    const uint32_t self = step.call->reads().front();
    if (last_use[self] == index - 1) step.call->enable_self_reuse(*n);
  }
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
        step.call->run(slots.data(), stack, below_autograd);
        break;
    }
    for (uint32_t s : step.free_after) slots[s].reset();
  }
  std::vector<at::Tensor> outputs;
  outputs.reserve(p.output_slots.size());
  for (uint32_t s : p.output_slots) outputs.push_back(slots[s]);
  return outputs;
}

std::function<std::vector<at::Tensor>(std::vector<at::Tensor>)> interpreter_fn(const GraphModule& gm) {
  auto interpreter = std::make_shared<Interpreter>(gm);
  return [interpreter](std::vector<at::Tensor> inputs) { return interpreter->run(std::move(inputs)); };
}

}  // namespace torchcompile::ir
