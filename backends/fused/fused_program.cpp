#include "fused_program.h"

#include <torchcompile/ir/op_properties.h>

#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gelu.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <unordered_map>

// at::parallel_for is an `omp parallel` region inline in LibTorch's headers: without OpenMP this
// file's parallel loops would silently run on one thread (CMakeLists.txt adds the flag).
#ifndef _OPENMP
#error "compile this file with OpenMP (at::parallel_for)"
#endif

namespace torchcompile::fused {

using ir::Node;
using ir::NodeKind;
using ir::TensorMeta;
using ir::Value;

const IsaKernels& kernels_of(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return isa_kernels_avx512();
    case Isa::Avx2: return isa_kernels_avx2();
    case Isa::Sse2: return isa_kernels_sse2();
  }
  return isa_kernels_sse2();
}

bool is_float_cpu(const TensorMeta& m) {
  return m.defined && m.dtype == c10::ScalarType::Float && m.device.is_cpu();
}

bool is_bool_cpu(const TensorMeta& m) { return m.defined && m.dtype == c10::ScalarType::Bool && m.device.is_cpu(); }

bool is_contiguous(const TensorMeta& m) {
  if (m.sizes.size() != m.strides.size()) return false;
  int64_t expected = 1;
  for (size_t d = m.sizes.size(); d-- > 0;) {
    if (m.sizes[d] != 1 && m.strides[d] != expected) return false;
    expected *= m.sizes[d];
  }
  return true;
}

TensorSource TensorSource::of(const ir::GraphModule& gm, const Node& n, int64_t* num_placeholders) {
  TensorSource s;
  s.present = true;
  if (n.kind() == NodeKind::Placeholder) {
    s.input = (*num_placeholders)++;
  } else {
    s.attr = &gm.attribute(n.target());
  }
  s.sizes = n.output_meta().at(0).sizes;
  s.dtype = n.output_meta().at(0).dtype;
  return s;
}

std::vector<SymbolicDim> symbolic_dims(const TensorMeta& m, const std::vector<ir::SizeSymbolDecl>& symbols,
                                       const std::string& what, std::string* bad) {
  std::vector<SymbolicDim> dims;
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    SymbolicDim dim;
    dim.value = m.sizes[d];
    if (m.symbolic() && !m.sym_sizes.at(d).constant()) {
      const std::optional<std::string> name = m.sym_sizes[d].as_symbol();
      for (size_t k = 0; name && k < symbols.size(); ++k)
        if (symbols[k].name == *name) dim.symbol = static_cast<int32_t>(k);
      if (dim.symbol < 0 && bad->empty()) *bad = what + " has the size " + m.sym_sizes[d].str();
    }
    dims.push_back(dim);
  }
  return dims;
}

std::vector<int64_t> sizes_at(c10::ArrayRef<SymbolicDim> dims, c10::ArrayRef<int64_t> symbol_values) {
  std::vector<int64_t> sizes;
  sizes.reserve(dims.size());
  for (const SymbolicDim& d : dims) sizes.push_back(d.at(symbol_values));
  return sizes;
}

void read_symbol_values(const std::vector<std::pair<size_t, int64_t>>& bindings, const std::vector<at::Tensor>& inputs,
                        c10::SmallVector<int64_t, 8>& values) {
  for (const auto& [input, dim] : bindings) {
    TORCH_CHECK(input < inputs.size() && inputs[input].defined() && dim < inputs[input].dim(),
                "fused program: input ", input, " does not have the dimension ", dim, " that gives a size symbol");
    values.push_back(inputs[input].sizes()[dim]);
  }
}

std::string size_expression_argument(const ir::GraphModule& gm) {
  for (const auto& np : gm.graph().nodes())
    for (size_t i = 0; i < np->args().size(); ++i)
      if (np->args()[i].is_size_expression())
        return "argument " + std::to_string(i) + " of '" + np->name() +
               "' is a size expression, which one program for every size cannot bake in";
  return "";
}

const at::Tensor& TensorSource::resolve(const std::vector<at::Tensor>& inputs, const char* what) const {
  const at::Tensor* t = attr;
  if (input >= 0) {
    TORCH_CHECK(static_cast<size_t>(input) < inputs.size(), "fused program: expected at least ", input + 1,
                " inputs, got ", inputs.size());
    t = &inputs[input];
  }
  TORCH_CHECK(t->defined() && t->scalar_type() == dtype && t->device().is_cpu() && t->sizes().equals(sizes),
              "fused program: expected ", what, " as a ", dtype, " CPU tensor of sizes ", c10::IntArrayRef(sizes), ", got ",
              t->defined() ? t->toString() + " of sizes " + c10::str(t->sizes()) : std::string("an undefined tensor"));
  return *t;
}

const at::Tensor& TensorSource::resolve_symbolic(const std::vector<at::Tensor>& inputs, const char* what,
                                                 c10::ArrayRef<int64_t> symbol_values) const {
  const at::Tensor* t = attr;
  if (input >= 0) {
    TORCH_CHECK(static_cast<size_t>(input) < inputs.size(), "fused program: expected at least ", input + 1,
                " inputs, got ", inputs.size());
    t = &inputs[input];
  }
  bool ok = t->defined() && t->scalar_type() == dtype && t->device().is_cpu() &&
            static_cast<size_t>(t->dim()) == dims.size();
  for (size_t d = 0; ok && d < dims.size(); ++d) ok = t->sizes()[d] == dims[d].at(symbol_values);
  if (!ok) {
    const std::vector<int64_t> want = sizes_at(dims, symbol_values);
    TORCH_CHECK(false, "fused program: expected ", what, " as a ", dtype, " CPU tensor of sizes ", c10::IntArrayRef(want),
                " (at this call's size symbols), got ",
                t->defined() ? t->toString() + " of sizes " + c10::str(t->sizes()) : std::string("an undefined tensor"));
  }
  return *t;
}

namespace {

// ---- lowering of ATen operators to tile instructions ---------------------------------------------

// A tile instruction over virtual registers (one per value; assigned to real ones later).
struct VInstr {
  TileOp op;
  uint32_t dst, a, b;
  float p0, p1;
  uint32_t c = 0;
  uint16_t sub = 0;
};

struct Emitter {
  std::vector<VInstr> code;
  std::unordered_map<Value, uint32_t, ir::ValueHash> vreg_of;
  uint32_t next_vreg = 0;

  uint32_t arg(const Node& n, size_t i) const { return vreg_of.at(n.args().at(i).value()); }
  uint32_t emit(TileOp op, uint32_t a, uint32_t b = 0, float p0 = 0, float p1 = 0, uint32_t c = 0, uint16_t sub = 0) {
    const uint32_t d = next_vreg++;
    code.push_back({op, d, a, b, p0, p1, c, sub});
    return d;
  }
};

// A lowering checks a node's constant arguments and, given an emitter, emits its instructions
// and returns the virtual register of its result. Returns nullopt (without emitting) when the
// constants are not supported.
using Lower = std::optional<uint32_t> (*)(const Node& n, Emitter* e);

std::optional<double> constant_number(const Node& n, size_t i) {
  const auto& a = n.args().at(i);
  if (!a.is_constant()) return std::nullopt;
  const c10::IValue& v = a.constant();
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  return std::nullopt;
}

bool constant_none(const Node& n, size_t i) {
  const auto& a = n.args().at(i);
  return a.is_constant() && a.constant().isNone();
}

std::optional<std::string> constant_string(const Node& n, size_t i) {
  const auto& a = n.args().at(i);
  if (!a.is_constant() || !a.constant().isString()) return std::nullopt;
  return a.constant().toStringRef();
}

// The scalar operand of a float32 operation, as ATen converts it (to float).
float as_float(double v) { return static_cast<float>(v); }

template <TileOp Op>
std::optional<uint32_t> unary(const Node& n, Emitter* e) {
  return e ? e->emit(Op, e->arg(n, 0)) : 0u;
}

template <TileOp Op>
std::optional<uint32_t> binary(const Node& n, Emitter* e) {
  return e ? e->emit(Op, e->arg(n, 0), e->arg(n, 1)) : 0u;
}

// add / sub (.Tensor): self + sign * alpha * other.
template <int Sign>
std::optional<uint32_t> add_tensor(const Node& n, Emitter* e) {
  auto alpha = constant_number(n, 2);
  if (!alpha) return std::nullopt;
  if (!e) return 0u;
  if (*alpha == 1) return e->emit(Sign > 0 ? TileOp::Add : TileOp::Sub, e->arg(n, 0), e->arg(n, 1));
  return e->emit(TileOp::AddMul, e->arg(n, 0), e->arg(n, 1), as_float(Sign * *alpha));
}

// add / sub (.Scalar): self + sign * alpha * other, the product of the two constants rounded once.
template <int Sign>
std::optional<uint32_t> add_scalar(const Node& n, Emitter* e) {
  auto other = constant_number(n, 1), alpha = constant_number(n, 2);
  if (!other || !alpha) return std::nullopt;
  if (!e) return 0u;
  return e->emit(TileOp::AddS, e->arg(n, 0), 0, as_float(Sign * *alpha * *other));
}

// rsub: other - alpha * self.
std::optional<uint32_t> rsub_tensor(const Node& n, Emitter* e) {
  auto alpha = constant_number(n, 2);
  if (!alpha) return std::nullopt;
  if (!e) return 0u;
  if (*alpha == 1) return e->emit(TileOp::Sub, e->arg(n, 1), e->arg(n, 0));
  return e->emit(TileOp::AddMul, e->arg(n, 1), e->arg(n, 0), as_float(-*alpha));
}

std::optional<uint32_t> rsub_scalar(const Node& n, Emitter* e) {
  auto other = constant_number(n, 1), alpha = constant_number(n, 2);
  if (!other || !alpha) return std::nullopt;
  if (!e) return 0u;
  uint32_t self = e->arg(n, 0);
  if (*alpha != 1) self = e->emit(TileOp::MulS, self, 0, as_float(*alpha));
  return e->emit(TileOp::RSubS, self, 0, as_float(*other));
}

template <TileOp Op>
std::optional<uint32_t> with_scalar(const Node& n, Emitter* e) {
  auto s = constant_number(n, 1);
  if (!s) return std::nullopt;
  return e ? e->emit(Op, e->arg(n, 0), 0, as_float(*s)) : 0u;
}

// gelu (erf form) at +inf differs between ATen's CPU kernels: +inf from LibTorch 1.13's, and from
// 2.6's AVX2 kernel, NaN from 2.6's AVX-512 one. Which one eager runs depends on the LibTorch
// version and on the CPU, so the fused gelu asks the running LibTorch once (on a tensor long
// enough for its vectorized path) and follows it.
bool eager_gelu_of_infinity_is_nan() {
  static const bool nan = [] {
    at::NoGradGuard no_grad;
    const at::Tensor y = at::gelu(at::full({64}, std::numeric_limits<float>::infinity())).contiguous();
    return std::isnan(y.data_ptr<float>()[0]);
  }();
  return nan;
}

std::optional<uint32_t> gelu(const Node& n, Emitter* e) {
  auto approximate = n.args().size() > 1 ? constant_string(n, 1) : std::string("none");
  if (!approximate || (*approximate != "none" && *approximate != "tanh")) return std::nullopt;
  if (!e) return 0u;
  if (*approximate == "tanh") return e->emit(TileOp::GeluTanh, e->arg(n, 0));
  return e->emit(TileOp::GeluErf, e->arg(n, 0), 0, eager_gelu_of_infinity_is_nan() ? 1.f : 0.f);
}

std::optional<uint32_t> gelu_backward(const Node& n, Emitter* e) {
  auto approximate = n.args().size() > 2 ? constant_string(n, 2) : std::string("none");
  if (!approximate || *approximate != "none") return std::nullopt;
  return e ? e->emit(TileOp::GeluErfBackward, e->arg(n, 0), e->arg(n, 1)) : 0u;
}

std::optional<uint32_t> clamp_between(const Node& n, Emitter* e, std::optional<double> lo, std::optional<double> hi) {
  if (!e) return 0u;
  const float inf = std::numeric_limits<float>::infinity();
  return e->emit(TileOp::Clamp, e->arg(n, 0), 0, lo ? as_float(*lo) : -inf, hi ? as_float(*hi) : inf);
}

std::optional<uint32_t> clamp(const Node& n, Emitter* e) {
  auto lo = constant_number(n, 1), hi = constant_number(n, 2);
  if ((!lo && !constant_none(n, 1)) || (!hi && !constant_none(n, 2)) || (!lo && !hi)) return std::nullopt;
  return clamp_between(n, e, lo, hi);
}

std::optional<uint32_t> clamp_min(const Node& n, Emitter* e) {
  auto lo = constant_number(n, 1);
  return lo ? clamp_between(n, e, lo, std::nullopt) : std::nullopt;
}

std::optional<uint32_t> clamp_max(const Node& n, Emitter* e) {
  auto hi = constant_number(n, 1);
  return hi ? clamp_between(n, e, std::nullopt, hi) : std::nullopt;
}

std::optional<uint32_t> hardtanh(const Node& n, Emitter* e) {
  auto lo = constant_number(n, 1), hi = constant_number(n, 2);
  return lo && hi ? clamp_between(n, e, lo, hi) : std::nullopt;
}

std::optional<uint32_t> relu6(const Node& n, Emitter* e) { return clamp_between(n, e, 0.0, 6.0); }

std::optional<uint32_t> leaky_relu(const Node& n, Emitter* e) {
  auto slope = constant_number(n, 1);
  if (!slope) return std::nullopt;
  return e ? e->emit(TileOp::LeakyRelu, e->arg(n, 0), 0, as_float(*slope)) : 0u;
}

// pow with the exponents ATen itself computes without pow(): x*x, x*x*x, sqrt, 1/sqrt, 1/x.
std::optional<uint32_t> pow_scalar(const Node& n, Emitter* e) {
  auto p = constant_number(n, 1);
  if (!p) return std::nullopt;
  TileOp op;
  if (*p == 2) {
    op = TileOp::Square;
  } else if (*p == 3) {
    op = TileOp::Cube;
  } else if (*p == 0.5) {
    op = TileOp::Sqrt;
  } else if (*p == -0.5) {
    op = TileOp::Rsqrt;
  } else if (*p == -1) {
    op = TileOp::Reciprocal;
  } else if (*p == 1) {
    op = TileOp::Copy;
  } else {
    return std::nullopt;
  }
  return e ? e->emit(op, e->arg(n, 0)) : 0u;
}

std::optional<uint32_t> threshold_backward(const Node& n, Emitter* e) {
  auto t = constant_number(n, 2);
  if (!t) return std::nullopt;
  return e ? e->emit(TileOp::ThresholdBackward, e->arg(n, 0), e->arg(n, 1), as_float(*t)) : 0u;
}

// Comparisons: a mask (1 or 0) per element; ATen's result is bool.
template <CmpKind K>
std::optional<uint32_t> compare_tensor(const Node& n, Emitter* e) {
  return e ? e->emit(TileOp::Cmp, e->arg(n, 0), e->arg(n, 1), 0, 0, 0, static_cast<uint16_t>(K)) : 0u;
}
template <CmpKind K>
std::optional<uint32_t> compare_scalar(const Node& n, Emitter* e) {
  auto s = constant_number(n, 1);
  if (!s) return std::nullopt;
  return e ? e->emit(TileOp::CmpS, e->arg(n, 0), 0, as_float(*s), 0, 0, static_cast<uint16_t>(K)) : 0u;
}

// masked_fill(self, mask, value) = mask ? value : self.
std::optional<uint32_t> masked_fill_scalar(const Node& n, Emitter* e) {
  auto v = constant_number(n, 2);
  if (!v) return std::nullopt;
  return e ? e->emit(TileOp::MaskedFillS, e->arg(n, 0), e->arg(n, 1), as_float(*v)) : 0u;
}

// where(cond, self, other) = cond ? self : other, either of self and other possibly a scalar.
std::optional<uint32_t> where_self(const Node& n, Emitter* e) {
  return e ? e->emit(TileOp::Where, e->arg(n, 0), e->arg(n, 1), 0, 0, e->arg(n, 2)) : 0u;
}
std::optional<uint32_t> where_scalar_self(const Node& n, Emitter* e) {
  auto s = constant_number(n, 1);
  if (!s) return std::nullopt;
  return e ? e->emit(TileOp::MaskedFillS, e->arg(n, 2), e->arg(n, 0), as_float(*s)) : 0u;
}
std::optional<uint32_t> where_scalar_other(const Node& n, Emitter* e) {
  auto s = constant_number(n, 2);
  if (!s) return std::nullopt;
  if (!e) return 0u;
  const uint32_t not_cond = e->emit(TileOp::LogicalNot, e->arg(n, 0));
  return e->emit(TileOp::MaskedFillS, e->arg(n, 1), not_cond, as_float(*s));
}

bool is_contiguous_value(const Node& n, size_t i) {
  const auto& a = n.args().at(i);
  return a.is_value() && is_contiguous(a.value().node->output_meta().at(a.value().index));
}

// contiguous / clone into contiguous memory: a copy, the input read through its strides (a
// transposed or sliced tensor is gathered tile by tile). `contiguous` of a contiguous tensor is
// the tensor itself (an alias eager code may write through): left to the interpreter.
std::optional<uint32_t> contiguous_copy(const Node& n, Emitter* e) {
  if (is_contiguous_value(n, 0) || !is_contiguous(n.output_meta().at(0))) return std::nullopt;
  return e ? e->emit(TileOp::Copy, e->arg(n, 0)) : 0u;
}
std::optional<uint32_t> clone_copy(const Node& n, Emitter* e) {
  if (!is_contiguous(n.output_meta().at(0))) return std::nullopt;  // a clone that keeps other strides
  return e ? e->emit(TileOp::Copy, e->arg(n, 0)) : 0u;
}

// An operator's lowering, and whether its result is a mask (ATen: bool; every other operator
// must give float32).
struct Lowering {
  Lower lower;
  bool gives_mask = false;
};

const std::unordered_map<std::string, Lowering>& lowerings() {
  static const std::unordered_map<std::string, Lowering> table = {
      {"aten::add.Tensor", {&add_tensor<1>}},
      {"aten::sub.Tensor", {&add_tensor<-1>}},
      {"aten::add.Scalar", {&add_scalar<1>}},
      {"aten::sub.Scalar", {&add_scalar<-1>}},
      {"aten::rsub.Tensor", {&rsub_tensor}},
      {"aten::rsub.Scalar", {&rsub_scalar}},
      {"aten::mul.Tensor", {&binary<TileOp::Mul>}},
      {"aten::mul.Scalar", {&with_scalar<TileOp::MulS>}},
      {"aten::div.Tensor", {&binary<TileOp::Div>}},
      {"aten::div.Scalar", {&with_scalar<TileOp::DivS>}},
      {"aten::maximum", {&binary<TileOp::Max>}},
      {"aten::minimum", {&binary<TileOp::Min>}},
      {"aten::neg", {&unary<TileOp::Neg>}},
      {"aten::abs", {&unary<TileOp::Abs>}},
      {"aten::relu", {&unary<TileOp::Relu>}},
      {"aten::sigmoid", {&unary<TileOp::Sigmoid>}},
      {"aten::tanh", {&unary<TileOp::Tanh>}},
      {"aten::exp", {&unary<TileOp::Exp>}},
      {"aten::expm1", {&unary<TileOp::Expm1>}},
      {"aten::log", {&unary<TileOp::Log>}},
      {"aten::log1p", {&unary<TileOp::Log1p>}},
      {"aten::sqrt", {&unary<TileOp::Sqrt>}},
      {"aten::rsqrt", {&unary<TileOp::Rsqrt>}},
      {"aten::reciprocal", {&unary<TileOp::Reciprocal>}},
      {"aten::sin", {&unary<TileOp::Sin>}},
      {"aten::cos", {&unary<TileOp::Cos>}},
      {"aten::erf", {&unary<TileOp::Erf>}},
      {"aten::silu", {&unary<TileOp::Silu>}},
      {"aten::hardsigmoid", {&unary<TileOp::Hardsigmoid>}},
      {"aten::hardswish", {&unary<TileOp::Hardswish>}},
      {"aten::gelu", {&gelu}},
      {"aten::leaky_relu", {&leaky_relu}},
      {"aten::hardtanh", {&hardtanh}},
      {"aten::relu6", {&relu6}},
      {"aten::clamp", {&clamp}},
      {"aten::clamp_min", {&clamp_min}},
      {"aten::clamp_max", {&clamp_max}},
      {"aten::pow.Tensor_Scalar", {&pow_scalar}},
      {"aten::threshold_backward", {&threshold_backward}},
      {"aten::sigmoid_backward", {&binary<TileOp::SigmoidBackward>}},
      {"aten::tanh_backward", {&binary<TileOp::TanhBackward>}},
      {"aten::gelu_backward", {&gelu_backward}},
      {"aten::contiguous", {&contiguous_copy}},
      {"aten::clone", {&clone_copy}},
      {"aten::lt.Tensor", {&compare_tensor<CmpKind::Lt>, true}},
      {"aten::le.Tensor", {&compare_tensor<CmpKind::Le>, true}},
      {"aten::gt.Tensor", {&compare_tensor<CmpKind::Gt>, true}},
      {"aten::ge.Tensor", {&compare_tensor<CmpKind::Ge>, true}},
      {"aten::eq.Tensor", {&compare_tensor<CmpKind::Eq>, true}},
      {"aten::ne.Tensor", {&compare_tensor<CmpKind::Ne>, true}},
      {"aten::lt.Scalar", {&compare_scalar<CmpKind::Lt>, true}},
      {"aten::le.Scalar", {&compare_scalar<CmpKind::Le>, true}},
      {"aten::gt.Scalar", {&compare_scalar<CmpKind::Gt>, true}},
      {"aten::ge.Scalar", {&compare_scalar<CmpKind::Ge>, true}},
      {"aten::eq.Scalar", {&compare_scalar<CmpKind::Eq>, true}},
      {"aten::ne.Scalar", {&compare_scalar<CmpKind::Ne>, true}},
      {"aten::logical_not", {&unary<TileOp::LogicalNot>, true}},
      {"aten::logical_and", {&binary<TileOp::LogicalAnd>, true}},
      {"aten::logical_or", {&binary<TileOp::LogicalOr>, true}},
      {"aten::masked_fill.Scalar", {&masked_fill_scalar}},
      {"aten::where.self", {&where_self}},
      {"aten::where.ScalarSelf", {&where_scalar_self}},
      {"aten::where.ScalarOther", {&where_scalar_other}},
  };
  return table;
}

const TensorMeta& meta_of(const Value& v) { return v.node->output_meta().at(v.index); }

std::optional<std::vector<int64_t>> broadcast(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  try {
    return at::infer_size(a, b);
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}

constexpr size_t kMaxRank = 8;
constexpr size_t kMaxRegs = 1024;

// Peephole merges over the virtual code, each saving one pass over the tile; results are rounded
// as the separate ATen operations round them.
//  - x * a followed by + b on the product alone (a scale and a shift, as x * 1.5 + 0.25): MulAddS;
//  - two tensor arithmetic operations (+ - * /) where the second is the only use of the first's
//    result (as M2's sigmoid(...) * x - tanh(x)): Arith2.
void merge_arithmetic(std::vector<VInstr>* code, const std::vector<uint32_t>& output_vregs, uint32_t num_vregs) {
  std::vector<uint32_t> uses(num_vregs, 0);
  std::vector<int64_t> producer(num_vregs, -1);
  for (size_t k = 0; k < code->size(); ++k) {
    const VInstr& vi = (*code)[k];
    const int n = operand_count(vi.op);
    ++uses[vi.a];
    if (n > 1) ++uses[vi.b];
    if (n > 2) ++uses[vi.c];
    producer[vi.dst] = static_cast<int64_t>(k);
  }
  for (uint32_t v : output_vregs) ++uses[v];
  auto arith_of = [](TileOp op) -> std::optional<Arith> {
    switch (op) {
      case TileOp::Add: return Arith::Add;
      case TileOp::Sub: return Arith::Sub;
      case TileOp::Mul: return Arith::Mul;
      case TileOp::Div: return Arith::Div;
      default: return std::nullopt;
    }
  };
  // The single-use result `v`'s producer, if it is an instruction of kind `op` (not yet merged).
  std::vector<bool> dead(code->size(), false);
  auto single_use_producer = [&](uint32_t v) -> VInstr* {
    if (uses[v] != 1 || producer[v] < 0 || dead[static_cast<size_t>(producer[v])]) return nullptr;
    return &(*code)[static_cast<size_t>(producer[v])];
  };
  for (VInstr& vi : *code) {
    if (vi.op == TileOp::AddS) {
      VInstr* mul = single_use_producer(vi.a);
      if (!mul || mul->op != TileOp::MulS) continue;
      dead[static_cast<size_t>(producer[vi.a])] = true;
      vi = {TileOp::MulAddS, vi.dst, mul->a, 0, mul->p0, vi.p0};
      continue;
    }
    const auto op2 = arith_of(vi.op);
    if (!op2) continue;
    for (const bool t_right : {false, true}) {
      const uint32_t t = t_right ? vi.b : vi.a;
      VInstr* first = single_use_producer(t);
      const auto op1 = first ? arith_of(first->op) : std::nullopt;
      if (!op1) continue;
      dead[static_cast<size_t>(producer[t])] = true;
      VInstr merged{TileOp::Arith2, vi.dst, first->a, first->b, 0, 0, t_right ? vi.a : vi.b,
                    arith2_code(*op1, *op2, t_right)};
      vi = merged;
      break;
    }
  }
  size_t kept = 0;
  for (size_t k = 0; k < code->size(); ++k)
    if (!dead[k]) (*code)[kept++] = (*code)[k];
  code->resize(kept);
}

}  // namespace

bool fusible(const Node& n) {
  if (n.kind() != NodeKind::CallFunction) return false;
  const auto& table = lowerings();
  auto it = table.find(n.target());
  if (it == table.end()) return false;
  if (n.num_outputs() != 1) return false;
  const TensorMeta& out = n.output_meta()[0];
  if (!(it->second.gives_mask ? is_bool_cpu(out) : is_float_cpu(out))) return false;
  if (out.sizes.size() > kMaxRank) return false;
  for (const auto& a : n.args()) {
    if (a.is_list()) return false;
    if (a.is_value() && !is_float_cpu(meta_of(a.value())) && !is_bool_cpu(meta_of(a.value()))) return false;
  }
  return it->second.lower(n, nullptr).has_value();
}

std::shared_ptr<const FusedProgram> FusedProgram::build(const ir::GraphModule& gm, std::string* why) {
  auto fail = [&](std::string reason) -> std::shared_ptr<const FusedProgram> {
    if (why) *why = std::move(reason);
    return nullptr;
  };
  std::shared_ptr<FusedProgram> p(new FusedProgram());
  Emitter e;
  std::vector<Value> outputs;
  std::vector<int64_t> shape;
  bool have_shape = false;
  int64_t num_inputs = 0;
  for (const auto& np : gm.graph().nodes()) {
    const Node& n = *np;
    switch (n.kind()) {
      case NodeKind::Placeholder:
      case NodeKind::GetAttr: {
        Operand op;
        op.source = TensorSource::of(gm, n, &num_inputs);
        const TensorMeta& m = n.output_meta().at(0);
        op.meta = &m;
        if (!n.has_uses()) break;
        if (!is_float_cpu(m) && !is_bool_cpu(m)) {
          return fail("input '" + n.name() + "' is not a float32 or bool CPU tensor");
        }
        if (m.sizes.size() > kMaxRank) return fail("input '" + n.name() + "' has more than 8 dimensions");
        op.vreg = e.next_vreg++;
        e.vreg_of[Value{const_cast<Node*>(&n), 0}] = op.vreg;
        p->operands_.push_back(std::move(op));
        break;
      }
      case NodeKind::CallFunction: {
        if (!fusible(n)) return fail("'" + n.name() + "' (" + n.target() + ") is not fusible");
        auto r = lowerings().at(n.target()).lower(n, &e);
        e.vreg_of[Value{const_cast<Node*>(&n), 0}] = *r;
        const std::string& t = n.target();  // `aten::mul.Scalar` -> `mul`
        p->op_names_.push_back(t.substr(t.find("::") + 2, t.find('.') == std::string::npos ? std::string::npos
                                                                                               : t.find('.') - t.find("::") - 2));
        const auto& sizes = n.output_meta()[0].sizes;
        if (!have_shape) {
          shape = sizes;
          have_shape = true;
        } else {
          auto b = broadcast(shape, sizes);
          if (!b) return fail("the shapes of its operators do not broadcast together");
          shape = *b;
        }
        break;
      }
      case NodeKind::CallModule: return fail("the graph has a call_module node ('" + n.name() + "')");
      case NodeKind::Output:
        for (const auto& v : n.args().at(0).list()) {
          if (!v) return fail("the graph returns None");
          outputs.push_back(*v);
        }
        break;
    }
  }
  if (e.code.empty()) return fail("nothing to fuse");
  if (!gm.graph().symbols().empty()) {
    // The program bakes the operators' scalar arguments in.
    if (std::string why = size_expression_argument(gm); !why.empty()) return fail(why);
    // Every size a constant or one symbol, evaluated per call.
    const auto& symbols = gm.graph().symbols();
    std::string bad;
    auto dims_of = [&](const TensorMeta& m, const std::string& what) { return symbolic_dims(m, symbols, what, &bad); };
    p->symbolic_ = true;
    p->bindings_ = gm.graph().symbol_bindings();
    for (const auto& np : gm.graph().nodes()) {
      const Node& n = *np;
      if (n.kind() == NodeKind::CallFunction) {
        const TensorMeta& m = n.output_meta().at(0);
        std::vector<SymbolicDim> dims = dims_of(m, "'" + n.name() + "'");
        if (m.sizes != shape) continue;
        auto same = [](const SymbolicDim& a, const SymbolicDim& b) { return a.symbol == b.symbol && a.value == b.value; };
        if (!p->shape_dims_.empty() && !std::equal(dims.begin(), dims.end(), p->shape_dims_.begin(), same) && bad.empty())
          bad = "'" + n.name() + "' has the iteration shape's sizes as other expressions";
        p->shape_dims_ = std::move(dims);
      }
    }
    for (auto& op : p->operands_)
      op.source.dims =
          dims_of(*op.meta, op.source.input >= 0 ? "input " + std::to_string(op.source.input) : "an attribute");
    if (!bad.empty()) return fail("a size is an expression of the symbols, not one symbol (" + bad + ")");
    if (p->shape_dims_.size() != shape.size()) return fail("no operator result has the iteration shape");
  }
  p->shape_ = shape;
  p->numel_ = 1;
  for (int64_t s : shape) p->numel_ *= s;
  if (p->numel_ == 0) return fail("its tensors are empty");
  for (const auto& op : p->operands_) {
    auto b = broadcast(op.source.sizes, shape);
    if (!b || *b != shape) return fail("an input does not broadcast to the iteration shape");
  }

  // Outputs: computed values of the iteration shape, contiguous as eager makes them.
  std::unordered_map<uint32_t, int64_t> operand_of;  // vreg -> operand index
  for (size_t i = 0; i < p->operands_.size(); ++i) operand_of[p->operands_[i].vreg] = static_cast<int64_t>(i);
  std::unordered_map<uint32_t, uint16_t> output_reg_of;  // vreg -> output register slot
  std::vector<uint32_t> output_vregs;
  for (const Value& v : outputs) {
    const uint32_t vreg = e.vreg_of.at(v);
    Output out;
    if (operand_of.count(vreg)) {
      out.operand = operand_of.at(vreg);
    } else {
      const TensorMeta& m = meta_of(v);
      if (m.sizes != shape) return fail("output '" + v.node->name() + "' does not have the iteration shape");
      if (!is_contiguous(m)) return fail("output '" + v.node->name() + "' is not contiguous");
      auto it = output_reg_of.find(vreg);
      if (it == output_reg_of.end()) {
        it = output_reg_of.emplace(vreg, static_cast<uint16_t>(output_vregs.size())).first;
        output_vregs.push_back(vreg);
        p->output_is_mask_.push_back(m.dtype == c10::ScalarType::Bool);
      }
      out.reg = it->second;  // an output slot for now; a register number below
    }
    p->outputs_.push_back(out);
  }

  merge_arithmetic(&e.code, output_vregs, e.next_vreg);

  // Registers: operands first, then outputs (bound to memory), then scratch by liveness.
  const size_t num_operands = p->operands_.size();
  const size_t num_outputs = output_vregs.size();
  if (num_operands + num_outputs >= kMaxRegs) return fail("too many inputs and outputs");
  std::vector<size_t> last_use(e.next_vreg, 0);
  auto operands = [](const VInstr& vi) {
    const int n = operand_count(vi.op);
    return std::array<uint32_t, 3>{vi.a, n > 1 ? vi.b : vi.a, n > 2 ? vi.c : vi.a};
  };
  for (size_t k = 0; k < e.code.size(); ++k)
    for (uint32_t src : operands(e.code[k])) last_use[src] = k;
  std::vector<int64_t> phys(e.next_vreg, -1);
  for (size_t i = 0; i < num_operands; ++i) phys[p->operands_[i].vreg] = static_cast<int64_t>(i);
  for (size_t o = 0; o < num_outputs; ++o) phys[output_vregs[o]] = static_cast<int64_t>(num_operands + o);
  std::vector<uint16_t> free_regs;
  size_t num_scratch = 0;
  const size_t first_scratch = num_operands + num_outputs;
  auto is_scratch = [&](uint32_t v) { return phys[v] >= static_cast<int64_t>(first_scratch); };
  for (size_t k = 0; k < e.code.size(); ++k) {
    const VInstr& vi = e.code[k];
    // Operands dying here free their register first: the destination may reuse it (every
    // instruction reads element i before writing element i).
    const std::array<uint32_t, 3> srcs = operands(vi);
    for (uint32_t src : srcs)
      if (is_scratch(src) && last_use[src] == k &&
          std::find(free_regs.begin(), free_regs.end(), phys[src]) == free_regs.end())
        free_regs.push_back(static_cast<uint16_t>(phys[src]));
    if (phys[vi.dst] < 0) {
      if (!free_regs.empty()) {
        phys[vi.dst] = free_regs.back();
        free_regs.pop_back();
      } else {
        if (first_scratch + num_scratch >= kMaxRegs) return fail("too many live values");
        phys[vi.dst] = static_cast<int64_t>(first_scratch + num_scratch++);
      }
    }
    p->code_.push_back({vi.op, static_cast<uint16_t>(phys[vi.dst]), static_cast<uint16_t>(phys[srcs[0]]),
                        static_cast<uint16_t>(phys[srcs[1]]), static_cast<uint16_t>(phys[srcs[2]]), vi.sub, vi.p0,
                        vi.p1});
  }
  for (auto& out : p->outputs_)
    if (out.reg >= 0) out.reg += static_cast<int64_t>(num_operands);
  for (size_t o = 0; o < num_outputs; ++o) p->output_regs_.push_back(static_cast<uint16_t>(num_operands + o));
  for (size_t i = 0; i < num_operands; ++i) p->operands_[i].reg = static_cast<uint16_t>(i);
  p->num_scratch_ = num_scratch;
  p->num_regs_ = first_scratch + num_scratch;
  if (p->code_.size() == 1 && p->code_[0].op == TileOp::Copy && p->code_[0].a < num_operands && num_outputs == 1 &&
      !p->output_is_mask_[0] && p->operands_[p->code_[0].a].source.dtype == c10::ScalarType::Float)
    p->copy_of_ = p->code_[0].a;

  // Tiles: 256 to 512 floats per register, every buffer of one tile (scratch registers, and
  // operands that must be gathered) together in at most 16 KiB where that allows 256. Small tiles
  // keep the streams of inputs and outputs moving while the arithmetic runs: a single-thread M2
  // (16 MiB in, 16 MiB out) ran 1.3x slower with tiles of 2048 floats than with 256-512.
  const size_t buffers = std::max<size_t>(1, num_operands + num_scratch + num_outputs);
  p->tile_ = std::clamp<int64_t>(static_cast<int64_t>(4096 / buffers) / 64 * 64, 256, 512);
  p->isa_ = selected_isa();
  p->run_tile_ = kernels_of(p->isa_).run_tile;
  return p;
}

namespace {

// Per-thread tile buffers, grown on demand and reused from call to call.
float* thread_buffers(size_t floats) {
  struct Buffers {
    float* data = nullptr;
    size_t capacity = 0;
    ~Buffers() { std::free(data); }
  };
  thread_local Buffers b;
  if (floats > b.capacity) {
    std::free(b.data);
    const size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
    b.data = static_cast<float*>(std::aligned_alloc(64, bytes));
    TORCH_CHECK(b.data, "fused backend: cannot allocate ", bytes, " bytes of tile buffers");
    b.capacity = floats;
  }
  return b.data;
}

// How one operand is read: in place (`flat`: contiguous with the iteration shape), or gathered
// through broadcast strides (0 along broadcast dimensions).
struct OperandView {
  const float* base = nullptr;
  const bool* mask = nullptr;  // a bool tensor (then `base` is null): gathered as 1 and 0
  bool flat = false;
  bool constant = false;  // every stride 0: one value
  c10::SmallVector<int64_t, kMaxRank> strides;
};

// Copy elements [start, start + n) of the iteration space, read from `base` through v's strides,
// into dst (as floats).
template <class T>
void gather_from(float* dst, const T* base, const OperandView& v, c10::IntArrayRef shape, int64_t start,
                 int64_t n) {
  const size_t rank = shape.size();
  int64_t idx[kMaxRank];
  int64_t rem = start, off = 0;
  for (size_t d = rank; d-- > 0;) {
    idx[d] = rem % shape[d];
    rem /= shape[d];
    off += idx[d] * v.strides[d];
  }
  const int64_t inner = shape[rank - 1], is = v.strides[rank - 1];
  while (n > 0) {
    const int64_t run = std::min(inner - idx[rank - 1], n);
    const T* src = base + off;
    if (is == 1 && std::is_same_v<T, float>) {
      std::memcpy(dst, src, static_cast<size_t>(run) * sizeof(float));
    } else if (is == 0) {
      std::fill_n(dst, run, static_cast<float>(*src));
    } else {
      for (int64_t i = 0; i < run; ++i) dst[i] = static_cast<float>(src[i * is]);
    }
    dst += run;
    n -= run;
    off += run * is;
    idx[rank - 1] += run;
    if (idx[rank - 1] < inner) continue;
    off -= inner * is;
    idx[rank - 1] = 0;
    for (size_t d = rank - 1; d-- > 0;) {
      off += v.strides[d];
      if (++idx[d] < shape[d]) break;
      off -= shape[d] * v.strides[d];
      idx[d] = 0;
    }
  }
}

void gather(float* dst, const OperandView& v, c10::IntArrayRef shape, int64_t start, int64_t n) {
  if (v.mask) {
    gather_from(dst, v.mask, v, shape, start, n);
  } else {
    gather_from(dst, v.base, v, shape, start, n);
  }
}

}  // namespace

std::vector<at::Tensor> FusedProgram::run(const std::vector<at::Tensor>& inputs) const {
  // The iteration shape and its number of elements at this call's sizes.
  c10::SmallVector<int64_t, 8> symbol_values;
  c10::SmallVector<int64_t, 8> call_shape(shape_.begin(), shape_.end());
  int64_t numel = numel_;
  if (symbolic_) {
    read_symbol_values(bindings_, inputs, symbol_values);
    numel = 1;
    for (size_t d = 0; d < shape_dims_.size(); ++d) {
      call_shape[d] = shape_dims_[d].at(symbol_values);
      numel *= call_shape[d];
    }
  }
  static constexpr int64_t kScalarShape[1] = {1};
  const c10::IntArrayRef shape = call_shape.empty() ? c10::IntArrayRef(kScalarShape) : c10::IntArrayRef(call_shape);
  const size_t rank = shape.size();
  c10::SmallVector<OperandView, 8> views(operands_.size());
  c10::SmallVector<const at::Tensor*, 8> tensors(operands_.size());
  for (size_t i = 0; i < operands_.size(); ++i) {
    const at::Tensor* t;
    if (symbolic_) {
      t = &operands_[i].source.resolve_symbolic(inputs, "an input", symbol_values);
    } else {
      t = &operands_[i].source.resolve(inputs, "an input");
    }
    tensors[i] = t;
    OperandView& v = views[i];
    if (t->scalar_type() == at::kBool) {
      v.mask = t->data_ptr<bool>();  // always gathered: converted to floats
    } else {
      v.base = t->data_ptr<float>();
      v.flat = t->sizes().equals(c10::IntArrayRef(call_shape)) && t->is_contiguous();
    }
    v.strides.assign(rank, 0);
    const int64_t lead = static_cast<int64_t>(rank) - t->dim();
    v.constant = true;
    for (int64_t d = 0; d < t->dim(); ++d) {
      if (t->size(d) != 1) v.strides[lead + d] = t->stride(d);
      if (v.strides[lead + d] != 0) v.constant = false;
    }
  }
  // The results, allocated without a trip through the dispatcher (a call of a small program is
  // about a microsecond; at::empty's dispatch is a tenth of it): plain CPU tensors, as at::empty
  // gives here (the program never runs under a tracer or with autograd recording).
  c10::SmallVector<at::Tensor, 4> out_tensors;
  c10::SmallVector<float*, 4> out_ptrs;
  c10::SmallVector<bool*, 4> mask_ptrs;  // bool outputs: computed into a tile buffer, then converted
  for (size_t o = 0; o < output_regs_.size(); ++o) {
    const bool mask = output_is_mask_[o];
    out_tensors.emplace_back(at::detail::empty_cpu(c10::IntArrayRef(call_shape), mask ? at::kBool : at::kFloat,
                                                   /*pin_memory=*/false, c10::nullopt));
    out_ptrs.push_back(mask ? nullptr : out_tensors.back().data_ptr<float>());
    mask_ptrs.push_back(mask ? out_tensors.back().data_ptr<bool>() : nullptr);
  }

  const int64_t tile = tile_;
  auto body = [&](int64_t begin, int64_t end) {
    const size_t num_operands = operands_.size();
    const size_t num_outputs = output_regs_.size();
    float* buffers = thread_buffers((num_operands + num_scratch_ + num_outputs) * static_cast<size_t>(tile));
    c10::SmallVector<float*, 32> regs(num_regs_);
    for (size_t s = 0; s < num_scratch_; ++s)
      regs[num_operands + output_regs_.size() + s] = buffers + (num_operands + s) * tile;
    for (size_t i = 0; i < num_operands; ++i) {
      if (!views[i].constant || views[i].flat) continue;
      regs[i] = buffers + i * tile;
      std::fill_n(regs[i], tile, views[i].mask ? static_cast<float>(*views[i].mask) : *views[i].base);
    }
    for (size_t o = 0; o < num_outputs; ++o)
      if (mask_ptrs[o]) regs[output_regs_[o]] = buffers + (num_operands + num_scratch_ + o) * tile;
    if (copy_of_ >= 0 && !views[copy_of_].flat && !views[copy_of_].constant) {
      gather(out_ptrs[0] + begin, views[copy_of_], shape, begin, end - begin);
      return;
    }
    for (int64_t start = begin; start < end; start += tile) {
      const int64_t n = std::min(tile, end - start);
      for (size_t i = 0; i < num_operands; ++i) {
        const OperandView& v = views[i];
        if (v.flat) {
          regs[i] = const_cast<float*>(v.base) + start;
        } else if (!v.constant) {
          regs[i] = buffers + i * tile;
          gather(regs[i], v, shape, start, n);
        }
      }
      for (size_t o = 0; o < num_outputs; ++o)
        if (out_ptrs[o]) regs[output_regs_[o]] = out_ptrs[o] + start;
      run_tile_(code_.data(), code_.size(), regs.data(), n);
      for (size_t o = 0; o < num_outputs; ++o) {
        if (!mask_ptrs[o]) continue;
        const float* m = regs[output_regs_[o]];
        bool* dst = mask_ptrs[o] + start;
        for (int64_t i = 0; i < n; ++i) dst[i] = m[i] != 0.f;
      }
    }
  };
  // Small work runs inline: an OpenMP region costs microseconds.
  constexpr int64_t kGrain = 32768;
  if (numel <= kGrain) {
    body(0, numel);
  } else {
    at::parallel_for(0, numel, kGrain, body);
  }

  std::vector<at::Tensor> results;
  results.reserve(outputs_.size());
  for (const Output& out : outputs_) {
    if (out.operand >= 0) {
      results.push_back(*tensors[out.operand]);
    } else {
      const size_t slot = static_cast<size_t>(out.reg) - operands_.size();
      results.push_back(out_tensors[slot]);
    }
  }
  return results;
}

std::string FusedProgram::describe() const {
  std::string ops;
  for (const auto& name : op_names_) ops += (ops.empty() ? "" : "+") + name;
  return "fused: " + ops + " (" + std::to_string(code_.size()) + " instructions, " + std::to_string(num_scratch_) +
         " scratch registers, tile " + std::to_string(tile_) + ", " + to_string(isa_) + ")";
}

}  // namespace torchcompile::fused
