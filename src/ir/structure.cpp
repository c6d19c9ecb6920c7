#include <torchcompile/ir/structure.h>

#include <torchcompile/ir/op_properties.h>

#include <c10/util/StringUtil.h>

#include <cstring>
#include <unordered_map>

namespace torchcompile::ir {

namespace {

// Appends tagged fields to the canonical byte string. Every variable-length field carries its
// length, so two different sequences of fields never serialize to the same bytes.
class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}
  void tag(char t) { out_.push_back(t); }
  void u64(uint64_t v) { out_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void f64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    u64(bits);
  }
  void str(const std::string& s) {
    u64(s.size());
    out_ += s;
  }
  void ints(c10::ArrayRef<int64_t> v) {
    u64(v.size());
    for (int64_t x : v) i64(x);
  }

 private:
  std::string& out_;
};

void write_constant(Writer& w, const c10::IValue& v);

// Lists, tuples, devices and anything else.
void write_compound(Writer& w, const c10::IValue& v);

void write_constant(Writer& w, const c10::IValue& v) {
  if (v.isNone()) {
    w.tag('N');
  } else if (v.isBool()) {
    w.tag(v.toBool() ? 'T' : 'F');
  } else if (v.isInt()) {
    w.tag('i');
    w.i64(v.toInt());
  } else if (v.isDouble()) {
    w.tag('d');
    w.f64(v.toDouble());
  } else if (v.isString()) {
    w.tag('s');
    w.str(v.toStringRef());
  } else if (v.isIntList()) {
    w.tag('I');
    w.ints(v.toIntVector());
  } else {
    write_compound(w, v);
  }
}

void write_compound(Writer& w, const c10::IValue& v) {
  if (v.isDoubleList()) {
    w.tag('D');
    const auto list = v.toDoubleVector();
    w.u64(list.size());
    for (double d : list) w.f64(d);
    return;
  }
  if (v.isList()) {
    w.tag('L');
    const auto& list = v.toListRef();
    w.u64(list.size());
    for (const auto& e : list) write_constant(w, e);
    return;
  }
  if (v.isTuple()) {
    w.tag('U');
    const auto& elems = v.toTupleRef().elements();
    w.u64(elems.size());
    for (const auto& e : elems) write_constant(w, e);
    return;
  }
  if (v.isDevice()) {
    w.tag('v');
    w.str(v.toDevice().str());
    return;
  }
  // Anything else (a dtype or layout is an int above; generators, ...): its printed form with
  // its type, which is how the text format identifies it too.
  w.tag('?');
  w.str(v.tagKind());
  w.str(c10::str(v));
}

// `with_sizes` false: the results of an operator whose results' sizes depend on the data
// (node_results_depend_on_data) keep their rank but not their sizes, which the values read in
// that call decided: traces that differ only there compute the same thing.
void write_meta(Writer& w, const TensorMeta& m, bool with_sizes = true) {
  if (!m.defined) return w.tag('u');
  w.tag('m');
  w.i64(static_cast<int64_t>(m.dtype));
  if (with_sizes) {
    w.ints(m.sizes);
    w.ints(m.strides);
  } else {
    w.u64(m.sizes.size());
  }
  w.str(m.device.str());
  w.tag(m.requires_grad ? 'g' : 'n');
}

}  // namespace

GraphKey::GraphKey(const Graph& g) {
  Writer w(canonical_);
  std::unordered_map<const Node*, uint64_t> index;
  auto write_value = [&](const Value& v) {
    auto it = index.find(v.node);
    TORCH_INTERNAL_ASSERT(it != index.end(), "GraphKey: ", v.node->name(), " used before its definition");
    w.u64(it->second);
    w.u64(v.index);
  };
  uint64_t next = 0;
  for (const auto& owned : g.nodes()) {
    const Node& n = *owned;
    w.tag('#');
    w.i64(static_cast<int64_t>(n.kind()));
    // A placeholder is identified by its position, a node by what it calls.
    if (n.kind() != NodeKind::Placeholder) w.str(n.target());
    w.u64(n.args().size());
    for (const Argument& a : n.args()) {
      switch (a.kind()) {
        case Argument::Kind::Constant:
          w.tag('c');
          write_constant(w, a.constant());
          if (a.is_size_expression()) {
            w.tag('s');
            for (const SymExpr& e : a.sym_ints()) w.str(e.str());
          }
          break;
        case Argument::Kind::Value:
          w.tag('v');
          write_value(a.value());
          break;
        case Argument::Kind::ValueList:
          w.tag('l');
          w.u64(a.list().size());
          for (const auto& e : a.list()) {
            if (!e) {
              w.tag('N');
              continue;
            }
            w.tag('v');
            write_value(*e);
          }
          break;
      }
    }
    w.u64(n.output_meta().size());
    const bool sized = !node_results_depend_on_data(n);
    for (const auto& m : n.output_meta()) write_meta(w, m, sized);
    w.ints(std::vector<int64_t>(n.return_counts().begin(), n.return_counts().end()));
    index.emplace(&n, next++);
  }
  hash_ = std::hash<std::string>()(canonical_);
}

uint64_t structural_hash(const Graph& g) { return GraphKey(g).hash(); }

bool structurally_equal(const Graph& a, const Graph& b) { return GraphKey(a) == GraphKey(b); }

}  // namespace torchcompile::ir
