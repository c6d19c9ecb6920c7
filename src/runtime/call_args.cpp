// Argument flattening (ArgItem, CallArgs in runtime/compiled_function.h): a call's arguments as
// all their tensors in order plus the structure around them, with scalar values, which is what
// the guards check and what a trace takes as its inputs.
#include <torchcompile/runtime/compiled_function.h>

#include "runtime/ivalues.h"

namespace torchcompile::runtime {

bool ArgItem::operator==(const ArgItem& o) const {
  if (kind != o.kind) return false;
  if (kind == Double) return d == o.d || (d != d && o.d != o.d);  // NaN specializes like any value
  return i == o.i;
}

void CallArgs::add(const at::Tensor& t) {
  items.push_back({ArgItem::Tensor, 1});
  tensors.push_back(t);
}

void CallArgs::add(const std::vector<at::Tensor>& ts) {
  items.push_back({ArgItem::TensorList, static_cast<int64_t>(ts.size())});
  tensors.insert(tensors.end(), ts.begin(), ts.end());
}

void CallArgs::add(const c10::optional<at::Tensor>& t) {
  const bool present = t.has_value() && t->defined();
  items.push_back({ArgItem::Tensor, present ? 1 : 0});
  if (present) tensors.push_back(*t);
}

bool same_ivalue(const c10::IValue& a, const c10::IValue& b, bool any_tensor) {
  if (a.tagKind() != b.tagKind()) return false;
  if (a.isNone()) return true;
  if (a.isTensor()) return any_tensor || a.is(b);
  if (a.isInt() || a.isBool() || a.isString() || a.isDevice()) return a == b;
  if (a.isDouble()) return a.toDouble() == b.toDouble() || (a.toDouble() != a.toDouble() && b.toDouble() != b.toDouble());
  if (a.isTuple()) {
    const auto& x = a.toTupleRef().elements();
    const auto& y = b.toTupleRef().elements();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!same_ivalue(x[i], y[i], any_tensor)) return false;
    return true;
  }
  if (a.isList()) {
    const c10::List<c10::IValue> x = a.toList(), y = b.toList();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!same_ivalue(x.get(i), y.get(i), any_tensor)) return false;
    return true;
  }
  if (a.isGenericDict()) {
    const c10::Dict<c10::IValue, c10::IValue> x = a.toGenericDict(), y = b.toGenericDict();
    if (x.size() != y.size()) return false;
    for (auto i = x.begin(), j = y.begin(); i != x.end(); ++i, ++j)
      if (!same_ivalue(i->key(), j->key(), any_tensor) || !same_ivalue(i->value(), j->value(), any_tensor)) return false;
    return true;
  }
  return a.is(b);
}

bool OutputSpec::same_shape(const OutputSpec& o) const {
  return list_sizes == o.list_sizes && undefined == o.undefined && same_ivalue(structure, o.structure, /*any_tensor=*/true);
}

void CallArgs::add(int64_t v) { items.push_back({ArgItem::Int, v}); }
void CallArgs::add(double v) { items.push_back({ArgItem::Double, 0, v}); }
void CallArgs::add(bool v) { items.push_back({ArgItem::Bool, v ? 1 : 0}); }

}  // namespace torchcompile::runtime
