// One call_function node prepared for execution over numbered value slots: the step every
// executor of a graph shares (the interpreter, and the ATen steps of backends that lower part
// of a graph and leave the rest to ATen).
#pragma once

#include <torchcompile/ir/callable.h>
#include <torchcompile/ir/graph.h>

#include <ATen/core/stack.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace torchcompile::ir {

/// A boxed operator call prepared once: the operator handle, a stack template with the constant
/// arguments in place, and the slots each tensor argument is read from and each output is
/// written to. run() does no lookups and no schema parsing.
class OpStep {
 public:
  /// `slot_of` gives the slot of each value the node reads; `out_slots` receive its outputs in
  /// order (one per node output).
  ///
  /// `add`, `sub`, `mul` and `div` with a constant scalar operand on a float or double tensor
  /// (`x * 0.9`) are prepared as their `.Tensor` overloads with the scalar already a 0-dim
  /// wrapped-number tensor of `x`'s dtype: ATen's `.Scalar` overloads build that tensor on every
  /// call and then convert it to `x`'s dtype (two allocations and a copy kernel, more than the
  /// operation itself on small tensors). The value and the result are the same bits: ATen reads
  /// the operand after that same conversion. Used only when the call skips the autograd keys and
  /// `x` has the traced dtype; otherwise the step calls the `.Scalar` overload as traced.
  ///
  /// A node calling a user function (Graph::set_target) is refused: run() calls the operator,
  /// and only the Interpreter runs user functions.
  OpStep(const Node& n, const std::function<uint32_t(const Value&)>& slot_of, std::vector<uint32_t> out_slots);

  /// Call the operator on `slots`, using `stack` as scratch (its capacity is reused from call
  /// to call). With `below_autograd` the call skips the autograd dispatch keys (see
  /// may_dispatch_below_autograd).
  ///
  /// A node whose arguments include size expressions (graphs with size symbols) needs the
  /// symbols' values of this call, in the order of Graph::symbols(): `symbols`.
  void run(at::Tensor* slots, torch::jit::Stack& stack, bool below_autograd, const int64_t* symbols = nullptr) const;

  /// Call `fn(n, args)` in place of the operator, `n` being the node the step was prepared from:
  /// `args` are the node's arguments as traced (the `.Scalar` overload's scalar, no in-place
  /// overload), the call keeps the autograd keys, and `fn` must return one tensor per output.
  void run_instead(const NodeFn& fn, const Node& n, at::Tensor* slots, torch::jit::Stack& stack,
                   const int64_t* symbols = nullptr) const;
  /// Whether an argument is a size expression (run() then needs the symbols' values).
  bool has_size_expressions() const { return !size_args_.empty(); }

  /// Let run() compute the node in place in its first argument (`self`) with the operator's
  /// in-place overload (`add.Tensor` -> `add_.Tensor`) when that tensor is an intermediate no
  /// one else can see: the caller promises `self`'s slot dies at this step; the node's operator
  /// must be deterministic with one result whose dtype, sizes and strides equal `self`'s, and
  /// `self` must be another operator's fresh (non-aliasing) result read once by this node. At
  /// run time the reuse also needs the autograd keys skipped and the tensor and its storage
  /// referenced only by the slot, and otherwise the step calls the out-of-place operator.
  /// Returns whether the reuse was enabled. This saves an allocation per op, which is most of
  /// the cost of small ops.
  bool enable_self_reuse(const Node& n);

  /// Whether the step passes its scalar operand as a prepared tensor (see the constructor).
  bool scalar_operand_prepared() const { return scalar_as_tensor_.has_value(); }
  /// Whether enable_self_reuse enabled the in-place overload.
  bool self_reuse_enabled() const { return inplace_op_.has_value(); }

  /// The slots the step reads, in argument order (a slot may repeat).
  const std::vector<uint32_t>& reads() const { return reads_; }
  const std::vector<uint32_t>& out_slots() const { return out_slots_; }
  const std::string& name() const { return name_; }

 private:
  friend class Interpreter;  // prepares steps of nodes calling user functions, for run_instead
  OpStep(const Node& n, const std::function<uint32_t(const Value&)>& slot_of, std::vector<uint32_t> out_slots,
         bool allow_user_function);
  /// Puts the slots' tensors into `stack` (a copy of the template); `skip_self` leaves
  /// argument 0 to the caller.
  void fill_tensor_args(at::Tensor* slots, torch::jit::Stack& stack, bool skip_self) const;

  struct TensorArg {
    uint32_t stack_index;
    uint32_t slot;
    bool optional;  // an undefined tensor is passed as None
  };
  struct ListArg {  // a Tensor[] or Tensor?[] argument
    uint32_t stack_index;
    std::vector<int32_t> slots;  // -1 for a None element
    bool optional_elements;
  };
  bool reuse_self(const at::Tensor& self) const;
  /// A size-expression argument: each integer a constant, a symbol (its index) or an expression.
  struct SizeArg {
    struct Int {
      int64_t constant = 0;
      int32_t symbol = -1;
      std::optional<SymExpr> expr;
    };
    uint32_t stack_index;
    bool scalar;  // an int (else an int list)
    std::vector<Int> ints;
  };
  void put_size_args(torch::jit::Stack& stack, const int64_t* symbols) const;
  std::vector<SizeArg> size_args_;
  std::vector<std::string> symbol_names_;  // the graph's symbols, for expressions

  /// The `.Tensor` form of a `.Scalar` call (see the constructor).
  struct ScalarAsTensor {
    c10::OperatorHandle op;
    std::optional<c10::OperatorHandle> inplace_op;  // set by enable_self_reuse
    c10::IValue operand;                            // the 0-dim wrapped-number tensor
    c10::ScalarType dtype;                          // of `self` (and of the operand)
    uint32_t self_slot;
  };
  void prepare_scalar_operand(const Node& n);

  c10::OperatorHandle op_;
  std::optional<c10::OperatorHandle> inplace_op_;  // set by enable_self_reuse
  std::optional<ScalarAsTensor> scalar_as_tensor_;
  uint32_t self_slot_ = 0;
  std::vector<int64_t> self_sizes_, self_strides_;
  std::vector<c10::IValue> stack_template_;
  std::vector<TensorArg> tensor_args_;
  std::vector<ListArg> list_args_;
  std::vector<uint32_t> return_counts_;
  std::vector<bool> return_is_list_;
  std::vector<uint32_t> out_slots_;
  std::vector<uint32_t> reads_;
  std::string name_;
};

/// A scratch stack for OpStep::run, taken from a per-thread pool and given back on
/// destruction: steady-state calls allocate no stack (nested calls take another one).
class ScratchStack {
 public:
  ScratchStack();
  ~ScratchStack();
  ScratchStack(const ScratchStack&) = delete;
  ScratchStack& operator=(const ScratchStack&) = delete;
  torch::jit::Stack& get() { return stack_; }

 private:
  torch::jit::Stack stack_;
};

/// Whether the ATen calls of a graph run with these inputs and attributes may skip the autograd
/// dispatch keys (Autograd*, not ADInplaceOrView): grad mode is disabled and no tensor can carry
/// a forward-mode gradient. Then the autograd kernels would only redispatch (under no_grad they
/// record nothing), so skipping them gives the same results, views and version counters as
/// eager, without their cost. Modules and user code called from a graph run with the keys.
bool may_dispatch_below_autograd(const at::Tensor* tensors, size_t n);

}  // namespace torchcompile::ir
