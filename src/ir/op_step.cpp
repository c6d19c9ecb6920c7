#include <torchcompile/ir/op_step.h>
#include <torchcompile/ir/op_properties.h>

#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/forward_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <optional>

namespace torchcompile::ir {

OpStep::OpStep(const Node& n, const std::function<uint32_t(const Value&)>& slot_of, std::vector<uint32_t> out_slots)
    : OpStep(n, slot_of, std::move(out_slots), /*allow_user_function=*/false) {}

OpStep::OpStep(const Node& n, const std::function<uint32_t(const Value&)>& slot_of, std::vector<uint32_t> out_slots,
               bool allow_user_function)
    : op_(n.op()), out_slots_(std::move(out_slots)), name_(n.name()) {
  TORCH_INTERNAL_ASSERT(n.kind() == NodeKind::CallFunction, "OpStep: ", n.name(), " is not a call_function node");
  TORCH_CHECK(allow_user_function || !n.callable(), "OpStep: node '", n.name(), "' calls the user function '",
              n.target(), "' in place of ", op_target_name(n.op()),
              "; expected a node calling its operator (user functions run with ir::Interpreter)");
  TORCH_INTERNAL_ASSERT(out_slots_.size() == n.num_outputs(), "OpStep: ", n.name(), " has ", n.num_outputs(),
                        " outputs, given ", out_slots_.size(), " slots");
  const auto& schema = n.schema();
  stack_template_.resize(n.args().size());
  for (size_t i = 0; i < n.args().size(); ++i) {
    const Argument& a = n.args()[i];
    const c10::TypePtr& type = schema.arguments()[i].type();
    if (a.is_constant()) {
      stack_template_[i] = a.constant();
      if (a.is_size_expression()) {
        if (symbol_names_.empty())
          for (const SizeSymbolDecl& sym : n.owning_graph()->symbols()) symbol_names_.push_back(sym.name);
        SizeArg sa{static_cast<uint32_t>(i), a.constant().isInt(), {}};
        for (const SymExpr& e : a.sym_ints()) {
          SizeArg::Int x;
          if (auto c = e.constant()) {
            x.constant = *c;
          } else if (auto name = e.as_symbol()) {
            auto it = std::find(symbol_names_.begin(), symbol_names_.end(), *name);
            TORCH_CHECK(it != symbol_names_.end(), "OpStep: node '", n.name(), "' uses the undeclared size symbol ", *name);
            x.symbol = static_cast<int32_t>(it - symbol_names_.begin());
          } else {
            x.expr = e;
          }
          sa.ints.push_back(std::move(x));
        }
        size_args_.push_back(std::move(sa));
      }
    } else if (a.is_value()) {
      const uint32_t s = slot_of(a.value());
      reads_.push_back(s);
      tensor_args_.push_back({static_cast<uint32_t>(i), s, is_optional_tensor_type(type)});
    } else {
      ListArg la;
      la.stack_index = static_cast<uint32_t>(i);
      auto list_type = type->cast<c10::ListType>();
      TORCH_INTERNAL_ASSERT(list_type, "OpStep: list argument for the non-list parameter ", i, " of ", n.name());
      la.optional_elements = is_optional_tensor_type(list_type->getElementType());
      for (const auto& e : a.list()) {
        if (!e) {
          la.slots.push_back(-1);
          continue;
        }
        const uint32_t s = slot_of(*e);
        reads_.push_back(s);
        la.slots.push_back(static_cast<int32_t>(s));
      }
      list_args_.push_back(std::move(la));
    }
  }
  return_counts_ = n.return_counts();
  for (const auto& r : schema.returns()) return_is_list_.push_back(r.type()->kind() == c10::TypeKind::ListType);
  prepare_scalar_operand(n);
}

namespace {

// `value` as a 0-dim wrapped-number CPU tensor of `dtype`, converted as ATen converts a
// wrapped number (an int64 or double tensor copied to `dtype`: `c10::convert`). Built without
// the dispatcher: an interpreter may be prepared while the tracer or functionalization is on
// (AOT traces the joint graph through one), and a dispatched op here would be recorded or
// return a functional wrapper instead of a plain constant.
at::Tensor wrapped_operand(const c10::IValue& value, c10::ScalarType dtype) {
  at::Tensor t(at::detail::empty_cpu({}, dtype, /*pin_memory=*/false, c10::nullopt));
  AT_DISPATCH_FLOATING_TYPES(dtype, "wrapped_operand", [&] {
    *t.data_ptr<scalar_t>() =
        value.isDouble() ? c10::convert<scalar_t>(value.toDouble()) : c10::convert<scalar_t>(value.toInt());
  });
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

}  // namespace

void OpStep::prepare_scalar_operand(const Node& n) {
  const c10::OperatorName& name = n.schema().operator_name();
  if (name.overload_name != "Scalar" ||
      (name.name != "aten::add" && name.name != "aten::sub" && name.name != "aten::mul" && name.name != "aten::div"))
    return;
  if (n.args().size() < 2 || !n.args()[0].is_value() || !n.args()[1].is_constant() ||
      n.args()[1].is_size_expression() || tensor_args_.empty())
    return;
  const c10::IValue& other = n.args()[1].constant();
  if (!other.isDouble() && !other.isInt()) return;
  const Value self = n.args()[0].value();
  const TensorMeta& m = self.node->output_meta().at(self.index);
  // A float or double tensor keeps its dtype whatever the scalar (a wrapped number never
  // promotes it), so converting the scalar to that dtype is what ATen's promotion does. Not
  // Half and BFloat16: LibTorch 2.x's reduced-precision kernels handle a scalar differently
  // from one overload to another (see enable_self_reuse), and same bits were not shown for them.
  if (!m.defined || (m.dtype != at::kFloat && m.dtype != at::kDouble) || !m.device.is_cpu()) return;
  auto tensor_op = c10::Dispatcher::singleton().findOp({name.name, "Tensor"});
  if (!tensor_op) return;
  at::Tensor operand = wrapped_operand(other, m.dtype);
  scalar_as_tensor_ = ScalarAsTensor{*tensor_op, std::nullopt, c10::IValue(std::move(operand)), m.dtype,
                                     tensor_args_[0].slot};
}

namespace {

bool same_argument_types(const c10::FunctionSchema& a, const c10::FunctionSchema& b) {
  if (a.arguments().size() != b.arguments().size()) return false;
  for (size_t i = 0; i < a.arguments().size(); ++i)
    if (*a.arguments()[i].type() != *b.arguments()[i].type()) return false;
  return true;
}

// Whether output `index` of `producer` is a tensor of its own (its schema return has no alias
// annotation) rather than a view or the updated argument.
bool fresh_result(const Node& producer, uint32_t index) {
  if (producer.kind() != NodeKind::CallFunction || op_is_mutating(producer.op())) return false;
  const auto& counts = producer.return_counts();
  const auto& returns = producer.schema().returns();
  uint32_t first = 0;
  for (size_t r = 0; r < counts.size() && r < returns.size(); ++r) {
    if (index < first + counts[r]) return returns[r].alias_info() == nullptr;
    first += counts[r];
  }
  return false;
}

// The in-place overload with the same arguments (`add.Tensor` -> `add_.Tensor`), if any.
std::optional<c10::OperatorHandle> inplace_variant(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  const auto& name = schema.operator_name();
  if (name.name.empty() || name.name.back() == '_') return std::nullopt;
  auto inplace = c10::Dispatcher::singleton().findOp({name.name + "_", name.overload_name});
  if (!inplace || !same_argument_types(schema, inplace->schema()) || inplace->schema().returns().size() != 1)
    return std::nullopt;
  return *inplace;
}

}  // namespace

bool OpStep::enable_self_reuse(const Node& n) {
  const auto& schema = n.schema();
  if (n.num_outputs() != 1 || schema.returns().size() != 1 || schema.is_vararg() || schema.is_varret()) return false;
  if (op_is_random(n.op()) || op_is_mutating(n.op())) return false;
  if (schema.arguments().empty() || schema.arguments()[0].name() != "self" || n.args().empty() ||
      !n.args()[0].is_value() || !is_tensor_type(schema.arguments()[0].type()) || tensor_args_.empty() ||
      tensor_args_[0].stack_index != 0)
    return false;
  const Value self = n.args()[0].value();
  const uint32_t slot = tensor_args_[0].slot;
  if (std::count(reads_.begin(), reads_.end(), slot) != 1 || !fresh_result(*self.node, self.index)) return false;
  const TensorMeta& in = self.node->output_meta().at(self.index);
  const TensorMeta& out = n.output_meta().at(0);
  if (!in.defined || !out.defined || in.dtype != out.dtype || in.sizes != out.sizes || in.strides != out.strides ||
      in.device != out.device)
    return false;
  // Half and BFloat16 are left alone: LibTorch 2.x computes some of their in-place overloads
  // with the scalar rounded differently from the out-of-place ones (`mul_(0.1)` and `mul(0.1)`
  // on Half differ in the last bit), so reuse would change eager's results.
  if (in.dtype == at::kHalf || in.dtype == at::kBFloat16) return false;
  inplace_op_ = inplace_variant(op_);
  if (!inplace_op_) return false;
  if (scalar_as_tensor_) {
    scalar_as_tensor_->inplace_op = inplace_variant(scalar_as_tensor_->op);
    if (!scalar_as_tensor_->inplace_op) {
      inplace_op_.reset();
      return false;
    }
  }
  self_slot_ = slot;
  self_sizes_ = in.sizes;
  self_strides_ = in.strides;
  return true;
}

bool OpStep::reuse_self(const at::Tensor& self) const {
  // Only the slot refers to the tensor and only the tensor to its storage: no view, no caller
  // and no saved variable can observe the update.
  return self.defined() && self.use_count() == 1 && self.unsafeGetTensorImpl()->has_storage() &&
         self.storage().use_count() == 1 && self.sizes().equals(self_sizes_) &&
         self.strides().equals(self_strides_);
}

C10_ALWAYS_INLINE void OpStep::fill_tensor_args(at::Tensor* slots, torch::jit::Stack& stack, bool skip_self) const {
  for (const auto& ta : tensor_args_) {
    if (skip_self && ta.stack_index == 0) continue;
    const at::Tensor& t = slots[ta.slot];
    if (ta.optional && !t.defined()) continue;  // the template holds None
    stack[ta.stack_index] = t;
  }
  for (const auto& la : list_args_) {
    if (la.optional_elements) {
      c10::List<c10::optional<at::Tensor>> list;
      list.reserve(la.slots.size());
      for (int32_t s : la.slots) list.push_back(s < 0 ? c10::optional<at::Tensor>() : c10::optional<at::Tensor>(slots[s]));
      stack[la.stack_index] = std::move(list);
    } else {
      c10::List<at::Tensor> list;
      list.reserve(la.slots.size());
      for (int32_t s : la.slots) list.push_back(slots[s]);
      stack[la.stack_index] = std::move(list);
    }
  }
}

void OpStep::put_size_args(torch::jit::Stack& stack, const int64_t* symbols) const {
  TORCH_CHECK(symbols != nullptr, "node '", name_, "' has size expressions as arguments; run its graph with ",
              "ir::Interpreter, which gives them the symbols' values (or make the graph static: Graph::clear_symbols)");
  auto value = [&](const SizeArg::Int& x) -> int64_t {
    if (x.symbol >= 0) return symbols[x.symbol];
    if (!x.expr) return x.constant;
    return x.expr->evaluate([&](const std::string& name) {
      auto it = std::find(symbol_names_.begin(), symbol_names_.end(), name);
      return symbols[it - symbol_names_.begin()];
    });
  };
  for (const SizeArg& sa : size_args_) {
    if (sa.scalar) {
      stack[sa.stack_index] = value(sa.ints[0]);
      continue;
    }
    c10::List<int64_t> list;
    list.reserve(sa.ints.size());
    for (const SizeArg::Int& x : sa.ints) list.push_back(value(x));
    stack[sa.stack_index] = std::move(list);
  }
}

void OpStep::run(at::Tensor* slots, torch::jit::Stack& stack, bool below_autograd, const int64_t* symbols) const {
  stack = stack_template_;
  if (!size_args_.empty()) put_size_args(stack, symbols);
  const c10::OperatorHandle* op = &op_;
  const std::optional<c10::OperatorHandle>* inplace_op = &inplace_op_;
  if (scalar_as_tensor_ && below_autograd) {
    const at::Tensor& self = slots[scalar_as_tensor_->self_slot];
    if (self.defined() && self.scalar_type() == scalar_as_tensor_->dtype) {
      stack[1] = scalar_as_tensor_->operand;
      op = &scalar_as_tensor_->op;
      inplace_op = &scalar_as_tensor_->inplace_op;
    }
  }
  const bool in_place = inplace_op->has_value() && below_autograd && reuse_self(slots[self_slot_]);
  if (in_place) stack[0] = std::move(slots[self_slot_]);
  fill_tensor_args(slots, stack, in_place);
  {
    std::optional<c10::impl::ExcludeDispatchKeyGuard> skip;
    if (below_autograd) skip.emplace(c10::autograd_dispatch_keyset);
    (in_place ? **inplace_op : *op).callBoxed(&stack);
  }
  size_t o = 0;
  for (size_t r = 0; r < return_counts_.size(); ++r) {
    c10::IValue& rv = stack[r];
    if (return_is_list_[r]) {
      const auto& elems = rv.toListRef();
      TORCH_CHECK(elems.size() == return_counts_[r], name_, " returned a list of ", elems.size(),
                  " tensors; the traced call returned ", return_counts_[r]);
      for (const c10::IValue& e : elems) slots[out_slots_[o++]] = e.isTensor() ? e.toTensor() : at::Tensor();
    } else {
      slots[out_slots_[o++]] = rv.isTensor() ? std::move(rv).toTensor() : at::Tensor();
    }
  }
  stack.clear();
}

void OpStep::run_instead(const NodeFn& fn, const Node& n, at::Tensor* slots, torch::jit::Stack& stack,
                         const int64_t* symbols) const {
  stack = stack_template_;
  if (!size_args_.empty()) put_size_args(stack, symbols);
  fill_tensor_args(slots, stack, /*skip_self=*/false);
  std::vector<at::Tensor> outs = fn(n, stack);
  stack.clear();
  TORCH_CHECK(outs.size() == out_slots_.size(), "node '", name_, "' (", n.target(), ") returned ", outs.size(),
              " tensors; the graph expects ", out_slots_.size(), " (one per output of ", op_target_name(op_), ")");
  for (size_t i = 0; i < outs.size(); ++i) slots[out_slots_[i]] = std::move(outs[i]);
}

namespace {

// Stacks given back by ScratchStack on this thread (a few: one per nesting level in use).
std::vector<torch::jit::Stack>& stack_pool() {
  thread_local std::vector<torch::jit::Stack> pool;
  return pool;
}

}  // namespace

ScratchStack::ScratchStack() {
  auto& pool = stack_pool();
  if (!pool.empty()) {
    stack_ = std::move(pool.back());
    pool.pop_back();
  }
}

ScratchStack::~ScratchStack() {
  auto& pool = stack_pool();
  if (pool.size() < 8) {
    stack_.clear();
    pool.push_back(std::move(stack_));
  }
}

namespace {

// Whether `t` has, or as a view may lazily get, a forward-mode gradient.
bool may_carry_forward_grad(const at::Tensor& t) {
  if (!t.defined()) return false;
  const auto* meta = torch::autograd::impl::get_autograd_meta(t);
  if (meta == nullptr) return false;
  if (meta->is_view_) return true;  // its forward gradient may come from its base: be conservative
  return meta->fw_grad_ != nullptr && !meta->fw_grad_->empty();
}

}  // namespace

bool may_dispatch_below_autograd(const at::Tensor* tensors, size_t n) {
  if (c10::GradMode::is_enabled()) return false;
  for (size_t i = 0; i < n; ++i)
    if (may_carry_forward_grad(tensors[i])) return false;
  return true;
}

}  // namespace torchcompile::ir
