// Printers for the graph IR: FX's tabular view, a code-like listing and the round-trip text.
#include <torchcompile/ir/printer.h>

#include "text_internal.h"

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>

namespace torchcompile::ir {

namespace {

// The shortest "%.Ng" that reads back as the same double, always with a '.' or an exponent so
// the parser sees a float, not an int (Python's repr does the same: `1.0`, `1e-05`).
std::string double_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string string_repr(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\'': out += "\\'"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default: out += c;
    }
  }
  return out + "'";
}

std::string tuple_repr(const std::vector<std::string>& items) {
  if (items.size() == 1) return "(" + items[0] + ",)";
  std::string s = "(";
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + items[i];
  return s + ")";
}

template <typename E>
std::string enum_repr(int64_t v, const std::vector<std::pair<E, const char*>>& names) {
  for (const auto& [e, name] : names)
    if (static_cast<int64_t>(e) == v) return std::string("torch.") + name;
  return std::to_string(v);
}

// Dtypes, layouts and memory formats travel as ints in IValues; the schema's real type says
// which one an int stands for.
std::string typed_repr(const c10::IValue& v, const c10::TypePtr& real_type) {
  c10::TypePtr t = real_type;
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  if (v.isInt()) {
    switch (t->kind()) {
      case c10::TypeKind::ScalarTypeType: return enum_repr(v.toInt(), detail::dtype_names());
      case c10::TypeKind::LayoutType: return enum_repr(v.toInt(), detail::layout_names());
      case c10::TypeKind::MemoryFormatType: return enum_repr(v.toInt(), detail::memory_format_names());
      default: break;
    }
  }
  return constant_repr(v);
}

// How an argument prints: `%` before value names in the text format, nothing elsewhere.
std::string value_repr(const Value& v, const char* prefix) {
  std::string s = prefix + v.node->name();
  if (v.node->num_outputs() != 1) s += "." + std::to_string(v.index);
  return s;
}

// A size expression: `s0`, `[s0, -1]`, `[s0*8, s1, 64]` (FX prints its symbolic ints so). The
// text format marks symbols as references: `%s0`, `%(8*s0)`.
std::string size_expression_repr(const Argument& a, const char* prefix) {
  auto one = [&](const SymExpr& e) -> std::string {
    if (e.is_constant() || prefix[0] == '\0') return e.str();
    if (e.as_symbol()) return prefix + e.str();
    return std::string(prefix) + "(" + e.str() + ")";
  };
  if (a.constant().isInt()) return one(a.sym_ints().at(0));
  std::string s = "[";
  for (size_t i = 0; i < a.sym_ints().size(); ++i) s += (i ? ", " : "") + one(a.sym_ints()[i]);
  return s + "]";
}

std::string arg_repr(const Argument& a, const c10::TypePtr& real_type, const char* prefix) {
  switch (a.kind()) {
    case Argument::Kind::Value: return value_repr(a.value(), prefix);
    case Argument::Kind::ValueList: {
      std::string s = "[";
      for (size_t i = 0; i < a.list().size(); ++i) {
        if (i) s += ", ";
        s += a.list()[i] ? value_repr(*a.list()[i], prefix) : "None";
      }
      return s + "]";
    }
    case Argument::Kind::Constant:
      if (a.is_size_expression()) return size_expression_repr(a, prefix);
      return real_type ? typed_repr(a.constant(), real_type) : constant_repr(a.constant());
  }
  TORCH_INTERNAL_ASSERT(false, "unknown argument kind");
}

bool is_default(const Argument& a, const c10::Argument& formal) {
  if (!formal.default_value() || !a.is_constant() || a.is_size_expression()) return false;
  return typed_repr(a.constant(), formal.real_type()) == typed_repr(*formal.default_value(), formal.real_type());
}

// A node's arguments as printed: positional ones (trailing defaults dropped) and keyword ones
// (keyword-only arguments that differ from their defaults), as {name, repr} pairs.
struct PrintedArgs {
  std::vector<std::string> positional;
  std::vector<std::pair<std::string, std::string>> keyword;
};

PrintedArgs printed_args(const Node& n, const char* prefix) {
  PrintedArgs out;
  if (n.kind() == NodeKind::CallFunction) {
    const auto& formals = n.schema().arguments();
    size_t last_positional = 0;  // one past the last positional argument to print
    for (size_t i = 0; i < formals.size(); ++i) {
      if (!formals[i].kwarg_only() && !is_default(n.args()[i], formals[i])) last_positional = i + 1;
    }
    for (size_t i = 0; i < formals.size(); ++i) {
      if (formals[i].kwarg_only()) {
        if (!is_default(n.args()[i], formals[i]))
          out.keyword.emplace_back(formals[i].name(), arg_repr(n.args()[i], formals[i].real_type(), prefix));
      } else if (i < last_positional) {
        out.positional.push_back(arg_repr(n.args()[i], formals[i].real_type(), prefix));
      }
    }
    return out;
  }
  for (const auto& a : n.args()) out.positional.push_back(arg_repr(a, nullptr, prefix));
  return out;
}

// `aten.add.Tensor` / `aten.cos.default`, as AOT-traced FX graphs print their targets.
// A user function prints by its name.
std::string fx_target(const Node& n) {
  if (n.kind() != NodeKind::CallFunction || n.callable()) return n.target();
  const auto& name = n.op().operator_name();
  std::string s = name.name;
  auto pos = s.find("::");
  if (pos != std::string::npos) s.replace(pos, 2, ".");
  return s + "." + (name.overload_name.empty() ? std::string("default") : name.overload_name);
}

// The metadata of a node's outputs: bare for one output, `[...]` for a list return, `(...)`
// around several returns.
std::string meta_repr(const Node& n) {
  const auto& metas = n.output_meta();
  if (n.kind() != NodeKind::CallFunction) {
    if (metas.size() == 1) return metas[0].str();
    std::vector<std::string> items;
    for (const auto& m : metas) items.push_back(m.str());
    return tuple_repr(items);
  }
  const auto& returns = n.schema().returns();
  std::vector<std::string> items;
  size_t k = 0;
  for (size_t r = 0; r < returns.size(); ++r) {
    if (returns[r].type()->kind() == c10::TypeKind::ListType) {
      std::string s = "[";
      for (uint32_t j = 0; j < n.return_counts()[r]; ++j) s += (j ? ", " : "") + metas[k++].str();
      items.push_back(s + "]");
    } else {
      items.push_back(metas[k++].str());
    }
  }
  if (items.size() == 1) return items[0];
  return tuple_repr(items);
}

std::string output_tuple(const Node& out, const char* prefix) {
  std::vector<std::string> items;
  for (const auto& v : out.args().at(0).list()) items.push_back(v ? value_repr(*v, prefix) : "None");
  return tuple_repr(items);
}

}  // namespace

std::string constant_repr(const c10::IValue& v) {
  if (v.isNone()) return "None";
  if (v.isBool()) return v.toBool() ? "True" : "False";
  if (v.isInt()) return std::to_string(v.toInt());
  if (v.isDouble()) return double_repr(v.toDouble());
  if (v.isComplexDouble()) {
    auto c = v.toComplexDouble();
    return "complex(" + double_repr(c.real()) + ", " + double_repr(c.imag()) + ")";
  }
  if (v.isString()) return string_repr(v.toStringRef());
  if (v.isIntList()) {
    std::string s = "[";
    auto l = v.toIntList();
    for (size_t i = 0; i < l.size(); ++i) s += (i ? ", " : "") + std::to_string(l.get(i));
    return s + "]";
  }
  if (v.isDoubleList()) {
    std::string s = "[";
    auto l = v.toDoubleList();
    for (size_t i = 0; i < l.size(); ++i) s += (i ? ", " : "") + double_repr(l.get(i));
    return s + "]";
  }
  if (v.isBoolList()) {
    std::string s = "[";
    auto l = v.toBoolList();
    for (size_t i = 0; i < l.size(); ++i) s += std::string(i ? ", " : "") + (l.get(i) ? "True" : "False");
    return s + "]";
  }
  if (v.isList()) {
    std::string s = "[";
    auto l = v.toListRef();
    for (size_t i = 0; i < l.size(); ++i) s += (i ? ", " : "") + constant_repr(l[i]);
    return s + "]";
  }
  if (v.isTuple()) {
    std::vector<std::string> items;
    for (const auto& e : v.toTupleRef().elements()) items.push_back(constant_repr(e));
    return tuple_repr(items);
  }
  if (v.isDevice()) {
    auto d = v.toDevice();
    std::string s = "device(type='" + c10::DeviceTypeName(d.type(), /*lower_case=*/true) + "'";
    if (d.has_index()) s += ", index=" + std::to_string(d.index());
    return s + ")";
  }
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    return "<tensor " + TensorMeta::of(t).str() + ">";
  }
  return "<" + std::string(v.tagKind()) + ">";
}

void print_tabular(const Graph& g, std::ostream& os) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"opcode", "name", "target", "args", "kwargs"});
  for (const SizeSymbolDecl& sym : g.symbols()) rows.push_back({"placeholder", sym.name, sym.name, "()", "{}"});
  for (const auto& np : g.nodes()) {
    const Node& n = *np;
    std::string args, kwargs = "{}";
    if (n.kind() == NodeKind::Output) {
      args = "(" + output_tuple(n, "") + ",)";
    } else {
      auto printed = printed_args(n, "");
      args = tuple_repr(printed.positional);
      if (!printed.keyword.empty()) {
        kwargs = "{";
        for (size_t i = 0; i < printed.keyword.size(); ++i)
          kwargs += (i ? ", '" : "'") + printed.keyword[i].first + "': " + printed.keyword[i].second;
        kwargs += "}";
      }
    }
    rows.push_back({to_string(n.kind()), n.name(), fx_target(n), args, kwargs});
  }
  // tabulate's "simple" format: a column is as wide as its widest cell, and at least two wider
  // than its header.
  std::vector<size_t> widths(5);
  for (size_t c = 0; c < 5; ++c) {
    widths[c] = rows[0][c].size() + 2;
    for (const auto& r : rows) widths[c] = std::max(widths[c], r[c].size());
  }
  auto emit = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t c = 0; c < 5; ++c) {
      if (c) line += "  ";
      line += cells[c];
      line.append(widths[c] - cells[c].size(), ' ');
    }
    line.erase(line.find_last_not_of(' ') + 1);
    os << line << "\n";
  };
  emit(rows[0]);
  std::vector<std::string> rule;
  for (size_t c = 0; c < 5; ++c) rule.emplace_back(widths[c], '-');
  emit(rule);
  for (size_t i = 1; i < rows.size(); ++i) emit(rows[i]);
}

std::string tabular_string(const Graph& g) {
  std::ostringstream os;
  print_tabular(g, os);
  return os.str();
}

void print_readable(const Graph& g, std::ostream& os) {
  os << "def forward(self";
  for (const SizeSymbolDecl& sym : g.symbols()) os << ", " << sym.name << ": Sym";
  for (Node* p : g.placeholders()) os << ", " << p->name() << ": " << p->output_meta().at(0).str();
  os << "):\n";
  for (const auto& np : g.nodes()) {
    const Node& n = *np;
    std::string line;
    switch (n.kind()) {
      case NodeKind::Placeholder: continue;
      case NodeKind::Output: os << "    return " << output_tuple(n, "") << "\n"; continue;
      case NodeKind::GetAttr: line = n.name() + " = self." + n.target(); break;
      case NodeKind::CallFunction:
      case NodeKind::CallModule: {
        auto printed = printed_args(n, "");
        line = n.name() + " = " + (n.kind() == NodeKind::CallModule ? "self." : "") + n.target() + "(";
        bool first = true;
        for (const auto& a : printed.positional) {
          line += (first ? "" : ", ") + a;
          first = false;
        }
        for (const auto& [k, v] : printed.keyword) {
          line += (first ? "" : ", ") + k + "=" + v;
          first = false;
        }
        line += ")";
        break;
      }
    }
    line += "  # " + meta_repr(n);
    if (!n.module_path().empty()) line += "  module: " + n.module_path();
    os << "    " << line << "\n";
  }
}

std::string to_text(const Graph& g) {
  std::ostringstream os;
  os << g;
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Graph& g) {
  os << "graph():\n";
  for (const SizeSymbolDecl& sym : g.symbols()) {
    os << "  %" << sym.name << " : Sym(" << sym.example << ", [" << sym.min << ", "
       << (sym.max == std::numeric_limits<int64_t>::max() ? std::string("inf") : std::to_string(sym.max))
       << "]) = placeholder[target=" << sym.name << "]\n";
  }
  for (const auto& np : g.nodes()) {
    const Node& n = *np;
    if (n.kind() == NodeKind::Output) {
      os << "  return " << output_tuple(n, "%") << "\n";
      continue;
    }
    os << "  %" << n.name() << " : " << meta_repr(n) << " = " << to_string(n.kind()) << "[target=" << n.target();
    if (n.callable()) os << ", op=" << op_target_name(n.op());
    os << "]";
    if (n.kind() == NodeKind::CallFunction || n.kind() == NodeKind::CallModule) {
      auto printed = printed_args(n, "%");
      os << "(args = " << tuple_repr(printed.positional) << ", kwargs = {";
      for (size_t i = 0; i < printed.keyword.size(); ++i)
        os << (i ? ", " : "") << printed.keyword[i].first << ": " << printed.keyword[i].second;
      os << "})";
    }
    if (!n.module_path().empty()) os << "  # module: " << n.module_path();
    os << "\n";
  }
  return os;
}

}  // namespace torchcompile::ir
