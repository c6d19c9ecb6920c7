// The graph IR: nodes, values, use lists and the Graph factories that keep them consistent.
#include <torchcompile/ir/callable.h>
#include <torchcompile/ir/graph.h>
#include <torchcompile/ir/op_properties.h>

#include "text_internal.h"

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <sstream>

namespace torchcompile::ir {

namespace detail {

const char* dtype_short_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return "f32";
    case c10::ScalarType::Double: return "f64";
    case c10::ScalarType::Half: return "f16";
    case c10::ScalarType::BFloat16: return "bf16";
    case c10::ScalarType::Long: return "i64";
    case c10::ScalarType::Int: return "i32";
    case c10::ScalarType::Short: return "i16";
    case c10::ScalarType::Char: return "i8";
    case c10::ScalarType::Byte: return "u8";
    case c10::ScalarType::Bool: return "b8";
    case c10::ScalarType::ComplexFloat: return "c64";
    case c10::ScalarType::ComplexDouble: return "c128";
    case c10::ScalarType::ComplexHalf: return "c32";
    case c10::ScalarType::QInt8: return "qi8";
    case c10::ScalarType::QUInt8: return "qu8";
    case c10::ScalarType::QInt32: return "qi32";
    default: return nullptr;
  }
}

}  // namespace detail

namespace {

std::string join_ints(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  return s;
}

// FX names must be Python identifiers; keep ours printable in the text format the same way.
std::string sanitize_name(const std::string& base) {
  std::string s;
  s.reserve(base.size() + 1);
  for (char c : base) s += (std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) s = "_" + s;
  return s;
}

// The operator name without namespace and overload: `aten::add.Tensor` -> `add`.
std::string op_base_name(const c10::OperatorHandle& op) {
  const std::string& full = op.schema().name();
  auto pos = full.find("::");
  return pos == std::string::npos ? full : full.substr(pos + 2);
}

bool is_list_return(const c10::Argument& r) { return r.type()->kind() == c10::TypeKind::ListType; }

std::string describe(const Node* n) {
  std::ostringstream os;
  os << to_string(n->kind()) << " node '" << n->name() << "' (target " << n->target() << ")";
  return os.str();
}

// Checks a value used as an argument: it belongs to `g`, has that output, and (when `after` is
// given) its node is not at or after the position of the user.
void check_value(const Graph* g, const Value& v, const std::string& user,
                 const std::unordered_set<const Node*>* after) {
  TORCH_CHECK(v.valid(), "argument of ", user, " is a null value");
  TORCH_CHECK(v.node->owning_graph() == g, "argument of ", user, " refers to node '", v.node->name(),
              "' of another graph");
  TORCH_CHECK(v.index < v.node->num_outputs(), "argument of ", user, " refers to output ", v.index, " of '",
              v.node->name(), "', which has ", v.node->num_outputs(), " outputs");
  TORCH_CHECK(v.node->kind() != NodeKind::Output, "argument of ", user, " refers to the output node");
  if (after) {
    TORCH_CHECK(!after->count(v.node), "argument of ", user, " refers to '", v.node->name(),
                "', which is not defined before it");
  }
}

void check_argument(const Graph* g, const Argument& a, const std::string& user,
                    const std::unordered_set<const Node*>* after) {
  a.for_each_value([&](const Value& v) { check_value(g, v, user, after); });
}

}  // namespace

const char* to_string(NodeKind kind) {
  switch (kind) {
    case NodeKind::Placeholder: return "placeholder";
    case NodeKind::GetAttr: return "get_attr";
    case NodeKind::CallFunction: return "call_function";
    case NodeKind::CallModule: return "call_module";
    case NodeKind::Output: return "output";
  }
  TORCH_INTERNAL_ASSERT(false, "unknown NodeKind");
}

// ---------------------------------------------------------------------------------------------
// TensorMeta

TensorMeta TensorMeta::of(const at::Tensor& t) {
  TensorMeta m;
  if (!t.defined()) {
    m.defined = false;
    return m;
  }
  m.dtype = t.scalar_type();
  m.sizes = t.sizes().vec();
  // Sparse and mkldnn tensors have no strides.
  if (t.layout() == c10::kStrided) m.strides = t.strides().vec();
  m.device = t.device();
  m.requires_grad = t.requires_grad();
  return m;
}

bool TensorMeta::operator==(const TensorMeta& o) const {
  if (defined != o.defined) return false;
  if (!defined) return true;
  return dtype == o.dtype && sizes == o.sizes && strides == o.strides && device == o.device &&
         requires_grad == o.requires_grad && sym_sizes == o.sym_sizes && sym_strides == o.sym_strides;
}

std::string TensorMeta::str() const {
  if (!defined) return "undef";
  std::string s;
  const char* short_name = detail::dtype_short_name(dtype);
  s += short_name ? short_name : c10::toString(dtype);
  if (symbolic()) {
    auto join = [](const std::vector<SymExpr>& v) {
      std::string out;
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i].str();
      return out;
    };
    s += "[" + join(sym_sizes) + "]";
    s += "{" + join(sym_strides) + "}";
  } else {
    s += "[" + join_ints(sizes) + "]";
    s += "{" + join_ints(strides) + "}";
  }
  if (device.type() != c10::DeviceType::CPU || device.has_index()) s += " " + device.str();
  if (requires_grad) s += " rg";
  return s;
}

// ---------------------------------------------------------------------------------------------
// Argument

Argument::Argument(c10::IValue constant) : kind_(Kind::Constant), constant_(std::move(constant)) {}
Argument::Argument(Value v) : kind_(Kind::Value), value_(v) {}
Argument::Argument(std::vector<std::optional<Value>> list) : kind_(Kind::ValueList), list_(std::move(list)) {}

const c10::IValue& Argument::constant() const {
  TORCH_CHECK(kind_ == Kind::Constant, "argument is not a constant");
  return constant_;
}

std::optional<std::vector<int64_t>> int_values(const c10::IValue& v) {
  if (v.isInt()) return std::vector<int64_t>{v.toInt()};
  if (v.isIntList()) return v.toIntVector();
  if (v.isList()) {
    std::vector<int64_t> out;
    for (const c10::IValue& e : v.toList()) {
      if (!e.isInt()) return std::nullopt;
      out.push_back(e.toInt());
    }
    return out;
  }
  return std::nullopt;
}

Argument Argument::size_expression(std::vector<SymExpr> exprs, c10::IValue example) {
  const auto ints = int_values(example);
  TORCH_CHECK(ints && !exprs.empty() && ints->size() == exprs.size() && (example.isInt() ? exprs.size() == 1 : true),
              "Argument::size_expression: expected one expression per integer of an int or int list, got ",
              exprs.size(), " expressions for ", example.tagKind());
  Argument a(std::move(example));
  a.sym_ = std::move(exprs);
  return a;
}

c10::IValue Argument::constant_at(const std::function<int64_t(const std::string&)>& symbol_value) const {
  TORCH_CHECK(kind_ == Kind::Constant, "argument is not a constant");
  if (sym_.empty()) return constant_;
  if (constant_.isInt()) return sym_[0].evaluate(symbol_value);
  c10::List<int64_t> out;
  out.reserve(sym_.size());
  for (const SymExpr& e : sym_) out.push_back(e.evaluate(symbol_value));
  return out;
}

const Value& Argument::value() const {
  TORCH_CHECK(kind_ == Kind::Value, "argument is not a value");
  return value_;
}

const std::vector<std::optional<Value>>& Argument::list() const {
  TORCH_CHECK(kind_ == Kind::ValueList, "argument is not a value list");
  return list_;
}

void Argument::for_each_value(const std::function<void(const Value&)>& f) const {
  if (kind_ == Kind::Value) {
    f(value_);
  } else if (kind_ == Kind::ValueList) {
    for (const auto& v : list_)
      if (v) f(*v);
  }
}

// ---------------------------------------------------------------------------------------------
// Node

const c10::OperatorHandle& Node::op() const {
  TORCH_CHECK(op_.has_value(), "node '", name_, "' is a ", to_string(kind_), " node, not call_function");
  return *op_;
}

Value Node::output(size_t i) {
  TORCH_CHECK(i < output_meta_.size(), "node '", name_, "' has ", output_meta_.size(), " outputs, asked for output ",
              i);
  return Value{this, static_cast<uint32_t>(i)};
}

const std::vector<Use>& Node::uses(size_t output_index) const {
  static const std::vector<Use> kNone;
  if (uses_.empty() && output_index == 0) return kNone;  // e.g. the output node
  TORCH_CHECK(output_index < uses_.size(), "node '", name_, "' has ", uses_.size(), " outputs, asked for uses of ",
              output_index);
  return uses_[output_index];
}

bool Node::has_uses() const {
  return std::any_of(uses_.begin(), uses_.end(), [](const std::vector<Use>& u) { return !u.empty(); });
}

bool Node::has_side_effects() const {
  switch (kind_) {
    case NodeKind::Placeholder:
    case NodeKind::Output:
    case NodeKind::CallModule:
      return true;
    case NodeKind::GetAttr:
      return false;
    case NodeKind::CallFunction:
      return callable_ != nullptr || node_is_random(*this) || !written_arguments(*this).empty();
  }
  return true;
}

void Node::set_arg(size_t i, Argument a) {
  TORCH_CHECK(i < args_.size(), "node '", name_, "' has ", args_.size(), " arguments, cannot set argument ", i);
  TORCH_CHECK(kind_ != NodeKind::Output || a.is_list(), "the output node's argument must be a value list");
  if (kind_ == NodeKind::CallFunction) {
    const auto& type = op_->schema().arguments()[i].type();
    if (is_tensor_type(type)) {
      TORCH_CHECK(a.is_value(), "argument '", op_->schema().arguments()[i].name(), "' of ", describe(this),
                  " expects a tensor value");
    } else if (is_optional_tensor_type(type)) {
      TORCH_CHECK(a.is_value() || (a.is_constant() && a.constant().isNone()), "argument '",
                  op_->schema().arguments()[i].name(), "' of ", describe(this), " expects a tensor value or None");
    } else if (is_tensor_list_type(type)) {
      TORCH_CHECK(a.is_list(), "argument '", op_->schema().arguments()[i].name(), "' of ", describe(this),
                  " expects a list of tensor values");
    } else {
      TORCH_CHECK(a.is_constant(), "argument '", op_->schema().arguments()[i].name(), "' of ", describe(this),
                  " expects a constant");
    }
  }
  // The new argument must be defined before this node.
  std::unordered_set<const Node*> after;
  bool seen = false;
  for (const auto& n : graph_->nodes()) {
    if (n.get() == this) seen = true;
    if (seen) after.insert(n.get());
  }
  check_argument(graph_, a, describe(this), &after);

  args_[i].for_each_value([&](const Value& v) {
    auto& uses = v.node->uses_[v.index];
    auto it = std::find(uses.begin(), uses.end(), Use{this, i});
    TORCH_INTERNAL_ASSERT(it != uses.end(), "use list of '", v.node->name(), "' misses a use by '", name_, "'");
    uses.erase(it);
  });
  args_[i] = std::move(a);
  args_[i].for_each_value([&](const Value& v) { v.node->uses_[v.index].push_back(Use{this, i}); });
}

// ---------------------------------------------------------------------------------------------
// Operators

std::string op_target_name(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

c10::OperatorHandle find_op(const std::string& target) {
  std::string t = target;
  // Also accept FX's spelling `aten.add.Tensor` / `aten.cos.default`.
  if (t.find("::") == std::string::npos) {
    auto dot = t.find('.');
    TORCH_CHECK(dot != std::string::npos, "expected an operator name like 'aten::add.Tensor', got '", target, "'");
    t = t.substr(0, dot) + "::" + t.substr(dot + 1);
  }
  auto ns = t.find("::");
  std::string name = t, overload;
  auto dot = t.find('.', ns + 2);
  if (dot != std::string::npos) {
    name = t.substr(0, dot);
    overload = t.substr(dot + 1);
  }
  auto op = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!op && overload == "default") op = c10::Dispatcher::singleton().findSchema({name, ""});
  TORCH_CHECK(op.has_value(), "no operator '", target, "' is registered (looked for '", name, "' overload '",
              overload, "')");
  return *op;
}


Value memory_base(Value v) {
  while (v.node->kind() == NodeKind::CallFunction) {
    const auto& returns = v.node->schema().returns();
    const size_t r = returns.size() == 1 ? 0 : v.index;  // a list return (split) is one return
    if (r >= returns.size() || returns[r].alias_info() == nullptr) break;
    const auto& schema_args = v.node->schema().arguments();
    const Value* aliased = nullptr;
    for (size_t i = 0; i < schema_args.size() && !aliased; ++i)
      if (schema_args[i].alias_info() != nullptr && v.node->args()[i].is_value()) aliased = &v.node->args()[i].value();
    if (!aliased) break;
    v = *aliased;
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// Graph

void Graph::add_symbol(SizeSymbolDecl symbol) {
  TORCH_CHECK(SymExpr::symbol(symbol.name).as_symbol() == symbol.name, "Graph::add_symbol: '", symbol.name,
              "' is not an identifier");
  TORCH_CHECK(find_symbol(symbol.name) == nullptr && names_.count(symbol.name) == 0, "Graph::add_symbol: the name '",
              symbol.name, "' is taken");
  TORCH_CHECK(symbol.min <= symbol.example && symbol.example <= symbol.max, "Graph::add_symbol: ", symbol.name,
              "'s example value ", symbol.example, " is outside its range [", symbol.min, ", ", symbol.max, "]");
  names_.insert(symbol.name);
  symbols_.push_back(std::move(symbol));
}

const SizeSymbolDecl* Graph::find_symbol(const std::string& name) const {
  for (const SizeSymbolDecl& s : symbols_)
    if (s.name == name) return &s;
  return nullptr;
}

std::map<std::string, int64_t> Graph::symbol_examples() const {
  std::map<std::string, int64_t> out;
  for (const SizeSymbolDecl& s : symbols_) out[s.name] = s.example;
  return out;
}

std::map<std::string, int64_t> Graph::symbol_values(const std::vector<at::Tensor>& inputs) const {
  std::map<std::string, int64_t> out;
  if (symbols_.empty()) return out;
  const std::vector<std::pair<size_t, int64_t>> bindings = symbol_bindings();
  for (size_t k = 0; k < symbols_.size(); ++k) {
    const auto [input, dim] = bindings[k];
    TORCH_CHECK(input < inputs.size(), "Graph::symbol_values: the graph has more placeholders than the ", inputs.size(),
                " inputs given");
    const at::Tensor& t = inputs[input];
    TORCH_CHECK(t.defined() && dim < t.dim(), "Graph::symbol_values: input ", input, " should have a dimension ", dim,
                " (it binds ", symbols_[k].name, "), got ",
                t.defined() ? std::to_string(t.dim()) + " dimensions" : std::string("an undefined tensor"));
    out.emplace(symbols_[k].name, t.size(dim));
  }
  return out;
}

void Graph::clear_symbols() { clear_symbols(symbol_examples()); }

void Graph::clear_symbols(const std::map<std::string, int64_t>& values) {
  for (const auto& n : nodes_) {
    for (TensorMeta& m : n->output_meta_) m.sym_sizes.clear(), m.sym_strides.clear();
    for (Argument& a : n->args_)
      if (a.is_size_expression()) a = Argument(a.constant_at([&](const std::string& s) {
                                    auto it = values.find(s);
                                    TORCH_CHECK(it != values.end(), "Graph::clear_symbols: no value for the size symbol ", s);
                                    return it->second;
                                  }));
  }
  for (const SizeSymbolDecl& s : symbols_) names_.erase(s.name);
  symbols_.clear();
}

bool Graph::has_size_expressions() const {
  for (const auto& n : nodes_)
    for (const Argument& a : n->args_)
      if (a.is_size_expression()) return true;
  return false;
}

std::vector<std::pair<size_t, int64_t>> Graph::symbol_bindings() const {
  std::vector<std::pair<size_t, int64_t>> out(symbols_.size(), {SIZE_MAX, 0});
  size_t input = 0;
  for (const auto& n : nodes_) {
    if (n->kind() != NodeKind::Placeholder) continue;
    const TensorMeta& m = n->output_meta_.at(0);
    for (size_t d = 0; d < m.sym_sizes.size(); ++d) {
      const auto s = m.sym_sizes[d].as_symbol();
      if (!s) continue;
      for (size_t k = 0; k < symbols_.size(); ++k)
        if (symbols_[k].name == *s && out[k].first == SIZE_MAX) out[k] = {input, static_cast<int64_t>(d)};
    }
    ++input;
  }
  for (size_t k = 0; k < out.size(); ++k)
    TORCH_CHECK(out[k].first != SIZE_MAX, "Graph::symbol_bindings: no placeholder dimension binds the size symbol ",
                symbols_[k].name);
  return out;
}

void Node::set_output_meta(size_t i, TensorMeta meta) {
  TORCH_CHECK(i < output_meta_.size(), "node '", name_, "' has ", output_meta_.size(), " outputs, asked to set output ",
              i);
  output_meta_[i] = std::move(meta);
}

std::string Graph::unique_name(const std::string& base_in) {
  std::string base = sanitize_name(base_in);
  if (names_.insert(base).second) return base;
  // `add_1` taken again continues from `add`, as FX does, instead of giving `add_1_1`.
  auto us = base.find_last_of('_');
  if (us != std::string::npos && us + 1 < base.size() && us > 0 &&
      std::all_of(base.begin() + us + 1, base.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    base = base.substr(0, us);
  }
  auto& count = name_counts_[base];
  while (true) {
    std::string candidate = base + "_" + std::to_string(++count);
    if (names_.insert(candidate).second) return candidate;
  }
}

std::string Graph::rename(Node* n, const std::string& name) {
  TORCH_CHECK(n && n->graph_ == this, "rename: the node does not belong to this graph");
  if (sanitize_name(name) == n->name_) return n->name_;
  std::string old = n->name_;
  n->name_ = unique_name(name);
  names_.erase(old);
  return n->name_;
}

void Graph::check_arg(const Argument& a, const Node* user) const {
  check_argument(this, a, user ? describe(user) : std::string("a new node"), nullptr);
}

void Graph::add_uses(Node* user) {
  for (size_t i = 0; i < user->args_.size(); ++i) {
    user->args_[i].for_each_value([&](const Value& v) { v.node->uses_[v.index].push_back(Use{user, i}); });
  }
}

void Graph::remove_uses(Node* user) {
  for (size_t i = 0; i < user->args_.size(); ++i) {
    user->args_[i].for_each_value([&](const Value& v) {
      auto& uses = v.node->uses_[v.index];
      auto it = std::find(uses.begin(), uses.end(), Use{user, i});
      TORCH_INTERNAL_ASSERT(it != uses.end(), "use list of '", v.node->name(), "' misses a use by '", user->name(),
                            "'");
      uses.erase(it);
    });
  }
}

Node* Graph::append(std::unique_ptr<Node> n) {
  // Where the node goes: placeholders after the last placeholder, the output node last, the
  // rest at the insert point (the end means before the output node, if there is one).
  auto pos = nodes_.end();
  if (n->kind_ == NodeKind::Placeholder) {
    pos = std::find_if(nodes_.begin(), nodes_.end(),
                       [](const std::unique_ptr<Node>& m) { return m->kind_ != NodeKind::Placeholder; });
  } else if (n->kind_ == NodeKind::Output) {
    pos = nodes_.end();
  } else if (!insert_at_end_) {
    pos = insert_point_;
  } else if (!nodes_.empty() && nodes_.back()->kind_ == NodeKind::Output) {
    pos = std::prev(nodes_.end());
  }

  // Arguments must come from nodes before `pos`.
  std::unordered_set<const Node*> after;
  for (auto it = pos; it != nodes_.end(); ++it) after.insert(it->get());
  std::string user = std::string(to_string(n->kind_)) + " node '" + n->target_ + "'";
  for (const auto& a : n->args_) check_argument(this, a, user, &after);

  n->uses_.assign(n->output_meta_.size(), {});
  Node* raw = n.get();
  nodes_.insert(pos, std::move(n));
  add_uses(raw);
  return raw;
}

Value Graph::placeholder(const std::string& name, TensorMeta meta) {
  std::unique_ptr<Node> n(new Node(this, NodeKind::Placeholder));
  n->target_ = name;
  n->output_meta_.push_back(std::move(meta));
  Node* raw = append(std::move(n));
  raw->name_ = unique_name(name);
  return raw->output(0);
}

Value Graph::get_attr(const std::string& qualified_name, TensorMeta meta) {
  TORCH_CHECK(!qualified_name.empty(), "get_attr expects a qualified attribute name, got an empty string");
  std::unique_ptr<Node> n(new Node(this, NodeKind::GetAttr));
  n->target_ = qualified_name;
  n->output_meta_.push_back(std::move(meta));
  Node* raw = append(std::move(n));
  std::string base = qualified_name;
  std::replace(base.begin(), base.end(), '.', '_');
  raw->name_ = unique_name(base);
  return raw->output(0);
}

Node* Graph::call_function(const c10::OperatorHandle& op, std::vector<Argument> args,
                           std::vector<TensorMeta> output_meta, std::vector<uint32_t> return_counts) {
  const auto& schema = op.schema();
  const std::string target = op_target_name(op);
  const auto& formals = schema.arguments();
  TORCH_CHECK(args.size() <= formals.size(), target, " expects at most ", formals.size(), " arguments, got ",
              args.size());
  for (size_t i = args.size(); i < formals.size(); ++i) {
    TORCH_CHECK(formals[i].default_value().has_value(), target, " expects argument '", formals[i].name(),
                "' (index ", i, "), which has no default; got ", args.size(), " arguments");
    args.emplace_back(*formals[i].default_value());
  }
  for (size_t i = 0; i < formals.size(); ++i) {
    const auto& type = formals[i].type();
    const Argument& a = args[i];
    if (is_tensor_type(type)) {
      TORCH_CHECK(a.is_value(), "argument '", formals[i].name(), "' of ", target, " expects a tensor value, got ",
                  a.is_list() ? "a value list" : "a constant");
    } else if (is_optional_tensor_type(type)) {
      TORCH_CHECK(a.is_value() || (a.is_constant() && a.constant().isNone()), "argument '", formals[i].name(),
                  "' of ", target, " expects a tensor value or None");
    } else if (is_tensor_list_type(type)) {
      TORCH_CHECK(a.is_list(), "argument '", formals[i].name(), "' of ", target,
                  " expects a list of tensor values");
      if (!is_optional_tensor_type(type->castRaw<c10::ListType>()->getElementType())) {
        for (const auto& v : a.list())
          TORCH_CHECK(v.has_value(), "argument '", formals[i].name(), "' of ", target,
                      " is a Tensor[] and cannot hold None");
      }
    } else {
      TORCH_CHECK(a.is_constant(), "argument '", formals[i].name(), "' of ", target, " expects a constant, got ",
                  a.is_list() ? "a value list" : "a tensor value");
    }
  }

  const auto& returns = schema.returns();
  if (return_counts.empty()) return_counts.assign(returns.size(), 1);
  TORCH_CHECK(return_counts.size() == returns.size(), target, " has ", returns.size(), " returns, got ",
              return_counts.size(), " return counts");
  size_t total = 0;
  for (size_t i = 0; i < returns.size(); ++i) {
    TORCH_CHECK(is_list_return(returns[i]) || return_counts[i] == 1, "return ", i, " of ", target,
                " is not a list and must have a count of 1, got ", return_counts[i]);
    total += return_counts[i];
  }
  TORCH_CHECK(output_meta.size() == total, target, " produces ", total, " outputs, got metadata for ",
              output_meta.size());

  std::unique_ptr<Node> n(new Node(this, NodeKind::CallFunction));
  n->target_ = target;
  n->op_ = op;
  n->args_ = std::move(args);
  n->output_meta_ = std::move(output_meta);
  n->return_counts_ = std::move(return_counts);
  Node* raw = append(std::move(n));
  raw->name_ = unique_name(op_base_name(op));
  return raw;
}

void Graph::set_target(Node* n, std::shared_ptr<const Callable> fn) {
  TORCH_CHECK(n != nullptr && n->owning_graph() == this, "set_target: expected a node of this graph");
  TORCH_CHECK(n->kind() == NodeKind::CallFunction, "set_target: expected a call_function node, got ", describe(n));
  TORCH_CHECK(fn != nullptr && fn->fn != nullptr, "set_target(", n->name(),
              "): expected a user function, got an empty one (reset_target restores the operator)");
  n->target_ = fn->name;
  n->callable_ = std::move(fn);
}

void Graph::set_target(Node* n, const std::string& name) {
  auto fn = lookup_callable(name);
  TORCH_CHECK(fn != nullptr, "set_target(", n ? n->name() : "null", "): expected the name of a callable registered ",
              "with torchcompile::register_callable, got '", name, "' (registered: ", detail::registered_callable_names(),
              ")");
  set_target(n, std::move(fn));
}

void Graph::reset_target(Node* n) {
  TORCH_CHECK(n != nullptr && n->owning_graph() == this, "reset_target: expected a node of this graph");
  TORCH_CHECK(n->kind() == NodeKind::CallFunction, "reset_target: expected a call_function node, got ", describe(n));
  n->target_ = op_target_name(n->op());
  n->callable_.reset();
}

Node* Graph::call_module(const std::string& path, std::vector<Argument> args, std::vector<TensorMeta> output_meta) {
  TORCH_CHECK(!path.empty(), "call_module expects a module path, got an empty string");
  std::unique_ptr<Node> n(new Node(this, NodeKind::CallModule));
  n->target_ = path;
  n->args_ = std::move(args);
  n->return_counts_.assign(output_meta.size(), 1);
  n->output_meta_ = std::move(output_meta);
  Node* raw = append(std::move(n));
  std::string base = path;
  std::replace(base.begin(), base.end(), '.', '_');
  raw->name_ = unique_name(base);
  return raw;
}

Node* Graph::output(std::vector<Value> outputs) {
  TORCH_CHECK(output_node() == nullptr, "the graph already has an output node");
  std::unique_ptr<Node> n(new Node(this, NodeKind::Output));
  n->target_ = "output";
  std::vector<std::optional<Value>> list(outputs.begin(), outputs.end());
  n->args_.emplace_back(std::move(list));
  Node* raw = append(std::move(n));
  raw->name_ = unique_name("output");
  return raw;
}

std::vector<Node*> Graph::placeholders() const {
  std::vector<Node*> out;
  for (const auto& n : nodes_)
    if (n->kind_ == NodeKind::Placeholder) out.push_back(n.get());
  return out;
}

Node* Graph::output_node() const {
  for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it)
    if ((*it)->kind_ == NodeKind::Output) return it->get();
  return nullptr;
}

Node* Graph::find_node(const std::string& name) const {
  if (!names_.count(name)) return nullptr;
  for (const auto& n : nodes_)
    if (n->name_ == name) return n.get();
  return nullptr;
}

void Graph::erase(Node* n) {
  TORCH_CHECK(n && n->graph_ == this, "erase: the node does not belong to this graph");
  TORCH_CHECK(!n->has_uses(), "erase: ", describe(n), " still has users");
  auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](const std::unique_ptr<Node>& m) { return m.get() == n; });
  TORCH_INTERNAL_ASSERT(it != nodes_.end(), "node '", n->name_, "' claims this graph but is not in it");
  remove_uses(n);
  if (!insert_at_end_ && insert_point_ == it) ++insert_point_;
  // The name stays reserved, as in FX, so a later node never takes over an erased node's name.
  nodes_.erase(it);
}

void Graph::replace_all_uses(Value from, Value to) {
  check_value(this, from, "replace_all_uses (from)", nullptr);
  check_value(this, to, "replace_all_uses (to)", nullptr);
  if (from == to) return;
  std::vector<Use> uses = from.node->uses_[from.index];
  if (uses.empty()) return;
  // `to` must be defined before every user of `from`.
  std::unordered_map<const Node*, size_t> position;
  size_t i = 0;
  for (const auto& n : nodes_) position[n.get()] = i++;
  for (const Use& u : uses) {
    TORCH_CHECK(position.at(to.node) < position.at(u.user), "replace_all_uses: '", to.node->name_,
                "' is not defined before its new user '", u.user->name_, "'");
  }
  for (const Use& u : uses) {
    Argument& a = u.user->args_[u.arg_index];
    if (a.kind_ == Argument::Kind::Value) {
      if (a.value_ == from) a.value_ = to;
    } else if (a.kind_ == Argument::Kind::ValueList) {
      for (auto& v : a.list_)
        if (v && *v == from) v = to;
    }
  }
  // Each use occurrence moves over once; the loop above may have rewritten several occurrences
  // of one (user, arg_index) pair, and `uses` lists each of them.
  from.node->uses_[from.index].clear();
  auto& to_uses = to.node->uses_[to.index];
  to_uses.insert(to_uses.end(), uses.begin(), uses.end());
}

void Graph::set_insert_point(Node* n) {
  if (n == nullptr) {
    insert_at_end_ = true;
    insert_point_ = nodes_.end();
    return;
  }
  TORCH_CHECK(n->graph_ == this, "set_insert_point: the node does not belong to this graph");
  auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](const std::unique_ptr<Node>& m) { return m.get() == n; });
  TORCH_INTERNAL_ASSERT(it != nodes_.end(), "node '", n->name_, "' claims this graph but is not in it");
  insert_at_end_ = false;
  insert_point_ = it;
}

bool is_tensor_type(const c10::TypePtr& t) { return t->kind() == c10::TypeKind::TensorType; }

bool is_optional_tensor_type(const c10::TypePtr& t) {
  auto opt = t->cast<c10::OptionalType>();
  return opt && is_tensor_type(opt->getElementType());
}

bool is_tensor_list_type(const c10::TypePtr& t) {
  auto list = t->cast<c10::ListType>();
  if (!list) return false;
  const auto& e = list->getElementType();
  return is_tensor_type(e) || is_optional_tensor_type(e);
}

}  // namespace torchcompile::ir
