// Packages (frontend/package.h): save a compiled object's entries to one file, load and run them
// without the forward's code.
//
// The file: a first line `TORCHCOMPILE-PACKAGE <format>`, then sections, each a line
// `section <name> <length> <checksum>` (FNV-1a, 64 bits, in hex) followed by that many bytes and
// a newline, then `end`. Sections: `manifest` (text, below), `graph.<k>` (the text format of
// ir::to_text), `weights` (torch::jit::pickle_save of a Dict[str, Tensor]: `torch.load` reads
// it). Every byte is covered by a checksum, so a damaged file is an error before anything is
// parsed; the parsers check what they read all the same (bounds, counts, names), so that a file
// written wrongly is an error too.
//
// The manifest is a list of whitespace-separated tokens: integers, strings in double quotes
// (`\"`, `\\` and `\n` escaped), doubles as the hex digits of their bits. What it holds, in
// order: the LibTorch version, the object's name and interface (a TorchScript method's schema),
// the weights' names and kinds, each graph's attribute bindings, and each entry: its guards
// (argument items, input tensors, symbolic dimensions, identity, global state) and its trace
// tree (segments with their graph, slots, size plan, the branch reads with their constants and
// the values seen, and the results' encoding).
#include <torchcompile/frontend/package.h>

#include <torchcompile/frontend/script_module.h>
#include <torchcompile/ir/op_properties.h>
#include <torchcompile/ir/parser.h>
#include <torchcompile/ir/printer.h>
#include <torchcompile/support/logging.h>

#include "aot/aot_internal.h"
#include "capture/metadata_at.h"
#include "compile/autotune.h"
#include "compile/pipeline.h"
#include "frontend/script_values.h"
#include "ir/effects.h"
#include "runtime/dynamic_entry.h"
#include "runtime/guards.h"
#include "runtime/trace_tree.h"
#include "support/error_text.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/Functions.h>
#include <c10/util/Exception.h>
#include <torch/csrc/api/include/torch/version.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cinttypes>
#include <cstring>
#include <fstream>
#include <limits>
#include <shared_mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace torchcompile {

namespace runtime {

namespace {

constexpr int64_t kFormat = 1;
constexpr const char* kMagic = "TORCHCOMPILE-PACKAGE";
// Bounds a reader checks before it allocates: no real package comes near them.
constexpr int64_t kMaxCount = int64_t{1} << 24;
constexpr int64_t kMaxRank = 64;
constexpr int64_t kMaxSlots = int64_t{1} << 16;  // values passed between the segments of one call
constexpr int64_t kMaxExampleElements = int64_t{1} << 28;  // a graph input's example, allocated at load

std::string libtorch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

uint64_t fnv1a(const char* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 1099511628211ull;
  }
  return h;
}

// ---- the manifest's tokens ------------------------------------------------------------------

class Out {
 public:
  Out& word(const std::string& w) { return sep(), os_ << w, *this; }
  Out& num(int64_t v) { return sep(), os_ << v, *this; }
  Out& real(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%016" PRIx64, bits);
    return word(buf);
  }
  Out& str(const std::string& s) {
    sep();
    os_ << '"';
    for (char c : s) {
      if (c == '"' || c == '\\') os_ << '\\' << c;
      else if (c == '\n') os_ << "\\n";
      else os_ << c;
    }
    os_ << '"';
    return *this;
  }
  Out& line() {
    os_ << '\n';
    fresh_ = true;
    return *this;
  }
  std::string text() const { return os_.str(); }

 private:
  void sep() {
    if (!fresh_) os_ << ' ';
    fresh_ = false;
  }
  std::ostringstream os_;
  bool fresh_ = true;
};

class In {
 public:
  In(const std::string& text, std::string what) : s_(text), what_(std::move(what)) {}

  [[noreturn]] void fail(const std::string& msg) const {
    TORCH_CHECK(false, what_, ", line ", line_, ": ", msg);
  }
  void expect(const char* w) {
    const std::string got = token();
    if (got != w) fail(std::string("expected '") + w + "', got '" + got + "'");
  }
  int64_t num(int64_t min = std::numeric_limits<int64_t>::min(), int64_t max = std::numeric_limits<int64_t>::max()) {
    const std::string t = token();
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(t.c_str(), &end, 10);
    if (t.empty() || *end != '\0' || errno != 0) fail("expected an integer, got '" + t + "'");
    if (v < min || v > max) fail("the integer " + t + " is out of range [" + std::to_string(min) + ", " + std::to_string(max) + "]");
    return v;
  }
  size_t count() { return static_cast<size_t>(num(0, kMaxCount)); }
  bool flag() { return num(0, 1) != 0; }
  double real() {
    const std::string t = token();
    errno = 0;
    char* end = nullptr;
    if (t.size() != 18 || t.compare(0, 2, "0x") != 0) fail("expected a double's bits (0x + 16 hex digits), got '" + t + "'");
    const unsigned long long bits = std::strtoull(t.c_str() + 2, &end, 16);
    if (*end != '\0' || errno != 0) fail("expected a double's bits, got '" + t + "'");
    double v;
    const uint64_t b = bits;
    std::memcpy(&v, &b, sizeof v);
    return v;
  }
  std::string str() {
    skip_space();
    if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a string in double quotes");
    ++pos_;
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) fail("unterminated string");
      char c = s_[pos_++];
      if (c == '"') break;
      if (c == '\n') ++line_;
      if (c == '\\') {
        if (pos_ >= s_.size()) fail("unterminated string");
        c = s_[pos_++];
        if (c == 'n') c = '\n';
        else if (c != '"' && c != '\\') fail("unknown escape in a string");
      }
      out += c;
    }
    return out;
  }
  std::string token() {
    skip_space();
    const size_t start = pos_;
    while (pos_ < s_.size() && !std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (start == pos_) fail("unexpected end of the manifest");
    return s_.substr(start, pos_ - start);
  }
  bool at_end() {
    skip_space();
    return pos_ >= s_.size();
  }

 private:
  void skip_space() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) {
      if (s_[pos_] == '\n') ++line_;
      ++pos_;
    }
  }
  const std::string& s_;
  std::string what_;
  size_t pos_ = 0;
  size_t line_ = 1;
};

// ---- scalar types ---------------------------------------------------------------------------

c10::ScalarType scalar_type(In& in) {
  const std::string name = in.token();
#define TC_SCALAR_TYPE(_, n) \
  if (name == #n) return c10::ScalarType::n;
  AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(TC_SCALAR_TYPE)
#undef TC_SCALAR_TYPE
  in.fail("unknown dtype '" + name + "'");
}

// ---- values (branch reads' constants and results, TorchScript result structures) ---------------

c10::TypePtr parse_type(const std::string& text) {
  // The schema parser reads the types FunctionSchema prints (`int[]`, `Dict(str, Tensor)`).
  const c10::FunctionSchema s = torch::jit::parseSchema("f(" + text + " x) -> ()");
  return s.arguments().at(0).type();
}

void write_value(Out& out, const c10::IValue& v, const std::string& where) {
  if (v.isNone()) return void(out.word("none"));
  if (v.isTensor()) {
    TORCH_CHECK(!v.toTensor().defined(), "torchcompile::save: ", where, " holds a tensor constant");
    return void(out.word("tensor"));
  }
  if (v.isBool()) return void(out.word("bool").num(v.toBool()));
  if (v.isInt()) return void(out.word("int").num(v.toInt()));
  if (v.isDouble()) return void(out.word("double").real(v.toDouble()));
  if (v.isString()) return void(out.word("str").str(v.toStringRef()));
  if (v.isDevice()) return void(out.word("device").str(v.toDevice().str()));
  if (v.isTuple()) {
    const auto& e = v.toTupleRef().elements();
    out.word("tuple").num(static_cast<int64_t>(e.size()));
    for (const auto& x : e) write_value(out, x, where);
    return;
  }
  if (v.isList()) {
    const c10::List<c10::IValue> l = v.toList();
    out.word("list").str(l.elementType()->str()).num(static_cast<int64_t>(l.size()));
    for (size_t i = 0; i < l.size(); ++i) write_value(out, l.get(i), where);
    return;
  }
  if (v.isGenericDict()) {
    const c10::Dict<c10::IValue, c10::IValue> d = v.toGenericDict();
    out.word("dict").str(d.keyType()->str()).str(d.valueType()->str()).num(static_cast<int64_t>(d.size()));
    for (auto i = d.begin(); i != d.end(); ++i) write_value(out, i->key(), where), write_value(out, i->value(), where);
    return;
  }
  TORCH_CHECK(false, "torchcompile::save: ", where, " holds a ", v.tagKind(), ", which a package cannot hold");
}

c10::IValue read_value(In& in, int depth = 0) {
  if (depth > 64) in.fail("values nested too deeply");
  const std::string kind = in.token();
  if (kind == "none") return c10::IValue();
  if (kind == "tensor") return c10::IValue(at::Tensor());
  if (kind == "bool") return c10::IValue(in.flag());
  if (kind == "int") return c10::IValue(in.num());
  if (kind == "double") return c10::IValue(in.real());
  if (kind == "str") return c10::IValue(in.str());
  if (kind == "device") {
    const std::string d = in.str();
    try {
      return c10::IValue(c10::Device(d));
    } catch (const std::exception&) {
      in.fail("bad device '" + d + "'");
    }
  }
  auto type = [&]() {
    const std::string t = in.str();
    try {
      return parse_type(t);
    } catch (const std::exception&) {
      in.fail("bad type '" + t + "'");
    }
  };
  if (kind == "tuple") {
    const size_t n = in.count();
    std::vector<c10::IValue> e;
    for (size_t i = 0; i < n; ++i) e.push_back(read_value(in, depth + 1));
    return c10::ivalue::Tuple::create(std::move(e));
  }
  if (kind == "list") {
    const c10::TypePtr t = type();
    const size_t n = in.count();
    c10::impl::GenericList l(t);
    for (size_t i = 0; i < n; ++i) {
      c10::IValue x = read_value(in, depth + 1);
      if (!x.isTensor() && !x.type()->isSubtypeOf(*t)) in.fail("a " + x.type()->str() + " in a list of " + t->str());
      l.push_back(std::move(x));
    }
    return l;
  }
  if (kind == "dict") {
    const c10::TypePtr k = type(), v = type();
    const size_t n = in.count();
    if (k->kind() != c10::TypeKind::StringType && k->kind() != c10::TypeKind::IntType &&
        k->kind() != c10::TypeKind::FloatType && k->kind() != c10::TypeKind::BoolType)
      in.fail("a dict keyed by " + k->str());
    c10::impl::GenericDict d(k, v);
    for (size_t i = 0; i < n; ++i) {
      c10::IValue key = read_value(in, depth + 1);
      c10::IValue value = read_value(in, depth + 1);
      if (!key.type()->isSubtypeOf(*k)) in.fail("a " + key.type()->str() + " key in a dict keyed by " + k->str());
      d.insert_or_assign(std::move(key), std::move(value));
    }
    return d;
  }
  in.fail("unknown value kind '" + kind + "'");
}

void write_values(Out& out, const std::vector<c10::IValue>& vs, const std::string& where) {
  out.num(static_cast<int64_t>(vs.size()));
  for (const auto& v : vs) write_value(out, v, where);
}

std::vector<c10::IValue> read_values(In& in) {
  const size_t n = in.count();
  std::vector<c10::IValue> vs;
  for (size_t i = 0; i < n; ++i) vs.push_back(read_value(in));
  return vs;
}

// ---- the container ------------------------------------------------------------------------

struct Sections {
  std::vector<std::pair<std::string, std::string>> items;
  const std::string* find(const std::string& name) const {
    for (const auto& [n, data] : items)
      if (n == name) return &data;
    return nullptr;
  }
};

std::string write_container(const Sections& s) {
  std::string out = std::string(kMagic) + " " + std::to_string(kFormat) + "\n";
  for (const auto& [name, data] : s.items) {
    char sum[24];
    std::snprintf(sum, sizeof sum, "%016" PRIx64, fnv1a(data.data(), data.size()));
    out += "section " + name + " " + std::to_string(data.size()) + " " + sum + "\n";
    out += data;
    out += "\n";
  }
  out += "end\n";
  return out;
}

Sections read_container(const std::string& bytes, const std::string& path) {
  const std::string what = "torchcompile::load('" + path + "')";
  size_t pos = 0;
  auto next_line = [&](const char* expecting) {
    const size_t nl = bytes.find('\n', pos);
    TORCH_CHECK(nl != std::string::npos && nl - pos <= 256, what, ": the file is truncated or corrupted (expected ",
                expecting, " at byte ", pos, ")");
    std::string line = bytes.substr(pos, nl - pos);
    pos = nl + 1;
    return line;
  };
  {
    TORCH_CHECK(bytes.compare(0, std::strlen(kMagic), kMagic) == 0, what,
                ": not a torchcompile package (it does not begin with ", kMagic,
                "; a TorchScript archive is loaded with torch::jit::load, a package is written by torchcompile::save)");
    const std::string first = next_line("the header");
    const std::string version = first.substr(std::min(first.size(), std::strlen(kMagic) + 1));
    char* end = nullptr;
    const long v = std::strtol(version.c_str(), &end, 10);
    TORCH_CHECK(first.size() > std::strlen(kMagic) && first[std::strlen(kMagic)] == ' ' && !version.empty() &&
                    *end == '\0' && version == std::to_string(v),
                what, ": the file is corrupted (header '", first, "')");
    TORCH_CHECK(v == kFormat, what, ": package format ", version, "; this torchcompile reads format ", kFormat,
                v > kFormat ? " (written by a newer torchcompile: load it with that version, or save it again with this one)"
                            : " (save it again with this torchcompile)");
  }
  Sections s;
  for (;;) {
    const std::string line = next_line("a section");
    if (line == "end") break;
    std::istringstream ls(line);
    std::string word, name, sum;
    unsigned long long length = 0;
    ls >> word >> name >> length >> sum;
    // Exactly as written: a header line that reads the same after a change is still a change.
    TORCH_CHECK(!ls.fail() && line == "section " + name + " " + std::to_string(length) + " " + sum, what,
                ": the file is corrupted (bad section line '", line, "')");
    TORCH_CHECK(length <= bytes.size() - pos && bytes.size() - pos - length >= 1 && bytes[pos + length] == '\n', what,
                ": the file is truncated or corrupted (section '", name, "' of ", length, " bytes at byte ", pos, ")");
    std::string data = bytes.substr(pos, length);
    pos += length + 1;
    char expected[24];
    std::snprintf(expected, sizeof expected, "%016" PRIx64, fnv1a(data.data(), data.size()));
    TORCH_CHECK(sum == expected, what, ": the file is corrupted (section '", name, "' fails its checksum)");
    TORCH_CHECK(s.find(name) == nullptr, what, ": the file is corrupted (section '", name, "' twice)");
    s.items.emplace_back(std::move(name), std::move(data));
  }
  TORCH_CHECK(pos == bytes.size(), what, ": the file is corrupted (", bytes.size() - pos, " bytes after its end)");
  return s;
}

}  // namespace

// ---- saving -------------------------------------------------------------------------------

struct PackageAccess {
  struct Writer {
    Out out;
    Sections sections;
    // Weights by TensorImpl: their names in the package.
    std::unordered_map<const c10::TensorImpl*, std::string> weight_names;
    std::vector<std::pair<std::string, at::Tensor>> weights;
    std::vector<std::string> weight_kinds;
    std::vector<std::vector<std::pair<std::string, std::string>>> graph_bindings;  // per graph: (attribute, weight)
    size_t constants = 0;

    size_t add_graph(const GraphModule& gm) {
      const size_t k = graph_bindings.size();
      for (const auto& n : gm.graph().nodes()) {
        TORCH_CHECK(n->kind() != ir::NodeKind::CallModule, "torchcompile::save: a graph calls the module '", n->target(),
                    "' opaquely (a leaf module or hooks that cannot be traced); a package can only hold operators");
        TORCH_CHECK(!n->callable(), "torchcompile::save: a graph calls the user function '", n->target(),
                    "'; a package can only hold operators");
      }
      std::vector<std::pair<std::string, std::string>> bindings;
      for (const auto& [name, attr] : gm.attributes()) {
        const at::Tensor& t = attr.first;
        TORCH_CHECK(t.defined() && t.device().is_cpu() && t.layout() == c10::kStrided, "torchcompile::save: attribute '",
                    name, "' is not a strided CPU tensor");
        auto it = weight_names.find(t.unsafeGetTensorImpl());
        if (it == weight_names.end()) {
          std::string wname = attr.second == ir::AttributeKind::Constant ? "constant." + std::to_string(constants++) : name;
          for (const auto& [n, _] : weights)  // two parameters of one name (a module replaced)
            if (n == wname) wname = "constant." + std::to_string(constants++);
          it = weight_names.emplace(t.unsafeGetTensorImpl(), wname).first;
          weights.emplace_back(wname, t);
          weight_kinds.push_back(attr.second == ir::AttributeKind::Parameter ? "parameter"
                                 : attr.second == ir::AttributeKind::Buffer  ? "buffer"
                                                                             : "constant");
        }
        bindings.emplace_back(name, it->second);
      }
      graph_bindings.push_back(std::move(bindings));
      sections.items.emplace_back("graph." + std::to_string(k), ir::to_text(gm.graph()));
      return k;
    }
  };

  static void write_plan(Out& o, const DynamicPlan& plan) {
    o.word("plan").num(static_cast<int64_t>(plan.symbols.size()));
    for (const SizeSymbol& s : plan.symbols) o.str(s.name).num(s.input).num(s.dim).num(s.traced).num(s.min).num(s.max);
    o.num(static_cast<int64_t>(plan.dims.size()));
    for (const SymbolicDim& d : plan.dims) o.num(d.input).num(d.dim).num(d.symbol);
    o.num(static_cast<int64_t>(plan.expression_dims.size()));
    for (const ExpressionDim& d : plan.expression_dims) o.num(d.input).num(d.dim).str(d.size.str());
    o.num(static_cast<int64_t>(plan.input_names.size()));
    for (const auto& n : plan.input_names) o.str(n);
    o.line();
  }

  static void write_spec(Out& o, const OutputSpec& spec, bool script) {
    o.word("results").num(static_cast<int64_t>(spec.list_sizes.size()));
    for (size_t n : spec.list_sizes) o.num(static_cast<int64_t>(n));
    o.num(static_cast<int64_t>(spec.undefined.size()));
    for (size_t n : spec.undefined) o.num(static_cast<int64_t>(n));
    if (script) {
      write_value(o, spec.structure, "the method's result");
    } else {
      TORCH_CHECK(spec.result_type != nullptr,
                  "torchcompile::save: the result type of the forward was not recorded (a compiled object made by "
                  "torch::compile records it)");
      o.str(spec.result_type);
    }
    o.line();
  }

  // The caller holds the entry's tree mutex (a call on another thread may grow the tree).
  static void write_segment(Writer& w, const Segment& seg, bool script) {
    Out& o = w.out;
    const size_t g = w.add_graph(*seg.gm);
    o.word("segment").num(static_cast<int64_t>(g)).num(static_cast<int64_t>(seg.input_slots.size()));
    for (uint32_t s : seg.input_slots) o.num(s);
    o.num(static_cast<int64_t>(seg.output_slots.size()));
    for (uint32_t s : seg.output_slots) o.num(s);
    o.line();
    if (seg.dynamic) {
      const ShapeSpecializations& d = *seg.dynamic;
      o.word("dynamic").num(d.symbolic()).str(d.static_reason());
      // A graph with symbols is the one compiled (seg.gm); a static one keeps the graph as traced.
      if (!d.symbolic()) o.num(static_cast<int64_t>(w.add_graph(d.generic())));
      o.line();
      write_plan(o, d.plan());
    } else {
      o.word("static").line();
    }
    if (!seg.branch) {
      o.word("end").line();
      write_spec(o, seg.spec, script);
      return;
    }
    const BranchPoint& bp = *seg.branch;
    std::vector<std::pair<std::vector<c10::IValue>, size_t>> known;
    for (const auto& [key, child] : bp.known)
      for (size_t c = 0; c < bp.children.size(); ++c)
        if (bp.children[c].get() == child) known.emplace_back(key, c);
    const c10::OperatorName& op = bp.record.op.schema().operator_name();
    o.word("branch").str(op.name).str(op.overload_name);
    write_values(o, bp.record.stack_template, "the arguments of the graph break on " + bp.op_name);
    o.num(static_cast<int64_t>(bp.record.tensor_args.size()));
    for (const auto& [index, slot] : bp.record.tensor_args) o.num(index).num(slot);
    o.num(static_cast<int64_t>(bp.children.size())).line();
    for (const auto& c : bp.children) write_segment(w, *c, script);
    o.word("known").num(static_cast<int64_t>(known.size())).line();
    for (const auto& [key, c] : known) {
      write_values(o, key, "the value read by the graph break on " + bp.op_name);
      o.num(static_cast<int64_t>(c)).line();
    }
  }

  static void write_guards(Out& o, const PortableGuards& p) {
    o.word("items").num(static_cast<int64_t>(p.items.size()));
    for (const ArgItem& it : p.items) o.num(it.kind).num(it.i).real(it.d);
    o.line();
    o.word("tensors").num(static_cast<int64_t>(p.tensors.size())).line();
    for (size_t i = 0; i < p.tensors.size(); ++i) {
      const PortableGuards::Tensor& t = p.tensors[i];
      o.str(p.tensor_names.at(i)).num(t.defined);
      if (t.defined) {
        o.word(c10::toString(t.dtype)).num(t.inference).num(static_cast<int64_t>(t.sizes.size()));
        for (int64_t s : t.sizes) o.num(s);
        for (int64_t s : t.strides) o.num(s);
        o.num(static_cast<int64_t>(t.symbolic));
      }
      o.num(p.same_as.at(i)).line();
    }
    o.word("symbols").num(static_cast<int64_t>(p.sym_dims.size()));
    for (const auto& d : p.sym_dims) o.num(d.input).num(d.dim).num(d.first_input).num(d.first_dim).num(d.min).num(d.max).str(d.symbol);
    o.line();
    o.word("state").word(c10::toString(p.default_dtype)).num(p.deterministic).num(p.autocast_cpu);
    o.word(c10::toString(p.autocast_cpu_dtype)).line();
  }

  // One entry, or (a dynamic entry with a tree per size) one per size traced: its guards with
  // the symbols pinned to those values, since the forward's code decided that tree at them.
  static void write_entry(Writer& w, const CompiledEntry& e, bool script, size_t& count, std::string& skipped) {
    PortableGuards p;
    const std::string why = e.guards_->to_portable(p);
    if (!why.empty()) {
      skipped += (skipped.empty() ? "" : "; ") + why;
      return;
    }
    auto tree = [&](const CompiledEntry& t, const PortableGuards& guards, const std::string& sizes) {
      Out& o = w.out;
      o.word("entry").num(static_cast<int64_t>(count++));
      const bool eager = t.runs_eagerly() || !t.root_;
      o.num(eager).str(eager ? (t.eager_reason_.empty() ? std::string("it ran eagerly") : t.eager_reason_) : "");
      o.str(sizes).line();
      write_guards(o, guards);
      if (!eager) {
        std::lock_guard<std::mutex> lock(t.tree_mutex_);
        write_segment(w, *t.root_, script);
      }
    };
    if (!e.replays_) return tree(e, p, "");
    const ForwardReplays& r = *e.replays_;
    for (const auto& [key, t] : r.trees.items()) {
      PortableGuards pinned = p;
      for (auto& d : pinned.sym_dims)
        for (size_t k = 0; k < r.plan.symbols.size() && k < key.size(); ++k)
          if (r.plan.symbols[k].name == d.symbol) d.min = d.max = key[k];
      if (t) tree(*t, pinned, "only at " + r.plan.key_str(key) + ", traced one size at a time because " + r.plan.replay_reason);
    }
  }

  static std::string save(const CompiledFunction& fn, const detail::PackageInterface& interface) {
    Writer w;
    const bool script = !interface.script_schema.empty();
    size_t count = 0;
    std::string skipped;
    Out body;
    std::swap(body, w.out);
    for (const auto& e : fn.entries()) write_entry(w, *e, script, count, skipped);
    std::swap(body, w.out);
    TORCH_CHECK(count > 0, "torchcompile::save(", fn.name(), "): nothing to save: ",
                fn.entries().empty() ? "the compiled object was never called (call it with each signature to serve first)"
                                     : "no entry can be saved (" + skipped + ")");
    if (!skipped.empty())
      TORCH_WARN("torchcompile::save(", fn.name(), "): entries left out of the package: ", skipped);

    Out& o = w.out;
    o.word("libtorch").str(libtorch_version()).line();
    o.word("name").str(fn.name()).line();
    o.word("schema").str(interface.script_schema).line();
    o.word("input_names").num(static_cast<int64_t>(fn.options().input_names.size()));
    for (const auto& n : fn.options().input_names) o.str(n);
    o.line();
    o.word("weights").num(static_cast<int64_t>(w.weights.size())).line();
    for (size_t i = 0; i < w.weights.size(); ++i) o.str(w.weights[i].first).word(w.weight_kinds[i]).line();
    o.word("graphs").num(static_cast<int64_t>(w.graph_bindings.size())).line();
    for (const auto& bindings : w.graph_bindings) {
      o.num(static_cast<int64_t>(bindings.size()));
      for (const auto& [attr, weight] : bindings) o.str(attr).str(weight);
      o.line();
    }
    o.word("entries").num(static_cast<int64_t>(count)).line();
    std::string manifest = o.text() + body.text();

    c10::Dict<std::string, at::Tensor> dict;
    for (const auto& [name, t] : w.weights) dict.insert(name, t.detach());
    const std::vector<char> pickled = torch::jit::pickle_save(dict);

    Sections s;
    s.items.emplace_back("manifest", std::move(manifest));
    for (auto& item : w.sections.items) s.items.push_back(std::move(item));
    s.items.emplace_back("weights", std::string(pickled.begin(), pickled.end()));
    return write_container(s);
  }
};

}  // namespace runtime

// ---- the loaded module --------------------------------------------------------------------

namespace detail {

using runtime::In;
using runtime::Segment;

class LoadedState {
 public:
  struct Entry {
    std::unique_ptr<runtime::GuardSet> guards;
    std::unique_ptr<Segment> root;  // null: the signature ran eagerly when saved
    std::string eager_reason;
    std::string sizes_note;  // an entry for one combination of sizes: which, and why
    std::vector<std::string> symbols;  // `s0 in [2, inf)` for describe
    runtime::PortableGuards portable;  // as saved (example_inputs)
    mutable std::mutex tree_mutex;
  };

  std::string path, name, schema_text, libtorch, backend_name;
  c10::optional<c10::FunctionSchema> schema;
  std::vector<std::string> input_names, arg_names;
  std::vector<std::pair<std::string, at::Tensor>> weights;  // in the package's order
  std::vector<std::string> weight_kinds;
  std::vector<std::string> graph_texts;
  std::vector<std::vector<std::pair<std::string, std::string>>> bindings;
  std::vector<std::unique_ptr<Entry>> entries;
  size_t num_graphs = 0;
  mutable std::shared_mutex weights_mutex;  // calls share it; load_state_dict takes it alone

  std::string what() const { return "torchcompile::load('" + path + "')"; }

  // The index of weight `n`, or weights.size().
  size_t weight_index(const std::string& n) const {
    size_t i = 0;
    while (i < weights.size() && weights[i].first != n) ++i;
    return i;
  }
  const at::Tensor* weight(const std::string& n) const {
    const size_t i = weight_index(n);
    return i < weights.size() ? &weights[i].second : nullptr;
  }

  std::shared_ptr<GraphModule> graph(size_t k, In& in) const {
    if (k >= graph_texts.size()) in.fail("graph " + std::to_string(k) + " does not exist");
    std::unique_ptr<ir::Graph> g;
    try {
      g = ir::parse_graph(graph_texts[k]);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, what(), ": graph ", k, " cannot be read by this LibTorch (", libtorch_note(), "): ",
                  support::error_message(e));
    }
    auto gm = std::make_shared<GraphModule>(std::shared_ptr<ir::Graph>(std::move(g)));
    for (const auto& [attr, wname] : bindings.at(k)) {
      const size_t i = weight_index(wname);
      if (i == weights.size())
        in.fail("graph " + std::to_string(k) + " reads the weight '" + wname + "', which the package does not have");
      const std::string& kind = weight_kinds[i];
      gm->set_attribute(attr, weights[i].second,
                        kind == "parameter" ? ir::AttributeKind::Parameter
                        : kind == "buffer"  ? ir::AttributeKind::Buffer
                                            : ir::AttributeKind::Constant);
    }
    for (const auto& n : gm->graph().nodes())
      if (n->kind() == ir::NodeKind::GetAttr && !gm->has_attribute(n->target()))
        in.fail("graph " + std::to_string(k) + " reads the attribute '" + n->target() + "', which is not bound");
    return gm;
  }

  std::string libtorch_note() const {
    return "written by LibTorch " + libtorch + ", loaded by " + runtime::libtorch_version();
  }
};

}  // namespace detail

namespace runtime {

namespace {


// What a slot of a call holds when a segment reads it: a tensor of this dtype and rank.
struct SlotInfo {
  c10::ScalarType dtype;
  size_t rank;
};

// The graph's output values, in order (null for an output that is None).
std::vector<const ir::TensorMeta*> output_metas(const GraphModule& gm) {
  std::vector<const ir::TensorMeta*> out;
  const ir::Node* o = gm.graph().output_node();
  if (o == nullptr || o->args().empty() || !o->args()[0].is_list()) return out;
  for (const auto& v : o->args()[0].list()) out.push_back(v ? &v->node->output_meta().at(v->index) : nullptr);
  return out;
}

struct Loader {
  detail::LoadedState& st;
  In& in;
  Backend backend;
  std::string backend_name;

  DynamicPlan read_plan() {
    in.expect("plan");
    DynamicPlan plan;
    const size_t ns = in.count();
    for (size_t i = 0; i < ns; ++i) {
      SizeSymbol s;
      s.name = in.str();
      s.input = static_cast<uint32_t>(in.num(0, kMaxCount));
      s.dim = static_cast<uint32_t>(in.num(0, kMaxRank - 1));
      s.traced = in.num(0);
      s.min = in.num(0);
      s.max = in.num(s.min);
      plan.symbols.push_back(std::move(s));
    }
    const size_t nd = in.count();
    for (size_t i = 0; i < nd; ++i) {
      SymbolicDim d;
      d.input = static_cast<uint32_t>(in.num(0, kMaxCount));
      d.dim = static_cast<uint32_t>(in.num(0, kMaxRank - 1));
      d.symbol = static_cast<uint32_t>(in.num(0, static_cast<int64_t>(ns) - 1));
      plan.dims.push_back(d);
    }
    const size_t ne = in.count();
    for (size_t i = 0; i < ne; ++i) {
      ExpressionDim d;
      d.input = static_cast<uint32_t>(in.num(0, kMaxCount));
      d.dim = static_cast<uint32_t>(in.num(0, kMaxRank - 1));
      const std::string e = in.str();
      try {
        d.size = ir::SymExpr::parse(e);
      } catch (const std::exception&) {
        in.fail("bad size expression '" + e + "'");
      }
      plan.expression_dims.push_back(std::move(d));
    }
    const size_t nn = in.count();
    for (size_t i = 0; i < nn; ++i) plan.input_names.push_back(in.str());
    return plan;
  }

  OutputSpec read_spec() {
    in.expect("results");
    OutputSpec spec;
    const size_t nl = in.count();
    for (size_t i = 0; i < nl; ++i) spec.list_sizes.push_back(in.count());
    const size_t nu = in.count();
    for (size_t i = 0; i < nu; ++i) spec.undefined.push_back(in.count());
    if (st.schema) {
      spec.structure = read_value(in);
    } else {
      // The result type lives as long as the loaded module: kept in a set of its strings.
      static std::mutex m;
      static std::unordered_set<std::string> names;
      const std::string t = in.str();
      std::lock_guard<std::mutex> lock(m);
      spec.result_type = names.insert(t).first->c_str();
    }
    return spec;
  }

  // The graph's metadata must be what its operators give in this LibTorch at its example sizes
  // (a file written wrongly, or an operator whose results changed between versions): the
  // backends compile for that metadata.
  void check_metadata(const GraphModule& gm, size_t g) {
    std::vector<ir::TensorMeta> inputs;
    for (const ir::Node* p : gm.graph().placeholders()) inputs.push_back(p->output_meta().at(0));
    std::unordered_map<std::string, std::vector<ir::TensorMeta>> computed;
    try {
      computed = capture::metadata_at(gm, inputs);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, st.what(), ": graph ", g, " fails in this LibTorch (", st.libtorch_note(), "): ",
                  support::error_message(e));
    }
    for (const auto& n : gm.graph().nodes()) {
      if (n->kind() != ir::NodeKind::CallFunction) continue;
      auto it = computed.find(n->name());
      if (it == computed.end()) continue;
      const bool data_sizes = ir::node_results_depend_on_data(*n);
      for (size_t i = 0; i < n->output_meta().size() && i < it->second.size(); ++i) {
        const ir::TensorMeta &have = n->output_meta()[i], &got = it->second[i];
        if (!have.defined || !got.defined) continue;
        TORCH_CHECK(have.dtype == got.dtype && have.sizes.size() == got.sizes.size() && (data_sizes || have.sizes == got.sizes),
                    st.what(), ": graph ", g, ": %", n->name(), " is ", have.str(), " in the file, but ",
                    ir::op_target_name(n->op()), " gives ", got.str(), " in this LibTorch (", st.libtorch_note(), ")");
      }
    }
  }

  // The segment's graph, compiled with the backend; a dynamic segment serves every size.
  // `slots`: what each slot of the call holds when the segment runs.
  std::unique_ptr<Segment> read_segment(int depth, std::vector<SlotInfo> slots) {
    if (depth > 1024) in.fail("graph breaks nested too deeply");
    in.expect("segment");
    auto seg = std::make_unique<Segment>();
    const size_t g = in.count();
    seg->gm = st.graph(g, in);
    const std::string graph = "graph " + std::to_string(g);
    const size_t ni = in.count();
    for (size_t i = 0; i < ni; ++i) seg->input_slots.push_back(static_cast<uint32_t>(in.num(0, kMaxSlots)));
    const size_t no = in.count();
    for (size_t i = 0; i < no; ++i) seg->output_slots.push_back(static_cast<uint32_t>(in.num(0, kMaxSlots)));
    const std::vector<ir::Node*> placeholders = seg->gm->graph().placeholders();
    if (placeholders.size() != seg->input_slots.size())
      in.fail(graph + " has " + std::to_string(placeholders.size()) + " inputs, the segment " +
              std::to_string(seg->input_slots.size()));
    for (size_t j = 0; j < placeholders.size(); ++j) {
      const uint32_t s = seg->input_slots[j];
      const ir::TensorMeta& m = placeholders[j]->output_meta().at(0);
      if (s >= slots.size()) in.fail(graph + " reads slot " + std::to_string(s) + ", which holds nothing yet");
      if (!m.defined || m.dtype != slots[s].dtype || m.sizes.size() != slots[s].rank || !m.device.is_cpu())
        in.fail(graph + ": input " + std::to_string(j) + " is " + m.str() + ", its slot holds a " +
                c10::toString(slots[s].dtype) + " tensor of rank " + std::to_string(slots[s].rank));
      // Its example (zeros, for the backend) is allocated: bounded before anything is.
      int64_t last = 0;
      bool bad = m.strides.size() != m.sizes.size();
      for (size_t d = 0; !bad && d < m.sizes.size(); ++d) {
        bad = m.sizes[d] < 0 || m.strides[d] < 0 || m.sizes[d] > kMaxExampleElements ||
              m.strides[d] > kMaxExampleElements;
        if (!bad && m.sizes[d] > 0) last += (m.sizes[d] - 1) * m.strides[d];
        bad = bad || last > kMaxExampleElements;
      }
      if (bad) in.fail(graph + ": input " + std::to_string(j) + " (" + m.str() + ") has sizes or strides out of range");
    }
    check_metadata(*seg->gm, g);
    seg->key = ir::GraphKey(seg->gm->graph());
    seg->effects = ir::effects_of(*seg->gm);
    const std::string kind = in.token();
    bool dynamic = false, symbolic = false;
    std::string static_reason;
    std::shared_ptr<GraphModule> generic;
    DynamicPlan plan;
    if (kind == "dynamic") {
      dynamic = true;
      symbolic = in.flag();
      static_reason = in.str();
      if (!symbolic) generic = st.graph(in.count(), in);
      plan = read_plan();
      auto check_dim = [&](uint32_t input, uint32_t dim) {
        if (input >= placeholders.size() || dim >= placeholders[input]->output_meta().at(0).sizes.size())
          in.fail("a size symbol of " + graph + " is dimension " + std::to_string(dim) + " of input " +
                  std::to_string(input) + ", which the graph does not have");
      };
      for (const SymbolicDim& d : plan.dims) check_dim(d.input, d.dim);
      for (const SizeSymbol& sym : plan.symbols) check_dim(sym.input, sym.dim);
      for (const ExpressionDim& d : plan.expression_dims) check_dim(d.input, d.dim);
      if (symbolic && seg->gm->graph().symbols().empty()) in.fail("a symbolic segment whose graph has no size symbol");
    } else if (kind != "static") {
      in.fail("expected 'static' or 'dynamic', got '" + kind + "'");
    }
    // Compile for this CPU.
    const std::vector<at::Tensor> examples = aot::zeros_like_placeholders(*seg->gm);
    try {
      compile_stage::CompiledGraph compiled = compile_stage::compile_graph(*seg->gm, examples, backend, backend_name, st.name);
      seg->fn = std::move(compiled.fn);
      seg->report = std::move(compiled.report);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, st.what(), ": backend '", backend_name, "' failed to compile graph ", g, ": ",
                  support::error_message(e));
    }
    ++st.num_graphs;
    if (dynamic) {
      const std::string failure = serve_all_sizes(*seg, std::move(plan), symbolic ? nullptr : generic, static_reason,
                                                  [&] { return examples; }, backend, backend_name, st.name);
      TORCH_CHECK(failure.empty(), st.what(), ": ", failure);
    }
    const std::vector<const ir::TensorMeta*> outputs = output_metas(*seg->gm);
    const std::string next = in.token();
    if (next == "end") {
      seg->spec = read_spec();
      for (size_t k = 0; k < seg->spec.undefined.size(); ++k)
        if (seg->spec.undefined[k] >= outputs.size() + seg->spec.undefined.size() ||
            (k > 0 && seg->spec.undefined[k] <= seg->spec.undefined[k - 1]))
          in.fail("the results' undefined tensors are out of order or range");
      return seg;
    }
    if (next != "branch") in.fail("expected 'end' or 'branch', got '" + next + "'");
    if (outputs.size() != seg->output_slots.size())
      in.fail(graph + " has " + std::to_string(outputs.size()) + " outputs, the segment " +
              std::to_string(seg->output_slots.size()));
    for (size_t k = 0; k < outputs.size(); ++k) {
      const uint32_t slot = seg->output_slots[k];
      if (outputs[k] == nullptr || !outputs[k]->defined) in.fail(graph + " passes on an output that is not a tensor");
      if (slot >= slots.size()) slots.resize(slot + 1, SlotInfo{c10::ScalarType::Undefined, 0});
      slots[slot] = SlotInfo{outputs[k]->dtype, outputs[k]->sizes.size()};
    }
    const std::string op = in.str(), overload = in.str();
    const c10::optional<c10::OperatorHandle> handle = c10::Dispatcher::singleton().findSchema({op, overload});
    TORCH_CHECK(handle.has_value(), st.what(), ": a graph break reads with the operator ", op,
                overload.empty() ? "" : "." + overload, ", which this LibTorch does not have (", st.libtorch_note(), ")");
    capture::BranchRecord record{*handle, read_values(in), {}, {}};
    const size_t nt = in.count();
    for (size_t i = 0; i < nt; ++i) {
      const int64_t index = in.num(0, static_cast<int64_t>(record.stack_template.size()) - 1);
      const int64_t slot = in.num(0, static_cast<int64_t>(slots.size()) - 1);
      record.tensor_args.emplace_back(static_cast<uint32_t>(index), static_cast<uint32_t>(slot));
    }
    if (record.stack_template.size() != handle->schema().arguments().size())
      in.fail("the graph break on " + op + " has " + std::to_string(record.stack_template.size()) + " arguments, its schema " +
              std::to_string(handle->schema().arguments().size()));
    seg->branch = std::make_unique<BranchPoint>(std::move(record));
    const size_t nc = in.count();
    for (size_t i = 0; i < nc; ++i) seg->branch->children.push_back(read_segment(depth + 1, slots));
    in.expect("known");
    const size_t nk = in.count();
    std::vector<std::pair<std::vector<c10::IValue>, Segment*>> known;
    for (size_t i = 0; i < nk; ++i) {
      std::vector<c10::IValue> key = read_values(in);
      const size_t c = static_cast<size_t>(in.num(0, static_cast<int64_t>(nc) - 1));
      known.emplace_back(std::move(key), seg->branch->children[c].get());
    }
    if (known.empty()) in.fail("a graph break without any value");
    seg->branch->record.key = known.front().first;
    for (auto it = known.rbegin(); it != known.rend(); ++it) seg->branch->remember(it->first, it->second);
    return seg;
  }

  PortableGuards read_guards() {
    PortableGuards p;
    in.expect("items");
    const size_t ni = in.count();
    for (size_t i = 0; i < ni; ++i) {
      ArgItem it;
      it.kind = static_cast<ArgItem::Kind>(in.num(ArgItem::Tensor, ArgItem::Bool));
      it.i = it.kind == ArgItem::Tensor || it.kind == ArgItem::Bool ? in.num(0, 1)
             : it.kind == ArgItem::TensorList                        ? in.num(0, kMaxCount)
                                                                     : in.num();
      it.d = in.real();
      p.items.push_back(it);
    }
    in.expect("tensors");
    const size_t nt = in.count();
    for (size_t i = 0; i < nt; ++i) {
      PortableGuards::Tensor t;
      p.tensor_names.push_back(in.str());
      t.defined = in.flag();
      if (t.defined) {
        t.dtype = scalar_type(in);
        t.inference = in.flag();
        const size_t nd = static_cast<size_t>(in.num(0, kMaxRank));
        for (size_t d = 0; d < nd; ++d) t.sizes.push_back(in.num(0));
        for (size_t d = 0; d < nd; ++d) t.strides.push_back(in.num(0));
        t.symbolic = static_cast<uint64_t>(in.num(0));
        if (nd < 64 && (t.symbolic >> nd) != 0) in.fail("symbolic dimensions beyond the tensor's rank");
      }
      p.same_as.push_back(static_cast<int32_t>(in.num(-1, static_cast<int64_t>(i) - 1)));
      if (p.same_as.back() >= 0 && !p.tensors.at(p.same_as.back()).defined) in.fail("an input the same as an absent one");
      p.tensors.push_back(std::move(t));
    }
    // Tensor items must account for the tensors.
    size_t expected = 0;
    for (const ArgItem& it : p.items)
      expected += it.kind == ArgItem::Tensor ? static_cast<size_t>(it.i != 0)
                  : it.kind == ArgItem::TensorList ? static_cast<size_t>(std::max<int64_t>(it.i, 0))
                                                   : 0;
    if (expected != nt) in.fail("the arguments have " + std::to_string(expected) + " tensors, the guards " + std::to_string(nt));
    in.expect("symbols");
    const size_t ns = in.count();
    for (size_t i = 0; i < ns; ++i) {
      PortableGuards::SymDim d;
      d.input = static_cast<uint32_t>(in.num(0, static_cast<int64_t>(nt) - 1));
      d.dim = static_cast<uint32_t>(in.num(0, kMaxRank - 1));
      d.first_input = static_cast<uint32_t>(in.num(0, static_cast<int64_t>(nt) - 1));
      d.first_dim = static_cast<uint32_t>(in.num(0, kMaxRank - 1));
      d.min = in.num(0);
      d.max = in.num(d.min);
      d.symbol = in.str();
      if (d.dim >= p.tensors[d.input].sizes.size() || d.first_dim >= p.tensors[d.first_input].sizes.size() ||
          !(p.tensors[d.input].symbolic >> d.dim & 1))
        in.fail("a symbolic dimension that is not one of its tensor's");
      p.sym_dims.push_back(std::move(d));
    }
    in.expect("state");
    p.default_dtype = scalar_type(in);
    p.deterministic = in.flag();
    p.autocast_cpu = in.flag();
    p.autocast_cpu_dtype = scalar_type(in);
    return p;
  }
};

}  // namespace
}  // namespace runtime

void detail::save_package(const runtime::CompiledFunction& state, const PackageInterface& interface,
                          const std::string& path) {
  const std::string bytes = runtime::PackageAccess::save(state, interface);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    TORCH_CHECK(f.good(), "torchcompile::save: cannot open '", tmp, "' for writing");
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.close();
    TORCH_CHECK(f.good(), "torchcompile::save: writing '", tmp, "' failed");
  }
  TORCH_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "torchcompile::save: cannot rename '", tmp, "' to '", path, "'");
  TORCHCOMPILE_LOG(logging::LogKind::Graph, "torchcompile::save(", state.name(), "): wrote ", path, " (", bytes.size(),
                   " bytes)");
}

void save(const CompiledScriptModule& compiled, const std::string& path) {
  const torch::jit::Method method = compiled.module().get_method(compiled.method_name());
  const c10::FunctionSchema& schema = method.function().getSchema();
  std::vector<c10::Argument> args(schema.arguments().begin() + 1, schema.arguments().end());
  const c10::FunctionSchema without_self(schema.name(), schema.overload_name(), std::move(args), schema.returns(),
                                         schema.is_vararg(), schema.is_varret());
  std::ostringstream os;
  os << without_self;
  std::string text = os.str();
  try {
    (void)torch::jit::parseSchema(text);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "torchcompile::save: the method's schema '", text,
                "' cannot be read back (a type a package cannot describe): ", support::error_message(e));
  }
  detail::save_package(compiled.state(), detail::PackageInterface{text}, path);
}

namespace {

std::shared_ptr<detail::LoadedState> load_package(const std::string& path, const CompileOptions& options);

}  // namespace

LoadedModule load(const std::string& path, CompileOptions options) {
  // Every error names the file: the loader's own do; others (an operator's, the unpickler's)
  // get the file's name in front.
  const std::string what = "torchcompile::load('" + path + "')";
  try {
    return LoadedModule(load_package(path, options));
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    if (msg.find(what) != std::string::npos) throw;
    TORCH_CHECK(false, what, ": ", msg);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, what, ": ", e.what());
  }
}

namespace {

std::shared_ptr<detail::LoadedState> load_package(const std::string& path, const CompileOptions& options) {
  auto st = std::make_shared<detail::LoadedState>();
  st->path = path;
  std::string bytes;
  {
    std::ifstream f(path, std::ios::binary);
    TORCH_CHECK(f.good(), st->what(), ": cannot open the file");
    std::ostringstream ss;
    ss << f.rdbuf();
    bytes = ss.str();
  }
  const runtime::Sections sections = runtime::read_container(bytes, path);
  const std::string* manifest = sections.find("manifest");
  TORCH_CHECK(manifest != nullptr, st->what(), ": the package has no manifest");
  runtime::In in(*manifest, st->what() + ": manifest");

  in.expect("libtorch");
  st->libtorch = in.str();
  in.expect("name");
  st->name = in.str();
  in.expect("schema");
  st->schema_text = in.str();
  if (!st->schema_text.empty()) {
    try {
      st->schema = torch::jit::parseSchema(st->schema_text);
    } catch (const std::exception& e) {
      in.fail("bad schema '" + st->schema_text + "'");
    }
    for (const auto& a : st->schema->arguments()) st->arg_names.push_back(a.name());
  }
  in.expect("input_names");
  const size_t nn = in.count();
  for (size_t i = 0; i < nn; ++i) st->input_names.push_back(in.str());
  if (st->arg_names.empty()) st->arg_names = st->input_names;

  // Weights.
  in.expect("weights");
  const size_t nw = in.count();
  std::vector<std::string> names;
  for (size_t i = 0; i < nw; ++i) {
    names.push_back(in.str());
    const std::string kind = in.token();
    if (kind != "parameter" && kind != "buffer" && kind != "constant") in.fail("unknown weight kind '" + kind + "'");
    st->weight_kinds.push_back(kind);
  }
  const std::string* weights = sections.find("weights");
  TORCH_CHECK(weights != nullptr, st->what(), ": the package has no weights section");
  c10::IValue dict;
  try {
    dict = torch::jit::pickle_load(std::vector<char>(weights->begin(), weights->end()));
  } catch (const std::exception& e) {
    TORCH_CHECK(false, st->what(), ": the weights cannot be read: ", support::error_message(e));
  }
  TORCH_CHECK(dict.isGenericDict(), st->what(), ": the weights section is not a dict");
  const c10::Dict<c10::IValue, c10::IValue> d = dict.toGenericDict();
  for (const std::string& n : names) {
    auto it = d.find(c10::IValue(n));
    TORCH_CHECK(it != d.end() && it->value().isTensor(), st->what(), ": the weight '", n, "' is missing");
    st->weights.emplace_back(n, it->value().toTensor());
  }
  TORCH_CHECK(d.size() == names.size(), st->what(), ": the weights section has ", d.size(), " tensors, the manifest ",
              names.size());

  // Graphs and their attributes.
  in.expect("graphs");
  const size_t ng = in.count();
  for (size_t k = 0; k < ng; ++k) {
    const std::string* text = sections.find("graph." + std::to_string(k));
    TORCH_CHECK(text != nullptr, st->what(), ": the package has no graph ", k);
    st->graph_texts.push_back(*text);
    const size_t nb = in.count();
    std::vector<std::pair<std::string, std::string>> b;
    for (size_t i = 0; i < nb; ++i) {
      std::string attr = in.str();
      b.emplace_back(std::move(attr), in.str());
    }
    st->bindings.push_back(std::move(b));
  }
  TORCH_CHECK(sections.items.size() == ng + 2, st->what(), ": the package has ", sections.items.size(),
              " sections; its manifest names ", ng + 2);

  // Entries, compiled for this CPU.
  st->backend_name = options.backend;
  runtime::Loader loader{*st, in,
                         compile_stage::with_mode(options.backend_fn ? options.backend_fn : lookup_backend(options.backend),
                                                  options.backend, options.mode),
                         options.backend};
  in.expect("entries");
  const size_t ne = in.count();
  for (size_t k = 0; k < ne; ++k) {
    in.expect("entry");
    in.num(static_cast<int64_t>(k), static_cast<int64_t>(k));
    auto e = std::make_unique<detail::LoadedState::Entry>();
    const bool eager = in.flag();
    e->eager_reason = in.str();
    e->sizes_note = in.str();
    const runtime::PortableGuards p = loader.read_guards();
    for (const auto& sd : p.sym_dims)
      if (sd.input == sd.first_input && sd.dim == sd.first_dim)
        e->symbols.push_back(sd.symbol + " = size " + std::to_string(sd.dim) + " of '" + p.tensor_names.at(sd.input) +
                             "' in " + runtime::size_range(sd.min, sd.max));
    e->guards = runtime::GuardSet::from_portable(p);
    e->portable = p;
    std::vector<runtime::SlotInfo> slots;
    for (const auto& t : p.tensors)
      slots.push_back(t.defined ? runtime::SlotInfo{t.dtype, t.sizes.size()} : runtime::SlotInfo{c10::ScalarType::Undefined, 0});
    if (!eager) e->root = loader.read_segment(0, std::move(slots));
    st->entries.push_back(std::move(e));
  }
  TORCH_CHECK(in.at_end(), st->what(), ": the manifest has more after its last entry");
  TORCHCOMPILE_LOG(logging::LogKind::Graph, "torchcompile::load(", path, "): ", ne, " entries, ", st->num_graphs,
                   " graphs compiled with backend '", options.backend, "'");
  return st;
}

}  // namespace

// ---- calls ----------------------------------------------------------------------------------

namespace {

// A C++ forward's argument, flattened as the codecs of frontend/codecs.h flatten its C++ type.
void encode_cpp(runtime::CallArgs& ca, const c10::IValue& v, const std::string& what, int depth = 0) {
  TORCH_CHECK(depth < 64, "LoadedModule::forward: ", what, " is nested too deeply");
  if (v.isTensor()) return ca.add(v.toTensor());
  if (v.isNone()) return ca.add(c10::optional<at::Tensor>());
  if (v.isBool()) return ca.add(v.toBool());
  if (v.isInt()) return ca.add(v.toInt());
  if (v.isDouble()) return ca.add(v.toDouble());
  if (v.isList()) {
    const c10::List<c10::IValue> l = v.toList();
    std::vector<at::Tensor> ts;
    for (size_t i = 0; i < l.size(); ++i) {
      const c10::IValue x = l.get(i);
      TORCH_CHECK(x.isTensor(), "LoadedModule::forward: ", what, " is a list of ", x.tagKind(),
                  "; a C++ forward takes lists of tensors (std::vector<Tensor>)");
      ts.push_back(x.toTensor());
    }
    return ca.add(ts);
  }
  if (v.isTuple()) {
    const auto& e = v.toTupleRef().elements();
    for (size_t i = 0; i < e.size(); ++i) encode_cpp(ca, e[i], what + " element " + std::to_string(i), depth + 1);
    return;
  }
  TORCH_CHECK(false, "LoadedModule::forward: ", what, " is a ", v.tagKind(),
              "; a saved C++ forward takes tensors, None, bool, int, float, lists of tensors and tuples of these");
}

// A C++ forward's result from its type (OutputSpec::result_type) and the flattened tensors.
struct ResultBuilder {
  const char* p;
  std::vector<at::Tensor>& flat;
  const runtime::OutputSpec& spec;
  size_t pos = 0, list_pos = 0;

  [[noreturn]] void bad() { TORCH_CHECK(false, "LoadedModule: bad result type '", spec.result_type, "'"); }
  void skip() {  // past one type without building it
    const char c = *p++;
    if (c == 'T') return;
    if (c == 'L' || c == 'O') {
      if (*p++ != '<') bad();
      skip();
      if (*p++ != '>') bad();
      return;
    }
    if (c != '(') bad();
    while (*p != ')') {
      if (*p == '\0') bad();
      skip();
      if (*p == ',') ++p;
    }
    ++p;
  }
  c10::IValue build() {
    const char c = *p++;
    if (c == 'T') return flat.at(pos++);
    if (c == 'L' || c == 'O') {
      if (*p++ != '<') bad();
      const size_t n = spec.list_sizes.at(list_pos++);
      c10::IValue out;
      if (c == 'O') {
        if (n == 0) skip();
        else out = build();
      } else if (*p == 'T' && p[1] == '>') {
        std::vector<at::Tensor> ts;
        for (size_t i = 0; i < n; ++i) ts.push_back(flat.at(pos++));
        ++p;
        out = c10::IValue(std::move(ts));
      } else {
        c10::impl::GenericList l(c10::AnyType::get());
        const char* start = p;
        for (size_t i = 0; i < n; ++i) p = start, l.push_back(build());
        p = start;
        skip();
        out = c10::IValue(std::move(l));
      }
      if (*p++ != '>') bad();
      return out;
    }
    if (c != '(') bad();
    std::vector<c10::IValue> e;
    while (*p != ')') {
      if (*p == '\0') bad();
      e.push_back(build());
      if (*p == ',') ++p;
    }
    ++p;
    return c10::ivalue::Tuple::create(std::move(e));
  }
};

const char* kHowToCapture =
    "A package holds what the compiled object had captured when it was saved: call the compiled module with such "
    "inputs before torchcompile::save (each signature, size and branch to serve), or compile it with dynamic = true "
    "or torchcompile::mark_dynamic so that sizes become symbols.";

}  // namespace

c10::IValue LoadedModule::forward(std::vector<c10::IValue> inputs,
                                  const std::unordered_map<std::string, c10::IValue>& kwargs) const {
  const detail::LoadedState& st = *state_;
  runtime::CallArgs args;
  if (st.schema) {
    st.schema->checkAndNormalizeInputs(inputs, kwargs);
    args = detail::encode_args(inputs, st.arg_names);
  } else {
    TORCH_CHECK(kwargs.empty(), "LoadedModule(", st.name, ")::forward: a saved C++ forward takes no keyword arguments");
    for (size_t i = 0; i < inputs.size(); ++i)
      encode_cpp(args, inputs[i], "argument " + std::to_string(i) +
                                      (i < st.input_names.size() ? " ('" + st.input_names[i] + "')" : std::string()));
  }
  for (size_t i = 0; i < args.tensors.size(); ++i)
    TORCH_CHECK(!args.tensors[i].defined() || !args.tensors[i].requires_grad(), "LoadedModule(", st.name,
                ")::forward: input tensor ", i, " requires grad; a loaded package runs inference (detach the input)");

  std::shared_lock<std::shared_mutex> reading(st.weights_mutex);
  const detail::LoadedState::Entry* entry = nullptr;
  for (const auto& e : st.entries)
    if (e->guards->check(args)) {
      entry = e.get();
      break;
    }
  if (entry == nullptr) {
    std::string reasons;
    for (size_t k = 0; k < st.entries.size(); ++k)
      reasons += "\n  entry " + std::to_string(k) +
                 (st.entries[k]->sizes_note.empty() ? "" : " (" + st.entries[k]->sizes_note + ")") + ": " +
                 st.entries[k]->guards->failure_reason(args);
    TORCH_CHECK(false, "LoadedModule(", st.name, ") from '", st.path,
                "': no graph in the package accepts this call (the signature or the sizes were never captured):",
                reasons, "\n", kHowToCapture);
  }
  TORCH_CHECK(entry->root != nullptr, "LoadedModule(", st.name, ") from '", st.path,
              "': this signature ran eagerly when the package was saved (", entry->eager_reason,
              "), so the package has no graph for it");
  runtime::OutputSpec spec;
  auto on_miss = [&](const runtime::BranchPoint& bp, const std::vector<c10::IValue>& key) {
    std::string seen;
    for (const auto& [k, _] : bp.known) seen += (seen.empty() ? "" : ", ") + capture::key_repr(k);
    TORCH_CHECK(false, "LoadedModule(", st.name, ") from '", st.path, "': the graph break on ", bp.op_name, " read ",
                capture::key_repr(key), ", a value never seen before the package was saved (seen: ", seen,
                "); the module's code decides what follows it, and the package does not hold that code. ",
                kHowToCapture);
  };
  std::vector<at::Tensor> flat = runtime::run_fixed_tree(*entry->root, args.tensors, spec, entry->tree_mutex, on_miss);
  if (st.schema) return detail::rebuild_result(spec.structure, flat);
  ResultBuilder b{spec.result_type, flat, spec};
  return b.build();
}

std::map<std::string, at::Tensor> LoadedModule::state_dict() const {
  std::shared_lock<std::shared_mutex> reading(state_->weights_mutex);
  std::map<std::string, at::Tensor> out;
  for (const auto& [n, t] : state_->weights) out.emplace(n, t);
  return out;
}

void LoadedModule::load_state_dict(const std::map<std::string, at::Tensor>& weights, bool strict) {
  detail::LoadedState& st = *state_;
  for (const auto& [n, t] : weights) {
    const at::Tensor* mine = st.weight(n);
    TORCH_CHECK(mine != nullptr, "LoadedModule(", st.name, ")::load_state_dict: the package has no weight '", n, "'");
    TORCH_CHECK(t.defined() && t.scalar_type() == mine->scalar_type() && t.sizes() == mine->sizes(),
                "LoadedModule(", st.name, ")::load_state_dict: weight '", n, "' expected ", mine->scalar_type(), " ",
                mine->sizes(), ", got ", t.defined() ? c10::toString(t.scalar_type()) : "an undefined tensor", " ",
                t.defined() ? t.sizes() : c10::IntArrayRef());
  }
  if (strict)
    for (const auto& [n, _] : st.weights)
      TORCH_CHECK(weights.count(n), "LoadedModule(", st.name, ")::load_state_dict: weight '", n,
                  "' is missing (strict = false replaces only the weights given)");
  std::unique_lock<std::shared_mutex> writing(st.weights_mutex);
  at::NoGradGuard no_grad;
  for (const auto& [n, t] : weights) const_cast<at::Tensor*>(st.weight(n))->copy_(t);
}

const std::string& LoadedModule::name() const { return state_->name; }
size_t LoadedModule::num_entries() const { return state_->entries.size(); }
size_t LoadedModule::num_graphs() const { return state_->num_graphs; }
std::vector<std::string> LoadedModule::graph_texts() const { return state_->graph_texts; }

std::vector<c10::IValue> LoadedModule::example_inputs(size_t entry) const {
  const detail::LoadedState& st = *state_;
  TORCH_CHECK(entry < st.entries.size(), "LoadedModule(", st.name, ")::example_inputs: the package has ",
              st.entries.size(), " entries");
  const detail::LoadedState::Entry& e = *st.entries[entry];
  const runtime::PortableGuards& p = e.portable;
  std::vector<c10::IValue> out;
  size_t t = 0;
  auto tensor = [&]() {
    TORCH_CHECK(t < p.tensors.size(), "LoadedModule: entry ", entry, " has fewer tensors than its arguments");
    const runtime::PortableGuards::Tensor& g = p.tensors[t++];
    if (!g.defined) return at::Tensor();
    const auto options = at::TensorOptions().dtype(g.dtype);
    if (at::isFloatingType(g.dtype) || at::isComplexType(g.dtype)) return at::randn(g.sizes, options);
    if (g.dtype == at::kBool) return at::rand(g.sizes).gt(0.5);
    return at::zeros(g.sizes, options);
  };
  const size_t n_args = st.schema ? st.schema->arguments().size() : p.items.size();
  TORCH_CHECK(p.items.size() == n_args || !st.schema, "LoadedModule(", st.name, ")::example_inputs: entry ", entry,
              " takes containers (tuples, lists, dicts): give its arguments yourself");
  for (const runtime::ArgItem& it : p.items) {
    switch (it.kind) {
      case runtime::ArgItem::Tensor: out.push_back(it.i ? c10::IValue(tensor()) : c10::IValue()); break;
      case runtime::ArgItem::TensorList: {
        TORCH_CHECK(!st.schema, "LoadedModule(", st.name, ")::example_inputs: entry ", entry,
                    " takes containers (tuples, lists, dicts): give its arguments yourself");
        std::vector<at::Tensor> ts;
        for (int64_t i = 0; i < it.i; ++i) ts.push_back(tensor());
        out.emplace_back(std::move(ts));
        break;
      }
      case runtime::ArgItem::Int: out.emplace_back(it.i); break;
      case runtime::ArgItem::Double: out.emplace_back(it.d); break;
      case runtime::ArgItem::Bool: out.emplace_back(it.i != 0); break;
    }
  }
  return out;
}

std::vector<std::string> LoadedModule::describe() const {
  const detail::LoadedState& st = *state_;
  std::vector<std::string> out;
  out.push_back("package '" + st.path + "': " + st.name + ", written by LibTorch " + st.libtorch + ", compiled with '" +
                st.backend_name + "'");
  for (size_t k = 0; k < st.entries.size(); ++k) {
    const auto& e = *st.entries[k];
    std::string line = "entry " + std::to_string(k) + ": ";
    for (const auto& g : e.guards->describe()) line += g + "; ";
    for (const auto& s : e.symbols) line += s + "; ";
    if (!e.sizes_note.empty()) line += e.sizes_note + "; ";
    if (!e.root) {
      line += "ran eagerly when saved (" + e.eager_reason + ")";
    } else {
      line += std::to_string(e.root->count_graphs()) + " graph(s), " + std::to_string(e.root->count_breaks()) +
              " graph break(s), compiled by " + (e.root->report.backend.empty() ? "?" : e.root->report.backend);
    }
    out.push_back(std::move(line));
  }
  return out;
}

}  // namespace torchcompile
