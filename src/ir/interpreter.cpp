#include <torchcompile/ir/interpreter.h>

#include <ATen/core/stack.h>

#include <unordered_map>

namespace torchcompile::ir {

namespace {

constexpr int32_t kNone = -1;

}  // namespace

struct Interpreter::Plan {
  // Where a tensor argument comes from.
  struct TensorArg {
    uint32_t stack_index;
    uint32_t slot;
    bool optional;  // an undefined tensor is passed as None
  };
  // A Tensor[] or Tensor?[] argument.
  struct ListArg {
    uint32_t stack_index;
    std::vector<int32_t> slots;  // kNone for a None element
    bool optional_elements;
  };
  enum class Kind : uint8_t { Call, GetAttr, Module };
  struct Step {
    Kind kind = Kind::Call;
    std::optional<c10::OperatorHandle> op;
    const at::Tensor* attribute = nullptr;  // GetAttr: the GraphModule's entry, read live
    const ModuleFn* module = nullptr;
    std::vector<c10::IValue> stack_template;
    std::vector<TensorArg> tensor_args;
    std::vector<ListArg> list_args;
    std::vector<uint32_t> return_counts;
    std::vector<bool> return_is_list;
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
        for (size_t i = 0; i < n->args().size(); ++i) {
          const Argument& a = n->args()[i];
          TORCH_CHECK(a.is_value(), "call_module ", n->name(), ": arguments must be tensor values");
          uint32_t s = slot(a.value());
          note_use(s);
          step.tensor_args.push_back({static_cast<uint32_t>(i), s, false});
        }
        step.out_slots = new_slots(n);
        step.name = n->name();
        p.steps.push_back(std::move(step));
        break;
      }
      case NodeKind::CallFunction: {
        Plan::Step step;
        step.op = n->op();
        step.name = n->name();
        const auto& schema = n->schema();
        step.stack_template.resize(n->args().size());
        for (size_t i = 0; i < n->args().size(); ++i) {
          const Argument& a = n->args()[i];
          const c10::TypePtr& type = schema.arguments()[i].type();
          if (a.is_constant()) {
            step.stack_template[i] = a.constant();
          } else if (a.is_value()) {
            uint32_t s = slot(a.value());
            note_use(s);
            step.tensor_args.push_back({static_cast<uint32_t>(i), s, is_optional_tensor_type(type)});
          } else {
            Plan::ListArg la;
            la.stack_index = static_cast<uint32_t>(i);
            auto list_type = type->cast<c10::ListType>();
            TORCH_INTERNAL_ASSERT(list_type, "interpreter: list argument for non-list parameter of ", n->name());
            la.optional_elements = is_optional_tensor_type(list_type->getElementType());
            for (const auto& e : a.list()) {
              if (!e) {
                la.slots.push_back(kNone);
                continue;
              }
              uint32_t s = slot(*e);
              note_use(s);
              la.slots.push_back(static_cast<int32_t>(s));
            }
            step.list_args.push_back(std::move(la));
          }
        }
        step.return_counts = n->return_counts();
        for (const auto& r : schema.returns()) step.return_is_list.push_back(r.type()->kind() == c10::TypeKind::ListType);
        step.out_slots = new_slots(n);
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
}

Interpreter::~Interpreter() = default;

size_t Interpreter::num_inputs() const { return plan_->input_slots.size(); }

std::vector<at::Tensor> Interpreter::run(std::vector<at::Tensor> inputs) const {
  const Plan& p = *plan_;
  TORCH_CHECK(inputs.size() == p.input_slots.size(), "graph expects ", p.input_slots.size(), " inputs, got ",
              inputs.size());
  std::vector<at::Tensor> slots(p.num_slots);
  for (size_t i = 0; i < inputs.size(); ++i) slots[p.input_slots[i]] = std::move(inputs[i]);
  inputs.clear();

  torch::jit::Stack stack;
  for (const Plan::Step& step : p.steps) {
    switch (step.kind) {
      case Plan::Kind::GetAttr:
        slots[step.out_slots[0]] = *step.attribute;
        continue;
      case Plan::Kind::Module: {
        std::vector<at::Tensor> args;
        args.reserve(step.tensor_args.size());
        for (const auto& ta : step.tensor_args) args.push_back(slots[ta.slot]);
        std::vector<at::Tensor> outs = (*step.module)(args);
        TORCH_CHECK(outs.size() == step.out_slots.size(), "call_module ", step.name, " returned ", outs.size(),
                    " tensors, the graph expects ", step.out_slots.size());
        for (size_t i = 0; i < outs.size(); ++i) slots[step.out_slots[i]] = std::move(outs[i]);
        break;
      }
      case Plan::Kind::Call: {
        stack = step.stack_template;
        for (const auto& ta : step.tensor_args) {
          const at::Tensor& t = slots[ta.slot];
          if (ta.optional && !t.defined()) continue;  // the template holds None
          stack[ta.stack_index] = t;
        }
        for (const auto& la : step.list_args) {
          if (la.optional_elements) {
            c10::List<c10::optional<at::Tensor>> list;
            list.reserve(la.slots.size());
            for (int32_t s : la.slots) list.push_back(s == kNone ? c10::optional<at::Tensor>() : slots[s]);
            stack[la.stack_index] = std::move(list);
          } else {
            c10::List<at::Tensor> list;
            list.reserve(la.slots.size());
            for (int32_t s : la.slots) list.push_back(slots[s]);
            stack[la.stack_index] = std::move(list);
          }
        }
        step.op->callBoxed(&stack);
        size_t o = 0;
        for (size_t r = 0; r < step.return_counts.size(); ++r) {
          c10::IValue& rv = stack[r];
          if (step.return_is_list[r]) {
            const auto& elems = rv.toListRef();
            TORCH_CHECK(elems.size() == step.return_counts[r], step.name, " returned a list of ", elems.size(),
                        " tensors; the traced call returned ", step.return_counts[r]);
            for (const c10::IValue& e : elems) slots[step.out_slots[o++]] = e.isTensor() ? e.toTensor() : at::Tensor();
          } else {
            slots[step.out_slots[o++]] = rv.isTensor() ? std::move(rv).toTensor() : at::Tensor();
          }
        }
        stack.clear();
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

}  // namespace torchcompile::ir
