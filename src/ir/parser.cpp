// Reader for the text format printed by to_text(): a small recursive-descent parser over one
// line at a time. Constants are read generically (Python-like literals) and then converted to
// the type the operator's schema asks for.
#include <torchcompile/ir/callable.h>
#include <torchcompile/ir/parser.h>

#include "text_internal.h"

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

#include <cctype>
#include <cerrno>
#include <complex>
#include <cstdlib>
#include <map>
#include <sstream>
#include <unordered_map>

namespace torchcompile::ir {

namespace {

// A literal or reference as written, before it meets a schema type.
struct Expr {
  // SizeExpr: `%(2*s0 + 1)`, a size expression (a symbol alone is written as a Ref, `%s0`).
  enum class Kind { None, Bool, Int, Double, Complex, String, Ref, List, Tuple, Enum, Device, SizeExpr };
  Kind kind = Kind::None;
  bool b = false;
  int64_t i = 0;
  double d = 0;
  std::complex<double> c;
  std::string s;  // string value, referenced node name, or enum name (`float32`)
  uint32_t index = 0;
  bool has_index = false;
  std::vector<Expr> items;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  std::string text;  // the source text, for error messages
};

// One metadata entry of a node's type: a single TensorMeta or a `[...]` list of them.
struct MetaItem {
  bool is_list = false;
  std::vector<TensorMeta> metas;
};

[[noreturn]] void fail_at(int line, const std::string& msg) {
  TORCH_CHECK(false, "parse_graph: line ", line, ": ", msg);
}

class LineParser {
 public:
  /// `symbols`: the example values of the graph's size symbols declared so far (may be null).
  LineParser(const std::string& s, int line, const std::map<std::string, int64_t>* symbols = nullptr)
      : s_(s), line_(line), symbols_(symbols) {}

  [[noreturn]] void fail(const std::string& expected) const {
    std::string rest = s_.substr(pos_, 40);
    fail_at(line_, "expected " + expected + ", got " + (rest.empty() ? std::string("end of line") : "'" + rest + "'"));
  }

  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\r')) ++pos_;
  }
  bool at_end() {
    skip_ws();
    return pos_ >= s_.size();
  }
  char peek() {
    skip_ws();
    return pos_ < s_.size() ? s_[pos_] : '\0';
  }
  bool consume(const std::string& tok) {
    skip_ws();
    if (s_.compare(pos_, tok.size(), tok) == 0) {
      pos_ += tok.size();
      return true;
    }
    return false;
  }
  void expect(const std::string& tok) {
    if (!consume(tok)) fail("'" + tok + "'");
  }
  bool at_ident_start() {
    char c = peek();
    return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
  }
  std::string ident(const char* what = "a name") {
    skip_ws();
    size_t start = pos_;
    if (pos_ < s_.size() && (std::isalpha(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) {
      while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
    }
    if (start == pos_) fail(what);
    return s_.substr(start, pos_ - start);
  }
  // Everything up to (not including) `stop`.
  std::string until(char stop, const char* what) {
    skip_ws();
    size_t end = s_.find(stop, pos_);
    if (end == std::string::npos) fail(what);
    std::string out = s_.substr(pos_, end - pos_);
    pos_ = end;
    return out;
  }
  std::string rest() {
    skip_ws();
    std::string out = s_.substr(pos_);
    pos_ = s_.size();
    while (!out.empty() && std::isspace(static_cast<unsigned char>(out.back()))) out.pop_back();
    return out;
  }
  int line() const { return line_; }

  // ---- metadata: `f32[2, 3]{3, 1} cuda:0 rg`, `undef`, `[m, m]`, `(m, [m, m])`

  TensorMeta tensor_meta() {
    TensorMeta m;
    std::string dtype = ident("a tensor type like 'f32[2, 3]{3, 1}'");
    if (dtype == "undef") {
      m.defined = false;
      return m;
    }
    m.dtype = parse_short_dtype(dtype);
    expect("[");
    std::vector<SymExpr> sizes = sym_list(']');
    expect("{");
    std::vector<SymExpr> strides = sym_list('}');
    bool symbolic = false;
    for (const auto* list : {&sizes, &strides})
      for (const SymExpr& e : *list) symbolic = symbolic || !e.is_constant();
    // Sizes of symbols: their values for the symbols' example values.
    auto value_of = [&](const SymExpr& e) {
      return e.evaluate([&](const std::string& name) -> int64_t {
        auto it = symbols_ ? symbols_->find(name) : decltype(symbols_->end()){};
        if (!symbols_ || it == symbols_->end())
          fail_at(line_, "symbol '" + name + "' in a tensor type is not declared (a '%" + name +
                             " : Sym(...)' line before the placeholders)");
        return it->second;
      });
    };
    for (const SymExpr& e : sizes) m.sizes.push_back(value_of(e));
    for (const SymExpr& e : strides) m.strides.push_back(value_of(e));
    if (symbolic) {
      m.sym_sizes = std::move(sizes);
      m.sym_strides = std::move(strides);
    }
    skip_ws();
    // An optional device (`cuda:0`) and `rg`.
    while (at_ident_start()) {
      size_t save = pos_;
      std::string word = ident();
      if (word == "rg") {
        m.requires_grad = true;
        continue;
      }
      if (consume(":")) {
        skip_ws();
        size_t start = pos_;
        while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
        word += ":" + s_.substr(start, pos_ - start);
      }
      try {
        m.device = c10::Device(word);
      } catch (const c10::Error&) {
        pos_ = save;
        fail("a device like 'cuda:0' or 'rg'");
      }
    }
    return m;
  }

  MetaItem meta_item() {
    MetaItem item;
    if (consume("[")) {
      item.is_list = true;
      if (!consume("]")) {
        do {
          item.metas.push_back(tensor_meta());
        } while (consume(","));
        expect("]");
      }
      return item;
    }
    item.metas.push_back(tensor_meta());
    return item;
  }

  // Returns the items and whether they were written as a `(...)` tuple.
  std::vector<MetaItem> node_meta(bool* is_tuple) {
    *is_tuple = false;
    if (!consume("(")) return {meta_item()};
    *is_tuple = true;
    std::vector<MetaItem> items;
    while (!consume(")")) {
      items.push_back(meta_item());
      if (!consume(",")) {
        expect(")");
        break;
      }
    }
    return items;
  }

  // ---- expressions

  Expr expr() {
    skip_ws();
    size_t start = pos_;
    Expr e = expr_inner();
    e.text = s_.substr(start, pos_ - start);
    return e;
  }

 private:
  // A `[...]` or `{...}` list of sizes or strides: integers, or expressions of size symbols.
  std::vector<SymExpr> sym_list(char close) {
    std::vector<SymExpr> out;
    if (consume(std::string(1, close))) return out;
    while (true) {
      skip_ws();
      const size_t start = pos_;
      int depth = 0;
      while (pos_ < s_.size()) {
        const char c = s_[pos_];
        if (c == '(') ++depth;
        if (c == ')') --depth;
        if (depth == 0 && (c == ',' || c == close)) break;
        const bool in_expression = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ' ' ||
                                   c == '+' || c == '-' || c == '*' || c == '/' || c == '(' || c == ')';
        if (!in_expression) fail("'" + std::string(1, close) + "'");
        ++pos_;
      }
      if (pos_ >= s_.size()) fail("'" + std::string(1, close) + "' closing a tensor type's sizes or strides");
      const std::string text = s_.substr(start, pos_ - start);
      try {
        out.push_back(SymExpr::parse(text));
      } catch (const c10::Error&) {
        fail_at(line_, "expected an integer or an expression of size symbols (s0, 2*s0 + 1, s0//2) in a tensor "
                       "type, got '" + text + "'");
      }
      if (s_[pos_++] == close) return out;
    }
  }

  std::vector<int64_t> int_list(char close) {
    std::vector<int64_t> out;
    if (consume(std::string(1, close))) return out;
    do {
      Expr e = expr();
      if (e.kind != Expr::Kind::Int) fail_at(line_, "expected an integer in a tensor type, got '" + e.text + "'");
      out.push_back(e.i);
    } while (consume(","));
    expect(std::string(1, close));
    return out;
  }

  c10::ScalarType parse_short_dtype(const std::string& name) {
    for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
      auto t = static_cast<c10::ScalarType>(i);
      const char* short_name = detail::dtype_short_name(t);
      if ((short_name && name == short_name) || name == c10::toString(t)) return t;
    }
    fail_at(line_, "expected a dtype like 'f32' in a tensor type, got '" + name + "'");
  }

  std::vector<Expr> sequence(char close) {
    std::vector<Expr> items;
    while (!consume(std::string(1, close))) {
      items.push_back(expr());
      if (!consume(",")) {
        expect(std::string(1, close));
        break;
      }
    }
    return items;
  }

  Expr number() {
    Expr e;
    const char* begin = s_.c_str() + pos_;
    size_t len = 0;
    bool is_float = false;
    if (begin[len] == '-' || begin[len] == '+') ++len;
    if (s_.compare(pos_ + len, 3, "inf") == 0 || s_.compare(pos_ + len, 3, "nan") == 0) {
      is_float = true;
      len += 3;
    } else {
      while (std::isdigit(static_cast<unsigned char>(begin[len]))) ++len;
      if (begin[len] == '.') {
        is_float = true;
        ++len;
        while (std::isdigit(static_cast<unsigned char>(begin[len]))) ++len;
      }
      if (begin[len] == 'e' || begin[len] == 'E') {
        is_float = true;
        ++len;
        if (begin[len] == '-' || begin[len] == '+') ++len;
        while (std::isdigit(static_cast<unsigned char>(begin[len]))) ++len;
      }
    }
    std::string tok(begin, len);
    errno = 0;
    char* end = nullptr;
    if (is_float) {
      e.kind = Expr::Kind::Double;
      e.d = std::strtod(tok.c_str(), &end);
    } else {
      e.kind = Expr::Kind::Int;
      e.i = std::strtoll(tok.c_str(), &end, 10);
    }
    if (tok.empty() || end != tok.c_str() + tok.size() || errno == ERANGE) fail("a number");
    pos_ += len;
    return e;
  }

  Expr string_literal() {
    Expr e;
    e.kind = Expr::Kind::String;
    char quote = s_[pos_++];
    while (true) {
      if (pos_ >= s_.size()) fail("a closing quote");
      char c = s_[pos_++];
      if (c == quote) break;
      if (c == '\\' && pos_ < s_.size()) {
        char n = s_[pos_++];
        switch (n) {
          case 'n': e.s += '\n'; break;
          case 't': e.s += '\t'; break;
          case 'r': e.s += '\r'; break;
          default: e.s += n;
        }
      } else {
        e.s += c;
      }
    }
    return e;
  }

  Expr expr_inner() {
    char c = peek();
    Expr e;
    if (c == '%' && pos_ + 1 < s_.size() && s_[pos_ + 1] == '(') {
      // `%(s0*8)`: the expression up to the matching parenthesis.
      pos_ += 2;
      const size_t start = pos_;
      int depth = 1;
      while (pos_ < s_.size() && depth > 0) {
        if (s_[pos_] == '(') ++depth;
        if (s_[pos_] == ')') --depth;
        ++pos_;
      }
      if (depth != 0) fail("')' closing a size expression '%('");
      e.kind = Expr::Kind::SizeExpr;
      e.s = s_.substr(start, pos_ - 1 - start);
      return e;
    }
    if (c == '%') {
      ++pos_;
      e.kind = Expr::Kind::Ref;
      e.s = ident("a node name after '%'");
      if (pos_ + 1 < s_.size() && s_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(s_[pos_ + 1]))) {
        ++pos_;
        Expr idx = number();
        if (idx.kind != Expr::Kind::Int || idx.i < 0) fail("an output index");
        e.index = static_cast<uint32_t>(idx.i);
        e.has_index = true;
      }
      return e;
    }
    if (c == '[') {
      ++pos_;
      e.kind = Expr::Kind::List;
      e.items = sequence(']');
      return e;
    }
    if (c == '(') {
      // `()`, `(x,)` and `(a, b)` are tuples; `(x)` is just x.
      ++pos_;
      e.kind = Expr::Kind::Tuple;
      if (consume(")")) return e;
      e.items.push_back(expr());
      if (consume(")")) return e.items[0];
      expect(",");
      auto more = sequence(')');
      e.items.insert(e.items.end(), more.begin(), more.end());
      return e;
    }
    if (c == '\'' || c == '"') return string_literal();
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+' || c == '.') return number();
    if (!at_ident_start()) fail("a value");
    size_t save = pos_;
    std::string word = ident();
    if (word == "None") return e;
    if (word == "True" || word == "False") {
      e.kind = Expr::Kind::Bool;
      e.b = word == "True";
      return e;
    }
    if (word == "inf" || word == "nan") {
      pos_ = save;
      return number();
    }
    if (word == "torch") {
      expect(".");
      e.kind = Expr::Kind::Enum;
      e.s = ident("a name after 'torch.'");
      return e;
    }
    if (word == "device") {
      // device(type='cuda', index=0), device('cuda:0')
      expect("(");
      std::string type;
      int64_t index = -1;
      while (!consume(")")) {
        std::string key;
        if (at_ident_start()) {
          key = ident();
          expect("=");
        }
        Expr v = expr();
        if ((key.empty() || key == "type") && v.kind == Expr::Kind::String) {
          type = v.s;
        } else if (key == "index" && v.kind == Expr::Kind::Int) {
          index = v.i;
        } else {
          fail_at(line_, "expected device(type='cpu', index=0), got '" + v.text + "' in it");
        }
        if (!consume(",")) {
          expect(")");
          break;
        }
      }
      try {
        e.device = c10::Device(type);
        if (index >= 0) e.device = c10::Device(e.device.type(), static_cast<c10::DeviceIndex>(index));
      } catch (const c10::Error&) {
        fail_at(line_, "expected a device type like 'cpu' or 'cuda', got '" + type + "'");
      }
      e.kind = Expr::Kind::Device;
      return e;
    }
    if (word == "complex") {
      expect("(");
      Expr re = expr();
      expect(",");
      Expr im = expr();
      expect(")");
      auto as_double = [&](const Expr& x) {
        if (x.kind == Expr::Kind::Double) return x.d;
        if (x.kind == Expr::Kind::Int) return static_cast<double>(x.i);
        fail_at(line_, "expected a number in complex(...), got '" + x.text + "'");
      };
      e.kind = Expr::Kind::Complex;
      e.c = {as_double(re), as_double(im)};
      return e;
    }
    pos_ = save;
    fail("a value (a number, True/False/None, a string, a list, torch.<name>, device(...) or %node)");
  }

  const std::string& s_;
  size_t pos_ = 0;
  int line_;
  const std::map<std::string, int64_t>* symbols_ = nullptr;
};

template <typename E>
std::optional<int64_t> lookup_enum(const std::string& name, const std::vector<std::pair<E, const char*>>& names) {
  for (const auto& [e, n] : names)
    if (name == n) return static_cast<int64_t>(e);
  return std::nullopt;
}

class GraphParser {
 public:
  std::unique_ptr<Graph> parse(const std::string& text) {
    graph_ = std::make_unique<Graph>();
    std::istringstream in(text);
    std::string line;
    int lineno = 0;
    bool seen_header = false, seen_return = false, seen_non_placeholder = false;
    while (std::getline(in, line)) {
      ++lineno;
      LineParser p(line, lineno, &symbol_values_);
      if (p.at_end()) continue;
      if (!seen_header) {
        p.expect("graph");
        p.expect("(");
        p.expect(")");
        p.expect(":");
        if (!p.at_end()) p.fail("end of line after 'graph():'");
        seen_header = true;
        continue;
      }
      if (seen_return) fail_at(lineno, "expected nothing after the return line, got '" + p.rest() + "'");
      try {
        if (p.consume("return")) {
          parse_return(p);
          seen_return = true;
        } else {
          bool is_placeholder = parse_node(p);
          if (is_placeholder && seen_non_placeholder)
            fail_at(lineno, "expected placeholders before all other nodes");
          if (!is_placeholder) seen_non_placeholder = true;
        }
      } catch (const c10::Error& e) {
        std::string msg = e.what_without_backtrace();
        if (msg.rfind("parse_graph: line ", 0) == 0) throw;
        fail_at(lineno, msg);
      }
    }
    if (!seen_header) fail_at(lineno, "expected 'graph():', got an empty text");
    return std::move(graph_);
  }

 private:
  Value resolve(const Expr& e, int line) {
    if (e.kind != Expr::Kind::Ref) fail_at(line, "expected a node reference like %x, got '" + e.text + "'");
    auto it = nodes_.find(e.s);
    if (it == nodes_.end()) fail_at(line, "'%" + e.s + "' is not defined before its use");
    Node* n = it->second;
    if (e.index >= n->num_outputs())
      fail_at(line, "'" + e.text + "' refers to output " + std::to_string(e.index) + " but '%" + e.s + "' has " +
                        std::to_string(n->num_outputs()) + " outputs");
    if (!e.has_index && n->num_outputs() != 1)
      fail_at(line, "expected '%" + e.s + ".<i>' for a node with " + std::to_string(n->num_outputs()) +
                        " outputs, got '" + e.text + "'");
    return Value{n, e.index};
  }

  // A constant of no known type (call_module arguments).
  c10::IValue generic(const Expr& e, int line) {
    switch (e.kind) {
      case Expr::Kind::None: return c10::IValue();
      case Expr::Kind::Bool: return e.b;
      case Expr::Kind::Int: return e.i;
      case Expr::Kind::Double: return e.d;
      case Expr::Kind::Complex: return c10::complex<double>(e.c.real(), e.c.imag());
      case Expr::Kind::String: return e.s;
      case Expr::Kind::Device: return e.device;
      case Expr::Kind::Enum: {
        if (auto v = lookup_enum(e.s, detail::dtype_names())) return *v;
        if (auto v = lookup_enum(e.s, detail::layout_names())) return *v;
        if (auto v = lookup_enum(e.s, detail::memory_format_names())) return *v;
        fail_at(line, "expected a dtype, layout or memory format after 'torch.', got '" + e.text + "'");
      }
      case Expr::Kind::Tuple: {
        std::vector<c10::IValue> items;
        for (const auto& x : e.items) items.push_back(generic(x, line));
        return c10::ivalue::Tuple::create(std::move(items));
      }
      case Expr::Kind::List: {
        auto all = [&](Expr::Kind k) {
          for (const auto& x : e.items)
            if (x.kind != k) return false;
          return true;
        };
        if (all(Expr::Kind::Int)) {
          c10::List<int64_t> l;
          for (const auto& x : e.items) l.push_back(x.i);
          return l;
        }
        if (all(Expr::Kind::Double)) {
          c10::List<double> l;
          for (const auto& x : e.items) l.push_back(x.d);
          return l;
        }
        if (all(Expr::Kind::Bool)) {
          c10::List<bool> l;
          for (const auto& x : e.items) l.push_back(x.b);
          return l;
        }
        c10::impl::GenericList l(c10::AnyType::get());
        for (const auto& x : e.items) l.push_back(generic(x, line));
        return l;
      }
      case Expr::Kind::Ref:
      case Expr::Kind::SizeExpr: break;
    }
    fail_at(line, "expected a constant, got '" + e.text + "'");
  }

  // A constant converted to the schema type `t` (the argument's real type, so dtypes, layouts
  // and memory formats are known by name).
  c10::IValue typed(const Expr& e, const c10::TypePtr& t, const std::string& what, int line, int64_t n = -1) {
    auto mismatch = [&]() -> c10::IValue {
      fail_at(line, what + " expects " + t->annotation_str() + ", got '" + e.text + "'");
    };
    if (auto opt = t->cast<c10::OptionalType>()) {
      if (e.kind == Expr::Kind::None) return c10::IValue();
      return typed(e, opt->getElementType(), what, line, n);
    }
    switch (t->kind()) {
      case c10::TypeKind::IntType:
      case c10::TypeKind::SymIntType:
        if (e.kind == Expr::Kind::Int) return e.i;
        return mismatch();
      case c10::TypeKind::FloatType:
        if (e.kind == Expr::Kind::Double) return e.d;
        if (e.kind == Expr::Kind::Int) return static_cast<double>(e.i);
        return mismatch();
      case c10::TypeKind::BoolType:
        if (e.kind == Expr::Kind::Bool) return e.b;
        return mismatch();
      case c10::TypeKind::NumberType:
        if (e.kind == Expr::Kind::Int || e.kind == Expr::Kind::Double || e.kind == Expr::Kind::Bool ||
            e.kind == Expr::Kind::Complex)
          return generic(e, line);
        return mismatch();
      case c10::TypeKind::ComplexType:
        if (e.kind == Expr::Kind::Complex) return c10::complex<double>(e.c.real(), e.c.imag());
        if (e.kind == Expr::Kind::Double) return c10::complex<double>(e.d, 0);
        if (e.kind == Expr::Kind::Int) return c10::complex<double>(static_cast<double>(e.i), 0);
        return mismatch();
      case c10::TypeKind::StringType:
        if (e.kind == Expr::Kind::String) return e.s;
        return mismatch();
      case c10::TypeKind::DeviceObjType:
        if (e.kind == Expr::Kind::Device) return e.device;
        if (e.kind == Expr::Kind::String) {
          try {
            return c10::Device(e.s);
          } catch (const c10::Error&) {
          }
        }
        return mismatch();
      case c10::TypeKind::ScalarTypeType:
      case c10::TypeKind::LayoutType:
      case c10::TypeKind::MemoryFormatType: {
        if (e.kind == Expr::Kind::Int) return e.i;
        if (e.kind != Expr::Kind::Enum) return mismatch();
        std::optional<int64_t> v;
        if (t->kind() == c10::TypeKind::ScalarTypeType) v = lookup_enum(e.s, detail::dtype_names());
        if (t->kind() == c10::TypeKind::LayoutType) v = lookup_enum(e.s, detail::layout_names());
        if (t->kind() == c10::TypeKind::MemoryFormatType) v = lookup_enum(e.s, detail::memory_format_names());
        if (!v) return mismatch();
        return *v;
      }
      case c10::TypeKind::ListType: {
        const auto& elem = t->castRaw<c10::ListType>()->getElementType();
        std::vector<Expr> items;
        if (e.kind == Expr::Kind::List || e.kind == Expr::Kind::Tuple) {
          items = e.items;
        } else if (n > 0 && (e.kind == Expr::Kind::Int || e.kind == Expr::Kind::Double || e.kind == Expr::Kind::Bool)) {
          // `int[2] stride=1` means [1, 1], as in schemas.
          items.assign(static_cast<size_t>(n), e);
        } else {
          return mismatch();
        }
        auto kind = elem->kind();
        if (kind == c10::TypeKind::IntType || kind == c10::TypeKind::SymIntType) {
          c10::List<int64_t> l;
          for (const auto& x : items) l.push_back(typed(x, elem, what, line).toInt());
          return l;
        }
        if (kind == c10::TypeKind::FloatType) {
          c10::List<double> l;
          for (const auto& x : items) l.push_back(typed(x, elem, what, line).toDouble());
          return l;
        }
        if (kind == c10::TypeKind::BoolType) {
          c10::List<bool> l;
          for (const auto& x : items) l.push_back(typed(x, elem, what, line).toBool());
          return l;
        }
        c10::impl::GenericList l(elem);
        for (const auto& x : items) l.push_back(typed(x, elem, what, line));
        return l;
      }
      case c10::TypeKind::TupleType: {
        const auto& elems = t->castRaw<c10::TupleType>()->elements();
        if ((e.kind != Expr::Kind::Tuple && e.kind != Expr::Kind::List) || e.items.size() != elems.size())
          return mismatch();
        std::vector<c10::IValue> items;
        for (size_t i = 0; i < elems.size(); ++i) items.push_back(typed(e.items[i], elems[i], what, line));
        return c10::ivalue::Tuple::create(std::move(items));
      }
      default:
        if (e.kind == Expr::Kind::Ref) return mismatch();
        return generic(e, line);
    }
  }

  Argument to_argument(const Expr& e, const c10::Argument& formal, const std::string& target, int line) {
    const c10::TypePtr& t = formal.type();
    std::string what = "argument '" + formal.name() + "' of " + target;
    auto is_tensor = [](const c10::TypePtr& x) { return x->kind() == c10::TypeKind::TensorType; };
    auto opt_elem = [](const c10::TypePtr& x) -> c10::TypePtr {
      auto o = x->cast<c10::OptionalType>();
      return o ? o->getElementType() : nullptr;
    };
    if (is_tensor(t)) {
      if (e.kind != Expr::Kind::Ref) fail_at(line, what + " expects a tensor like %x, got '" + e.text + "'");
      return resolve(e, line);
    }
    if (auto inner = opt_elem(t); inner && is_tensor(inner)) {
      if (e.kind == Expr::Kind::None) return c10::IValue();
      if (e.kind != Expr::Kind::Ref) fail_at(line, what + " expects a tensor like %x or None, got '" + e.text + "'");
      return resolve(e, line);
    }
    if (auto list = t->cast<c10::ListType>()) {
      const auto& elem = list->getElementType();
      auto inner = opt_elem(elem);
      if (is_tensor(elem) || (inner && is_tensor(inner))) {
        if (e.kind != Expr::Kind::List && e.kind != Expr::Kind::Tuple)
          fail_at(line, what + " expects a list of tensors like [%x, %y], got '" + e.text + "'");
        std::vector<std::optional<Value>> values;
        for (const auto& x : e.items) {
          if (x.kind == Expr::Kind::None && inner) {
            values.emplace_back(std::nullopt);
          } else if (x.kind == Expr::Kind::Ref) {
            values.emplace_back(resolve(x, line));
          } else {
            fail_at(line, what + " expects tensors like %x in its list, got '" + x.text + "'");
          }
        }
        return values;
      }
    }
    if (auto a = size_expression(e, formal.real_type(), what, line)) return *a;
    return typed(e, formal.real_type(), what, line, formal.N() ? static_cast<int64_t>(*formal.N()) : -1);
  }

  // An int or int-list argument that uses size symbols (`%s0`, `[%s0, -1]`, `%(8*s0)`): a size
  // expression whose example value is the expressions' value for the symbols' example values.
  std::optional<Argument> size_expression(const Expr& e, const c10::TypePtr& type, const std::string& what, int line) {
    c10::TypePtr t = type;
    if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
    // A Scalar holding an int (arange's `end`) may be one too.
    const bool is_int = t->kind() == c10::TypeKind::IntType || t->kind() == c10::TypeKind::SymIntType ||
                        t->kind() == c10::TypeKind::NumberType;
    const auto list = t->cast<c10::ListType>();
    const bool is_int_list = list && (list->getElementType()->kind() == c10::TypeKind::IntType ||
                                      list->getElementType()->kind() == c10::TypeKind::SymIntType);
    auto symbolic = [&](const Expr& x) {
      return x.kind == Expr::Kind::SizeExpr || (x.kind == Expr::Kind::Ref && symbol_values_.count(x.s) != 0);
    };
    auto expr_of = [&](const Expr& x) -> SymExpr {
      if (x.kind == Expr::Kind::Int) return SymExpr(x.i);
      if (!symbolic(x)) fail_at(line, what + " expects integers or size expressions like %s0, got '" + x.text + "'");
      SymExpr ex;
      try {
        ex = SymExpr::parse(x.s);
      } catch (const c10::Error&) {
        fail_at(line, "expected a size expression like %(2*s0 + 1) in " + what + ", got '" + x.text + "'");
      }
      for (const std::string& name : ex.symbols())
        if (!symbol_values_.count(name))
          fail_at(line, what + " uses '" + name + "', which is not a size symbol declared before it");
      return ex;
    };
    auto example = [&](const SymExpr& ex) { return ex.evaluate(symbol_values_); };
    if (is_int && symbolic(e)) {
      const SymExpr ex = expr_of(e);
      return Argument::size_expression({ex}, example(ex));
    }
    if (is_int_list && (e.kind == Expr::Kind::List || e.kind == Expr::Kind::Tuple)) {
      bool any = false;
      for (const Expr& x : e.items) any = any || symbolic(x);
      if (!any) return std::nullopt;
      std::vector<SymExpr> exprs;
      c10::List<int64_t> values;
      for (const Expr& x : e.items) {
        exprs.push_back(expr_of(x));
        values.push_back(example(exprs.back()));
      }
      return Argument::size_expression(std::move(exprs), values);
    }
    return std::nullopt;
  }

  Argument untyped_argument(const Expr& e, int line) {
    if (e.kind == Expr::Kind::Ref) return resolve(e, line);
    if (e.kind == Expr::Kind::List) {
      bool has_ref = false;
      for (const auto& x : e.items) has_ref |= x.kind == Expr::Kind::Ref;
      if (has_ref) {
        std::vector<std::optional<Value>> values;
        for (const auto& x : e.items) {
          if (x.kind == Expr::Kind::None) {
            values.emplace_back(std::nullopt);
          } else {
            values.emplace_back(resolve(x, line));
          }
        }
        return values;
      }
    }
    return generic(e, line);
  }

  // `(args = (...), kwargs = {k: v, ...})`
  void call_args(LineParser& p, std::vector<Expr>* args, std::vector<std::pair<std::string, Expr>>* kwargs) {
    p.expect("(");
    p.expect("args");
    p.expect("=");
    Expr tuple = p.expr();
    if (tuple.kind != Expr::Kind::Tuple) p.fail("an argument tuple like (%x,)");
    *args = tuple.items;
    p.expect(",");
    p.expect("kwargs");
    p.expect("=");
    p.expect("{");
    while (!p.consume("}")) {
      std::string key;
      if (p.peek() == '\'' || p.peek() == '"') {
        Expr k = p.expr();
        key = k.s;
      } else {
        key = p.ident("a keyword argument name");
      }
      p.expect(":");
      kwargs->emplace_back(key, p.expr());
      if (!p.consume(",")) {
        p.expect("}");
        break;
      }
    }
    p.expect(")");
  }

  // A size symbol, after `%s0 : Sym`: `(8, [2, inf]) = placeholder[target=s0]` (its example
  // value and range).
  void parse_symbol(LineParser& p, const std::string& name) {
    const int line = p.line();
    SizeSymbolDecl decl;
    decl.name = name;
    auto integer = [&](const char* what) {
      Expr e = p.expr();
      if (e.kind != Expr::Kind::Int) fail_at(line, std::string("expected ") + what + ", got '" + e.text + "'");
      return e.i;
    };
    p.expect("(");
    decl.example = integer("the symbol's example value");
    p.expect(",");
    p.expect("[");
    decl.min = integer("the smallest value of the symbol's range");
    p.expect(",");
    if (!p.consume("inf")) decl.max = integer("the largest value of the symbol's range, or inf");
    p.expect("]");
    p.expect(")");
    p.expect("=");
    p.expect("placeholder");
    p.expect("[");
    p.expect("target");
    p.expect("=");
    std::string target = p.until(']', "']' after the target");
    p.expect("]");
    while (!target.empty() && target.back() == ' ') target.pop_back();
    if (target != name) fail_at(line, "expected a size symbol's target to be its name '" + name + "', got '" + target + "'");
    graph_->add_symbol(decl);
    symbol_values_[name] = decl.example;
  }

  // Returns whether the node is a placeholder.
  bool parse_node(LineParser& p) {
    const int line = p.line();
    p.expect("%");
    std::string name = p.ident("a node name after '%'");
    if (nodes_.count(name) || symbol_values_.count(name)) fail_at(line, "node '%" + name + "' is defined twice");
    p.expect(":");
    if (p.consume("Sym")) {
      parse_symbol(p, name);
      return true;
    }
    bool meta_tuple = false;
    std::vector<MetaItem> meta = p.node_meta(&meta_tuple);
    p.expect("=");
    std::string opcode = p.ident("an opcode (placeholder, get_attr, call_function, call_module)");
    p.expect("[");
    p.expect("target");
    p.expect("=");
    std::string target = p.until(']', "']' after the target");
    p.expect("]");
    // A user function's node also names its operator: `[target=test_add, op=aten::add.Tensor]`.
    std::string op_name;
    if (auto comma = target.find(','); comma != std::string::npos) {
      const std::string after = target.substr(comma + 1);
      LineParser q(after, line);
      if (opcode != "call_function" || !q.consume("op") || !q.consume("="))
        fail_at(line, "expected ']' after the target (only a call_function node may add ', op=<operator>'), got '" +
                          target.substr(comma) + "'");
      op_name = q.rest();
      if (op_name.empty()) fail_at(line, "expected an operator after 'op=', got nothing");
      target.resize(comma);
    }
    while (!target.empty() && target.back() == ' ') target.pop_back();
    if (target.empty()) fail_at(line, "expected a target after 'target=', got nothing");

    auto single_meta = [&]() {
      if (meta_tuple || meta.size() != 1 || meta[0].is_list)
        fail_at(line, "expected one tensor type for a " + opcode + " node");
      return meta[0].metas[0];
    };

    Node* node = nullptr;
    if (opcode == "placeholder") {
      node = graph_->placeholder(target, single_meta()).node;
    } else if (opcode == "get_attr") {
      node = graph_->get_attr(target, single_meta()).node;
    } else if (opcode == "call_function") {
      std::shared_ptr<const Callable> callable;
      if (!op_name.empty()) callable = resolve_callable(target, op_name, line);
      else if (lookup_callable(target))
        fail_at(line, "expected an operator as the target of a call_function node, got the user function '" + target +
                          "' without its operator (write '[target=" + target + ", op=<operator>]')");
      c10::OperatorHandle op = find_op(op_name.empty() ? target : op_name);
      std::vector<Expr> args;
      std::vector<std::pair<std::string, Expr>> kwargs;
      call_args(p, &args, &kwargs);
      node = call_function(op, args, kwargs, meta, line);
      if (callable) graph_->set_target(node, std::move(callable));
    } else if (opcode == "call_module") {
      std::vector<Expr> args;
      std::vector<std::pair<std::string, Expr>> kwargs;
      call_args(p, &args, &kwargs);
      if (!kwargs.empty()) fail_at(line, "expected no kwargs for call_module, got '" + kwargs[0].first + "'");
      std::vector<Argument> arguments;
      for (const auto& a : args) arguments.push_back(untyped_argument(a, line));
      std::vector<TensorMeta> metas;
      for (const auto& item : meta) {
        if (item.is_list) fail_at(line, "expected tensor types, not lists, for a call_module node");
        metas.push_back(item.metas[0]);
      }
      node = graph_->call_module(target, std::move(arguments), std::move(metas));
    } else {
      fail_at(line, "expected an opcode (placeholder, get_attr, call_function, call_module), got '" + opcode + "'");
    }

    if (p.consume("#")) {
      p.expect("module");
      p.expect(":");
      node->set_module_path(p.rest());
    }
    if (!p.at_end()) p.fail("end of line");
    std::string given = graph_->rename(node, name);
    if (given != name) fail_at(line, "expected a node name that is a valid identifier, got '%" + name + "'");
    nodes_[name] = node;
    return node->kind() == NodeKind::Placeholder;
  }

  // The user function a call_function node names as its target, from the registry.
  static std::shared_ptr<const Callable> resolve_callable(const std::string& name, const std::string& op_name,
                                                          int line) {
    auto callable = lookup_callable(name);
    if (!callable)
      fail_at(line, "expected a callable registered with torchcompile::register_callable as the target of a "
                    "call_function node with op=" + op_name + ", got '" + name + "', which is not registered (registered: " +
                    detail::registered_callable_names() + ")");
    return callable;
  }

  Node* call_function(const c10::OperatorHandle& op, const std::vector<Expr>& args,
                      const std::vector<std::pair<std::string, Expr>>& kwargs, const std::vector<MetaItem>& meta,
                      int line) {
    const auto& schema = op.schema();
    const std::string target = op_target_name(op);
    const auto& formals = schema.arguments();
    std::vector<const Expr*> given(formals.size(), nullptr);
    size_t num_positional = 0;
    while (num_positional < formals.size() && !formals[num_positional].kwarg_only()) ++num_positional;
    if (args.size() > num_positional)
      fail_at(line, target + " expects at most " + std::to_string(num_positional) + " positional arguments, got " +
                        std::to_string(args.size()));
    for (size_t i = 0; i < args.size(); ++i) given[i] = &args[i];
    for (const auto& [key, value] : kwargs) {
      auto idx = schema.argumentIndexWithName(key);
      if (!idx) fail_at(line, target + " has no argument named '" + key + "'");
      if (given[*idx]) fail_at(line, "argument '" + key + "' of " + target + " is given twice");
      given[*idx] = &value;
    }
    std::vector<Argument> arguments;
    for (size_t i = 0; i < formals.size(); ++i) {
      if (given[i]) {
        arguments.push_back(to_argument(*given[i], formals[i], target, line));
      } else if (formals[i].default_value()) {
        arguments.emplace_back(*formals[i].default_value());
      } else {
        fail_at(line, target + " expects argument '" + formals[i].name() + "', which has no default");
      }
    }

    const auto& returns = schema.returns();
    if (meta.size() != returns.size())
      fail_at(line, target + " has " + std::to_string(returns.size()) + " returns, got " +
                        std::to_string(meta.size()) + " tensor types");
    std::vector<TensorMeta> metas;
    std::vector<uint32_t> counts;
    for (size_t r = 0; r < returns.size(); ++r) {
      bool list_return = returns[r].type()->kind() == c10::TypeKind::ListType;
      if (list_return != meta[r].is_list)
        fail_at(line, "return " + std::to_string(r) + " of " + target + " expects " +
                          (list_return ? "a list of tensor types [..]" : "one tensor type"));
      counts.push_back(static_cast<uint32_t>(meta[r].metas.size()));
      metas.insert(metas.end(), meta[r].metas.begin(), meta[r].metas.end());
    }
    return graph_->call_function(op, std::move(arguments), std::move(metas), std::move(counts));
  }

  void parse_return(LineParser& p) {
    const int line = p.line();
    Expr e = p.expr();
    if (e.kind != Expr::Kind::Tuple) fail_at(line, "expected a tuple of outputs like (%x,), got '" + e.text + "'");
    if (!p.at_end()) p.fail("end of line");
    std::vector<Value> outputs;
    for (const auto& x : e.items) outputs.push_back(resolve(x, line));
    graph_->output(std::move(outputs));
  }

  std::unique_ptr<Graph> graph_;
  std::unordered_map<std::string, Node*> nodes_;
  std::map<std::string, int64_t> symbol_values_;  // the size symbols declared so far
};

}  // namespace

std::unique_ptr<Graph> parse_graph(const std::string& text) { return GraphParser().parse(text); }

}  // namespace torchcompile::ir
