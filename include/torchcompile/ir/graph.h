// The graph IR: an FX-like list of nodes over ATen operators.
//
// A Graph owns its Nodes, in program (topological) order. A Value is a non-owning
// {Node*, output index} pair. Nodes are created only through Graph's factories, which check
// their inputs and keep the use lists up to date; lint() verifies all invariants.
#pragma once

#include <torchcompile/ir/symbolic.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace torchcompile::ir {

class Graph;
class Node;
struct Callable;  // ir/callable.h

/// What a node does, with FX's opcode names.
enum class NodeKind {
  Placeholder,   ///< a graph input, in calling order
  GetAttr,       ///< a GraphModule attribute: parameter, buffer or graph constant, read at each call
  CallFunction,  ///< an ATen operator overload, called through the dispatcher (or a user function
                 ///< in its place: Graph::set_target)
  CallModule,    ///< an opaque module call (reserved: leaf modules run eagerly inside the graph)
  Output,        ///< the graph's outputs; exactly one, last
};

/// FX's spelling of a NodeKind ("placeholder", "call_function", ...).
const char* to_string(NodeKind kind);

/// One output of a node. Non-owning; compares by identity.
struct Value {
  Node* node = nullptr;
  uint32_t index = 0;

  bool valid() const { return node != nullptr; }
  bool operator==(const Value& o) const { return node == o.node && index == o.index; }
  bool operator!=(const Value& o) const { return !(*this == o); }
};

struct ValueHash {
  size_t operator()(const Value& v) const {
    return std::hash<const void*>()(v.node) ^ (static_cast<size_t>(v.index) * 0x9e3779b97f4a7c15ULL);
  }
};

/// What the example run saw for a tensor value. `defined == false` stands for an undefined
/// tensor (an optional output that was not produced). In a graph with size symbols
/// (Graph::symbols), `sym_sizes` / `sym_strides` give each size and stride as an expression of
/// the symbols (`f32[s0, 784]{784, 1}`); `sizes` / `strides` are then their values for the
/// symbols' example values. Empty for a static value.
struct TensorMeta {
  bool defined = true;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  bool requires_grad = false;
  std::vector<SymExpr> sym_sizes;
  std::vector<SymExpr> sym_strides;

  /// Whether sizes or strides are given as expressions of symbols.
  bool symbolic() const { return !sym_sizes.empty(); }

  /// The metadata of `t`; an undefined tensor gives `defined == false`.
  static TensorMeta of(const at::Tensor& t);
  bool operator==(const TensorMeta& o) const;
  /// Compact form used by the printers: `f32[2, 3]{3, 1}` (`f32[s0, 3]{3, 1}` with symbols),
  /// with `cpu` omitted and `rg` for requires_grad.
  std::string str() const;
};

/// A size symbol of a graph (`s0`): an integer input whose value is the size of an input
/// dimension, the first placeholder dimension whose symbolic size is exactly the symbol
/// (seed graphs print it as `placeholder s0`). `example` is its value in the example run.
struct SizeSymbolDecl {
  std::string name;
  int64_t example = 0;
  int64_t min = 0;
  int64_t max = std::numeric_limits<int64_t>::max();
};

/// An argument of a node. Constants are IValues (ints, doubles, bools, int lists, dtypes, None,
/// strings, ...); tensors are always Values (a tensor that no node produced becomes a get_attr);
/// `Tensor[]` and `Tensor?[]` arguments are lists of optional Values (nullopt = None).
///
/// In a graph with size symbols, an `int` or `int[]` constant may be a *size expression*: its
/// value is an expression of the symbols (`view(x, [s0, -1])`, `arange(s1)`,
/// `reshape(x, [s0*8, s1, 64])`), one SymExpr per integer (`sym_ints()`). `constant()` is then
/// its value at the symbols' example values, so code that reads constants sees the example
/// graph; executors evaluate the expressions for each call (`constant_at`).
class Argument {
 public:
  enum class Kind { Constant, Value, ValueList };

  Argument() : kind_(Kind::Constant) {}
  /*implicit*/ Argument(c10::IValue constant);
  /*implicit*/ Argument(Value v);
  /*implicit*/ Argument(std::vector<std::optional<Value>> list);

  Kind kind() const { return kind_; }
  bool is_constant() const { return kind_ == Kind::Constant; }
  bool is_value() const { return kind_ == Kind::Value; }
  bool is_list() const { return kind_ == Kind::ValueList; }

  const c10::IValue& constant() const;
  /// A size expression: `exprs` has one expression per integer of `example` (an int or an
  /// int list, its value at the symbols' example values).
  static Argument size_expression(std::vector<SymExpr> exprs, c10::IValue example);
  /// Whether this constant is a size expression, and its expressions (one per integer).
  bool is_size_expression() const { return !sym_.empty(); }
  const std::vector<SymExpr>& sym_ints() const { return sym_; }
  /// The constant for these symbol values (a size expression evaluated; any other constant as it
  /// is).
  c10::IValue constant_at(const std::function<int64_t(const std::string&)>& symbol_value) const;
  const Value& value() const;
  const std::vector<std::optional<Value>>& list() const;

  /// Every Value this argument refers to, in order.
  void for_each_value(const std::function<void(const Value&)>& f) const;

 private:
  friend class Graph;
  friend class Node;
  Kind kind_;
  c10::IValue constant_;
  std::vector<SymExpr> sym_;
  Value value_;
  std::vector<std::optional<Value>> list_;
};

/// The integers of an int or int-list constant, in order; nullopt for any other constant.
std::optional<std::vector<int64_t>> int_values(const c10::IValue& v);

/// A reference from a user node to one of its arguments.
struct Use {
  Node* user = nullptr;
  size_t arg_index = 0;
  bool operator==(const Use& o) const { return user == o.user && arg_index == o.arg_index; }
};

/// One node of a Graph. Created through Graph's factories only.
class Node {
 public:
  NodeKind kind() const { return kind_; }
  /// Unique within the graph, FX style (`add`, `add_1`, ...).
  const std::string& name() const { return name_; }
  /// placeholder: the input's name; get_attr: the attribute's qualified name; call_function:
  /// the operator as `aten::add.Tensor` (overload after the dot, `.default` not printed), or the
  /// name of the user function it calls instead (Graph::set_target); call_module: the module's
  /// qualified path; output: "output".
  const std::string& target() const { return target_; }
  Graph* owning_graph() const { return graph_; }

  /// The operator of a call_function node. A node calling a user function keeps its operator:
  /// its schema still describes the arguments and outputs, and the operator's properties
  /// (mutation, aliasing) are still assumed of the function.
  const c10::OperatorHandle& op() const;
  /// The user function a call_function node calls in place of its operator, or nullptr.
  const std::shared_ptr<const Callable>& callable() const { return callable_; }
  bool has_op() const { return op_.has_value(); }
  /// The operator's schema (call_function only).
  const c10::FunctionSchema& schema() const { return op().schema(); }

  /// The arguments: for call_function one per schema argument, in schema order, complete
  /// (defaults included); for call_module the module's inputs; for output one ValueList.
  const std::vector<Argument>& args() const { return args_; }
  /// Replace argument i, keeping use lists right.
  void set_arg(size_t i, Argument a);

  /// Number of output values and their example metadata.
  size_t num_outputs() const { return output_meta_.size(); }
  Value output(size_t i = 0);
  const std::vector<TensorMeta>& output_meta() const { return output_meta_; }
  /// Replace the metadata of output i (the same output, seen at other sizes or with symbols).
  void set_output_meta(size_t i, TensorMeta meta);
  /// For call_function: how the outputs group into the schema's returns. A `Tensor` return
  /// has 1 value, a `Tensor[]` return as many as the example run produced.
  const std::vector<uint32_t>& return_counts() const { return return_counts_; }

  /// The users of each output, by output index.
  const std::vector<Use>& uses(size_t output_index = 0) const;
  bool has_uses() const;

  /// The module path this node was called from (`encoder.layers.0.linear1`), empty if unknown.
  const std::string& module_path() const { return module_path_; }
  void set_module_path(std::string p) { module_path_ = std::move(p); }

  /// True when removing this node could change results even if its outputs are unused:
  /// it mutates an argument, draws random numbers, calls a user function (which may, say,
  /// print), or is a placeholder/output.
  bool has_side_effects() const;

 private:
  friend class Graph;
  Node(Graph* g, NodeKind k) : graph_(g), kind_(k) {}

  Graph* graph_;
  NodeKind kind_;
  std::string name_;
  std::string target_;
  std::optional<c10::OperatorHandle> op_;
  std::shared_ptr<const Callable> callable_;
  std::vector<Argument> args_;
  std::vector<TensorMeta> output_meta_;
  std::vector<uint32_t> return_counts_;
  std::vector<std::vector<Use>> uses_;
  std::string module_path_;
};

/// `aten::add.Tensor` for an operator handle (`aten::cos` for the default overload).
std::string op_target_name(const c10::OperatorHandle& op);
/// The handle for `aten::add.Tensor` / `aten::cos`; throws a c10::Error naming the target when
/// no such operator is registered.
c10::OperatorHandle find_op(const std::string& target);
/// Schema types that carry graph values: `Tensor`, `Tensor?`, and `Tensor[]` / `Tensor?[]`.
bool is_tensor_type(const c10::TypePtr& t);
bool is_optional_tensor_type(const c10::TypePtr& t);
bool is_tensor_list_type(const c10::TypePtr& t);
/// Any of the three.
inline bool is_tensor_like_type(const c10::TypePtr& t) {
  return is_tensor_type(t) || is_optional_tensor_type(t) || is_tensor_list_type(t);
}
/// The value whose memory `v` is: followed back through views and through in-place results
/// (`add_` returns its `self`) to a placeholder, a get_attr or an op's fresh result.
Value memory_base(Value v);

/// The graph: nodes in topological order, placeholders first, one output node last.
class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  /// A graph input named `name` (made unique), with the example input's metadata.
  Value placeholder(const std::string& name, TensorMeta meta);
  /// An attribute read, by qualified name (`layer1.weight`, `_tensor_constant0`).
  Value get_attr(const std::string& qualified_name, TensorMeta meta);
  /// A call to `op` with one Argument per schema argument (missing trailing ones take the
  /// schema's defaults). `return_counts` groups the outputs per schema return; empty means one
  /// output per return. Checks argument count, that every Value belongs to this graph and is
  /// defined before the insertion point.
  Node* call_function(const c10::OperatorHandle& op, std::vector<Argument> args,
                      std::vector<TensorMeta> output_meta, std::vector<uint32_t> return_counts = {});
  /// FX's `node.target = fn`: call_function node `n` calls `fn` in place of its operator, with
  /// the operator's arguments (see CallableFn); its target() becomes `fn->name`. The node keeps
  /// its operator, schema, arguments and metadata. A prepared Interpreter does not see the
  /// change: call GraphModule::recompile(), as after any edit. Built-in backends other than the
  /// interpreter lower nodes by operator: run a graph with user functions with the interpreter.
  void set_target(Node* n, std::shared_ptr<const Callable> fn);
  /// The same with the callable registered under `name` (torchcompile::register_callable);
  /// throws naming the registered ones if there is none.
  void set_target(Node* n, const std::string& name);
  /// Undo set_target: `n` calls its operator again.
  void reset_target(Node* n);
  /// An opaque module call.
  Node* call_module(const std::string& path, std::vector<Argument> args, std::vector<TensorMeta> output_meta);
  /// The output node; a graph has exactly one.
  Node* output(std::vector<Value> outputs);

  /// Declare a size symbol (a name no other symbol or node has). Symbols come before the
  /// placeholders whose metadata uses them; lint() checks that each is bound by one.
  void add_symbol(SizeSymbolDecl symbol);
  /// The size symbols, in declaration order; empty for a graph with static sizes.
  const std::vector<SizeSymbolDecl>& symbols() const { return symbols_; }
  const SizeSymbolDecl* find_symbol(const std::string& name) const;
  /// The symbols' example values, by name.
  std::map<std::string, int64_t> symbol_examples() const;
  /// The symbols' values in a call with these inputs (placeholders in order): each symbol is
  /// the size of the placeholder dimension that binds it. Throws if the inputs do not match.
  std::map<std::string, int64_t> symbol_values(const std::vector<at::Tensor>& inputs) const;
  /// Make the graph static: drop the symbols and every value's symbolic sizes and strides (the
  /// example sizes stay); size expressions become constants of the example values.
  void clear_symbols();
  /// The same at other symbol values: size expressions become their values for `values`
  /// (metadata is left for the caller to record at those sizes).
  void clear_symbols(const std::map<std::string, int64_t>& values);
  /// Whether some argument is a size expression.
  bool has_size_expressions() const;
  /// Where each symbol is bound: (placeholder index, dimension), in symbol order. Throws naming
  /// a symbol no placeholder dimension binds.
  std::vector<std::pair<size_t, int64_t>> symbol_bindings() const;

  /// Nodes in order.
  const std::list<std::unique_ptr<Node>>& nodes() const { return nodes_; }
  size_t size() const { return nodes_.size(); }
  std::vector<Node*> placeholders() const;
  Node* output_node() const;
  /// The node named `name`, or nullptr.
  Node* find_node(const std::string& name) const;

  /// Remove a node that has no users.
  void erase(Node* n);
  /// Replace every use of `from` with `to`.
  void replace_all_uses(Value from, Value to);

  /// A name not yet used in this graph, derived from `base` FX-style: `add`, `add_1`, `add_2`.
  std::string unique_name(const std::string& base);
  /// Give `n` a new name (made unique, as unique_name does); frees its old name. The parser
  /// uses it to restore the names of a printed graph; returns the name given.
  std::string rename(Node* n, const std::string& name);

  /// Create new nodes before `n` instead of at the end (nullptr: at the end again).
  void set_insert_point(Node* n);

 private:
  Node* append(std::unique_ptr<Node> n);
  void add_uses(Node* user);
  void remove_uses(Node* user);
  void check_arg(const Argument& a, const Node* user) const;

  std::list<std::unique_ptr<Node>> nodes_;
  std::vector<SizeSymbolDecl> symbols_;
  std::unordered_map<std::string, size_t> name_counts_;
  std::unordered_set<std::string> names_;
  std::list<std::unique_ptr<Node>>::iterator insert_point_ = nodes_.end();
  bool insert_at_end_ = true;
};

}  // namespace torchcompile::ir
