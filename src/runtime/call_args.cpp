// Argument flattening (ArgItem, CallArgs in runtime/compiled_function.h): a call's arguments as
// all their tensors in order plus the structure around them, with scalar values, which is what
// the guards check and what a trace takes as its inputs.
#include <torchcompile/runtime/compiled_function.h>

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

void CallArgs::add(int64_t v) { items.push_back({ArgItem::Int, v}); }
void CallArgs::add(double v) { items.push_back({ArgItem::Double, 0, v}); }
void CallArgs::add(bool v) { items.push_back({ArgItem::Bool, v ? 1 : 0}); }

}  // namespace torchcompile::runtime
