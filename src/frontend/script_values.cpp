// Values of TorchScript calls as the runtime sees them (script_values.h).
#include "frontend/script_values.h"

#include <c10/util/Exception.h>

namespace torchcompile::detail {

// `v` with every tensor replaced by `f(tensor)` (new containers, dict keys included; `v` unchanged).
c10::IValue map_tensors(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& f) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isTuple()) {
    std::vector<c10::IValue> e;
    for (const auto& x : v.toTupleRef().elements()) e.push_back(map_tensors(x, f));
    return c10::ivalue::Tuple::create(std::move(e));
  }
  if (v.isList()) {
    const c10::List<c10::IValue> l = v.toList();
    c10::impl::GenericList out(l.elementType());
    for (size_t i = 0; i < l.size(); ++i) out.push_back(map_tensors(l.get(i), f));
    return out;
  }
  if (v.isGenericDict()) {
    const c10::Dict<c10::IValue, c10::IValue> d = v.toGenericDict();
    c10::impl::GenericDict out(d.keyType(), d.valueType());
    for (auto i = d.begin(); i != d.end(); ++i) {
      c10::IValue key = map_tensors(i->key(), f);
      out.insert(std::move(key), map_tensors(i->value(), f));
    }
    return out;
  }
  return v;
}

namespace {

// Structure tags of a nested argument (CallArgs items after the arguments' own).
enum Tag : int64_t { kAbsent = 0, kTensor, kInt, kDouble, kBool, kString, kTuple, kList, kDict, kDevice };

void describe(const c10::IValue& v, c10::SmallVector<runtime::ArgItem, 8>& tail, std::vector<at::Tensor>& tensors,
              const std::string& what) {
  using runtime::ArgItem;
  auto tag = [&](Tag t) { tail.push_back({ArgItem::Int, t}); };
  auto integer = [&](int64_t i) { tail.push_back({ArgItem::Int, i}); };
  if (v.isNone() || (v.isTensor() && !v.toTensor().defined())) return tag(kAbsent);
  if (v.isTensor()) return tag(kTensor), tensors.push_back(v.toTensor());
  if (v.isInt()) return tag(kInt), integer(v.toInt());
  if (v.isDouble()) return tag(kDouble), tail.push_back({ArgItem::Double, 0, v.toDouble()});
  if (v.isBool()) return tag(kBool), tail.push_back({ArgItem::Bool, v.toBool() ? 1 : 0});
  if (v.isDevice()) return tag(kDevice), integer(static_cast<int64_t>(v.toDevice().type())), integer(v.toDevice().index());
  if (v.isString()) {
    const std::string& s = v.toStringRef();
    tag(kString), integer(static_cast<int64_t>(s.size()));
    for (size_t i = 0; i < s.size(); i += 8) {
      uint64_t word = 0;
      for (size_t j = i; j < s.size() && j < i + 8; ++j) word |= uint64_t{static_cast<unsigned char>(s[j])} << (8 * (j - i));
      integer(static_cast<int64_t>(word));
    }
    return;
  }
  if (v.isTuple()) {
    const auto& e = v.toTupleRef().elements();
    tag(kTuple), integer(static_cast<int64_t>(e.size()));
    for (const auto& x : e) describe(x, tail, tensors, what);
    return;
  }
  if (v.isList()) {
    const c10::List<c10::IValue> l = v.toList();
    tag(kList), integer(static_cast<int64_t>(l.size()));
    for (size_t i = 0; i < l.size(); ++i) describe(l.get(i), tail, tensors, what);
    return;
  }
  if (v.isGenericDict()) {
    const c10::Dict<c10::IValue, c10::IValue> d = v.toGenericDict();
    tag(kDict), integer(static_cast<int64_t>(d.size()));
    for (auto i = d.begin(); i != d.end(); ++i) describe(i->key(), tail, tensors, what), describe(i->value(), tail, tensors, what);
    return;
  }
  TORCH_CHECK(false, "torch::compile(TorchScript module): ", what, " is a ", v.tagKind(),
              "; a compiled method takes tensors, None, bool, int, float, str, devices, and tuples, lists and dicts "
              "of these");
}

}  // namespace

// The call's arguments as the runtime sees them: one item per argument (a tensor, an absent
// tensor, a scalar, or the tensors of a container as a list), then the structure of the
// containers (their kinds, lengths, scalars and strings).
runtime::CallArgs encode_args(const std::vector<c10::IValue>& inputs, const std::vector<std::string>& names) {
  runtime::CallArgs ca;
  c10::SmallVector<runtime::ArgItem, 8> tail;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::IValue& v = inputs[i];
    if (v.isTensor()) {
      ca.add(c10::optional<at::Tensor>(v.toTensor()));
    } else if (v.isNone()) {
      ca.add(c10::optional<at::Tensor>());
    } else if (v.isInt()) {
      ca.add(v.toInt());
    } else if (v.isDouble()) {
      ca.add(v.toDouble());
    } else if (v.isBool()) {
      ca.add(v.toBool());
    } else {
      std::vector<at::Tensor> tensors;
      describe(v, tail, tensors, "argument '" + (i < names.size() ? names[i] : std::to_string(i)) + "'");
      ca.add(tensors);
    }
  }
  ca.items.append(tail.begin(), tail.end());
  return ca;
}


// The result from its structure (its tensors undefined stand-ins) and the flattened tensors.
c10::IValue rebuild_result(const c10::IValue& structure, const std::vector<at::Tensor>& flat) {
  size_t k = 0;
  return map_tensors(structure, [&](const at::Tensor&) { return flat.at(k++); });
}

}  // namespace torchcompile::detail
