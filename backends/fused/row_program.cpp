#include "row_program.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>

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

namespace {

// Work below this many elements runs inline: an OpenMP region costs microseconds.
constexpr int64_t kRowGrain = 32768;

const TensorMeta& meta_of(const Value& v) { return v.node->output_meta().at(v.index); }

// The tensor argument i of n, if it is one with contiguous float32 metadata.
std::optional<Value> float_arg(const Node& n, size_t i) {
  const auto& a = n.args().at(i);
  if (!a.is_value() || !is_float_cpu(meta_of(a.value())) || !is_contiguous(meta_of(a.value()))) return std::nullopt;
  return a.value();
}

bool is_none(const Node& n, size_t i) { return n.args().at(i).is_constant() && n.args().at(i).constant().isNone(); }

// Whether the constant argument i of n names the last dimension of x.
bool names_last_dim(const Node& n, size_t i, const Value& x) {
  const auto& a = n.args().at(i);
  if (!a.is_constant() || !a.constant().isInt()) return false;
  const int64_t rank = static_cast<int64_t>(meta_of(x).sizes.size());
  int64_t dim = a.constant().toInt();
  if (dim < 0) dim += rank;
  return rank > 0 && dim == rank - 1;
}

// softmax / log_softmax over the last dimension, no dtype conversion.
bool softmax_ok(const Node& n) {
  auto x = float_arg(n, 0);
  if (!x || !names_last_dim(n, 1, *x)) return false;
  const auto& a2 = n.args().at(2);  // dtype (None) or half_to_float (false)
  return a2.is_constant() && (a2.constant().isNone() || (a2.constant().isBool() && !a2.constant().toBool()));
}

// _softmax_backward_data / _log_softmax_backward_data(grad_output, output, dim, input_dtype):
// over the last dimension, float32 throughout.
bool softmax_backward_ok(const Node& n) {
  auto g = float_arg(n, 0), y = float_arg(n, 1);
  if (!g || !y || meta_of(*g).sizes != meta_of(*y).sizes || !names_last_dim(n, 2, *g)) return false;
  const auto& a3 = n.args().at(3);  // the forward input's dtype
  return a3.is_constant() && a3.constant().isInt() &&
         static_cast<c10::ScalarType>(a3.constant().toInt()) == c10::ScalarType::Float;
}

// The constant argument i of n as a layer norm's normalized shape: trailing dimensions of x.
std::optional<std::vector<int64_t>> normalized_shape(const Node& n, size_t i, const Value& x) {
  const auto& a = n.args().at(i);
  if (!a.is_constant() || !a.constant().isIntList()) return std::nullopt;
  auto shape = a.constant().toIntVector();
  const auto& sizes = meta_of(x).sizes;
  if (shape.empty() || shape.size() > sizes.size() ||
      !std::equal(shape.begin(), shape.end(), sizes.end() - static_cast<std::ptrdiff_t>(shape.size())))
    return std::nullopt;
  return shape;
}

// The optional weight or bias argument i of n: None, or a tensor of the normalized shape.
bool affine_ok(const Node& n, size_t i, const std::vector<int64_t>& shape) {
  if (is_none(n, i)) return true;
  auto w = float_arg(n, i);
  return w && meta_of(*w).sizes == shape;
}

// layer_norm(input, normalized_shape, weight?, bias?, eps, cudnn_enable) over trailing dims.
bool layer_norm_ok(const Node& n) {
  auto x = float_arg(n, 0);
  if (!x) return false;
  const auto shape = normalized_shape(n, 1, *x);
  if (!shape || !affine_ok(n, 2, *shape) || !affine_ok(n, 3, *shape)) return false;
  const auto& eps = n.args().at(4);
  return eps.is_constant() && eps.constant().isDouble();
}

bool is_variance(const std::string& t) {
  return t == "aten::var.correction" || t == "aten::std.correction" || t == "aten::var.dim" ||
         t == "aten::std.dim" || t == "aten::var" || t == "aten::std";
}

// var / std's correction (the divisor is N - correction): var.dim's `unbiased`, or
// var.correction's correction (None: 1; an int, or in LibTorch 2.x a number).
std::optional<double> variance_correction(const Node& n) {
  const bool whole = n.target() == "aten::var" || n.target() == "aten::std";  // (self, unbiased)
  const auto& a = n.args().at(whole ? 1 : 2);
  if (!a.is_constant()) return std::nullopt;
  const c10::IValue& v = a.constant();
  if (whole || n.target() == "aten::var.dim" || n.target() == "aten::std.dim") {
    if (!v.isBool()) return std::nullopt;
    return v.toBool() ? 1.0 : 0.0;
  }
  if (v.isNone()) return 1.0;
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isDouble()) return v.toDouble();
  return std::nullopt;
}

// sum / mean / amax / amin / var / std over one block of adjacent dimensions (all of them for an
// empty or absent list), no dtype conversion. Returns the block [first, last] of reduced dimensions.
std::optional<std::pair<int64_t, int64_t>> reduced_block(const Node& n) {
  auto x = float_arg(n, 0);
  if (!x) return std::nullopt;
  const int64_t rank = static_cast<int64_t>(meta_of(*x).sizes.size());
  const std::string& t = n.target();
  std::vector<int64_t> dims;
  if (t != "aten::sum" && t != "aten::var" && t != "aten::std") {  // those reduce everything
    const auto& d = n.args().at(1);
    if (!d.is_constant()) return std::nullopt;
    if (d.constant().isIntList()) {
      dims = d.constant().toIntVector();
    } else if (!d.constant().isNone()) {
      return std::nullopt;
    }
  }
  // dtype: argument 1 of sum(self, dtype), 3 of sum.dim_IntList / mean.dim; amax / amin / var /
  // std have none.
  if (is_variance(t) && !variance_correction(n)) return std::nullopt;
  const size_t dtype_arg =
      t == "aten::sum" ? 1 : (t == "aten::amax" || t == "aten::amin" || is_variance(t)) ? 0 : 3;
  if (dtype_arg && !is_none(n, dtype_arg)) return std::nullopt;
  if (dims.empty()) {
    if (t == "aten::amax" || t == "aten::amin") return std::nullopt;  // an empty list is an error there
    if (rank == 0) return std::nullopt;
    return std::make_pair<int64_t, int64_t>(0, rank - 1);
  }
  for (auto& d : dims) {
    if (d < 0) d += rank;
    if (d < 0 || d >= rank) return std::nullopt;
  }
  std::sort(dims.begin(), dims.end());
  for (size_t i = 1; i < dims.size(); ++i)
    if (dims[i] != dims[i - 1] + 1) return std::nullopt;  // repeated, or not one block
  return std::make_pair(dims.front(), dims.back());
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?,
// output_mask): grad_out and input of the same sizes, mean and rstd with one value per row.
bool layer_norm_backward_ok(const Node& n) {
  auto g = float_arg(n, 0), x = float_arg(n, 1), mean = float_arg(n, 3), rstd = float_arg(n, 4);
  if (!g || !x || !mean || !rstd || meta_of(*g).sizes != meta_of(*x).sizes) return false;
  const auto shape = normalized_shape(n, 2, *x);
  if (!shape || !affine_ok(n, 5, *shape)) return false;
  const auto& sizes = meta_of(*x).sizes;
  int64_t rows = 1;
  for (size_t d = 0; d + shape->size() < sizes.size(); ++d) rows *= sizes[d];
  for (const auto& m : {meta_of(*mean), meta_of(*rstd)}) {
    int64_t numel = 1;
    for (int64_t s : m.sizes) numel *= s;
    if (numel != rows) return false;
  }
  const auto& mask = n.args().at(7);
  return mask.is_constant() && mask.constant().isBoolList() && mask.constant().toBoolList().size() == 3;
}

using Kind = RowProgram::Kind;

// Every defined result of n (at least one) is a contiguous float32 CPU tensor.
bool results_ok(const Node& n) {
  bool any = false;
  for (const TensorMeta& out : n.output_meta()) {
    if (!out.defined) continue;
    if (!is_float_cpu(out) || !is_contiguous(out)) return false;
    any = true;
  }
  return any;
}

std::optional<Kind> row_kind(const Node& n) {
  if (n.kind() != NodeKind::CallFunction || !results_ok(n)) return std::nullopt;
  auto when = [](bool ok, Kind k) { return ok ? std::optional<Kind>(k) : std::nullopt; };
  const std::string& t = n.target();
  if (t == "aten::native_layer_norm" && n.num_outputs() == 3) return when(layer_norm_ok(n), Kind::NativeLayerNorm);
  if (t == "aten::native_layer_norm_backward" && n.num_outputs() == 3)
    return when(layer_norm_backward_ok(n), Kind::LayerNormBackward);
  if (n.num_outputs() != 1) return std::nullopt;
  if (t == "aten::softmax.int" || t == "aten::_softmax") return when(softmax_ok(n), Kind::Softmax);
  if (t == "aten::log_softmax.int" || t == "aten::_log_softmax") return when(softmax_ok(n), Kind::LogSoftmax);
  if (t == "aten::_softmax_backward_data") return when(softmax_backward_ok(n), Kind::SoftmaxBackward);
  if (t == "aten::_log_softmax_backward_data") return when(softmax_backward_ok(n), Kind::LogSoftmaxBackward);
  if (t == "aten::layer_norm") return when(layer_norm_ok(n), Kind::LayerNorm);
  if (t == "aten::sum" || t == "aten::sum.dim_IntList" || t == "aten::mean.dim" || t == "aten::amax" ||
      t == "aten::amin" || is_variance(t))
    return when(reduced_block(n).has_value(), Kind::Reduce);
  return std::nullopt;
}

}  // namespace

bool row_fusible(const Node& n) { return row_kind(n).has_value(); }

std::shared_ptr<const RowProgram> RowProgram::build(const ir::GraphModule& gm, std::string* why) {
  auto fail = [&](std::string reason) -> std::shared_ptr<const RowProgram> {
    if (why) *why = std::move(reason);
    return nullptr;
  };
  std::shared_ptr<RowProgram> p(new RowProgram());
  const Node* op = nullptr;
  std::unordered_map<const Node*, TensorSource> sources;
  int64_t num_inputs = 0;
  for (const auto& np : gm.graph().nodes()) {
    const Node& n = *np;
    switch (n.kind()) {
      case NodeKind::Placeholder:
      case NodeKind::GetAttr: sources.emplace(&n, TensorSource::of(gm, n, &num_inputs)); break;
      case NodeKind::CallFunction:
        if (op) return fail("more than one operator");
        if (!row_fusible(n)) return fail("'" + n.name() + "' (" + n.target() + ") is not a row operation it runs");
        op = &n;
        break;
      case NodeKind::CallModule: return fail("the graph has a call_module node");
      case NodeKind::Output:
        for (const auto& v : n.args().at(0).list()) {
          if (!v || v->node != op) return fail("the graph returns something other than its operator's results");
          p->output_index_.push_back(v->index);
        }
        break;
    }
  }
  if (!op) return fail("nothing to fuse");
  // A graph with size symbols: each size a constant or one symbol (else `bad` says which).
  const auto& symbols = gm.graph().symbols();
  std::string bad;
  auto source_of = [&](size_t i, const char* what) {
    const Node* n = op->args().at(i).value().node;
    TensorSource source = sources.at(n);
    if (!symbols.empty()) source.dims = symbolic_dims(n->output_meta().at(0), symbols, what, &bad);
    return source;
  };
  p->kind_ = *row_kind(*op);  // row_fusible above
  p->x_ = source_of(0, "the input");
  if (p->kind_ == Kind::LayerNorm || p->kind_ == Kind::NativeLayerNorm) {
    for (int64_t s : op->args().at(1).constant().toIntVector()) p->cols_ *= s;
    if (!is_none(*op, 2)) p->weight_ = source_of(2, "the weight");
    if (!is_none(*op, 3)) p->bias_ = source_of(3, "the bias");
    p->eps_ = static_cast<float>(op->args().at(4).constant().toDouble());
  } else if (p->kind_ == Kind::LayerNormBackward) {
    // x_ is the gradient of the result; y_ the input; mean_, rstd_ the forward's statistics.
    for (int64_t s : op->args().at(2).constant().toIntVector()) p->cols_ *= s;
    p->y_ = source_of(1, "the input");
    p->mean_src_ = source_of(3, "the mean");
    p->rstd_src_ = source_of(4, "the rstd");
    if (!is_none(*op, 5)) p->weight_ = source_of(5, "the weight");
    const auto mask = op->args().at(7).constant().toBoolList();
    for (size_t i = 0; i < 3; ++i) p->output_mask_[i] = mask.get(i) && op->output_meta()[i].defined;
    if (p->output_mask_[1] && !p->weight_.present) return fail("a weight gradient without a weight");
  } else if (p->kind_ == Kind::Reduce) {
    std::tie(p->first_, p->last_) = *reduced_block(*op);
    const auto& sizes = p->x_.sizes;
    p->outer_ = p->cols_ = p->inner_ = 1;
    for (int64_t d = 0; d < static_cast<int64_t>(sizes.size()); ++d)
      (d < p->first_ ? p->outer_ : d > p->last_ ? p->inner_ : p->cols_) *= sizes[d];
    const std::string& t = op->target();
    p->reduce_ = t == "aten::amax"   ? ReduceOp::Max
                 : t == "aten::amin" ? ReduceOp::Min
                 : is_variance(t)    ? (t.rfind("aten::std", 0) == 0 ? ReduceOp::StdDev : ReduceOp::Variance)
                                     : ReduceOp::Sum;
    p->mean_ = t == "aten::mean.dim";
    // var / std: ATen divides by max(0, N - correction) (0: inf or NaN, as here).
    if (is_variance(t)) p->correction_ = *variance_correction(*op);
    p->name_ = t.substr(6, t.find('.') == std::string::npos ? std::string::npos : t.find('.') - 6);
  } else {
    p->cols_ = p->x_.sizes.back();
    if (p->kind_ == Kind::SoftmaxBackward || p->kind_ == Kind::LogSoftmaxBackward) p->y_ = source_of(1, "the softmax result");
  }
  if (p->cols_ == 0 || p->outer_ * p->inner_ == 0) return fail("it reduces or returns an empty tensor");
  for (size_t i = 0; i < op->output_meta().size(); ++i) {
    const TensorMeta& m = op->output_meta()[i];
    p->result_dims_.push_back(m.defined ? symbolic_dims(m, symbols, "result " + std::to_string(i), &bad)
                                        : std::vector<SymbolicDim>{});
  }
  if (!symbols.empty()) {
    // One program for every size: its sizes are evaluated at each call. Its scalar arguments (a
    // layer norm's normalized shape, a reduction's dimensions) are baked in.
    if (std::string why = size_expression_argument(gm); !why.empty()) return fail(why);
    if (!bad.empty()) return fail("a size is an expression of the symbols, not one symbol (" + bad + ")");
    // What row_kind checked at the traced sizes must hold at every size: the kernels read as many
    // values from each tensor as the input's rows and row length give.
    auto same = [](const std::vector<SymbolicDim>& a, const std::vector<SymbolicDim>& b) {
      return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](const SymbolicDim& u, const SymbolicDim& v) {
               return u.symbol == v.symbol && (u.symbol >= 0 || u.value == v.value);
             });
    };
    // The dimensions other than constant 1s (a row statistic's [s0, 1] has the rows of [s0, 8]).
    auto squeezed = [](std::vector<SymbolicDim> dims) {
      dims.erase(std::remove_if(dims.begin(), dims.end(), [](const SymbolicDim& d) { return d.symbol < 0 && d.value == 1; }),
                 dims.end());
      return dims;
    };
    if ((p->kind_ == Kind::SoftmaxBackward || p->kind_ == Kind::LogSoftmaxBackward || p->kind_ == Kind::LayerNormBackward) &&
        !same(p->x_.dims, p->y_.dims))
      return fail("its two inputs' sizes are other expressions of the symbols");
    if (p->kind_ == Kind::LayerNorm || p->kind_ == Kind::NativeLayerNorm || p->kind_ == Kind::LayerNormBackward) {
      // Rows of the normalized shape, a constant: the normalized dimensions, and the weight and
      // bias, may not be symbols.
      const auto& dims = (p->kind_ == Kind::LayerNormBackward ? p->y_ : p->x_).dims;
      size_t d = dims.size();
      for (int64_t cols = 1; d > 0 && cols < p->cols_;) {
        if (dims[--d].symbol >= 0) return fail("a normalized dimension is a size symbol");
        cols *= dims[d].value;
      }
      for (const TensorSource* s : {&p->weight_, &p->bias_})
        for (const SymbolicDim& w : s->dims)
          if (w.symbol >= 0) return fail("the weight or bias has a size symbol");
      // A row statistic per row: the mean and rstd have the input's leading dimensions.
      const std::vector<SymbolicDim> rows = squeezed({dims.begin(), dims.begin() + static_cast<std::ptrdiff_t>(d)});
      const std::vector<std::vector<SymbolicDim>> stats =
          p->kind_ == Kind::LayerNormBackward ? std::vector<std::vector<SymbolicDim>>{p->mean_src_.dims, p->rstd_src_.dims}
          : p->kind_ == Kind::NativeLayerNorm ? std::vector<std::vector<SymbolicDim>>{p->result_dims_.at(1), p->result_dims_.at(2)}
                                              : std::vector<std::vector<SymbolicDim>>{};
      for (const auto& stat : stats)
        if (!same(squeezed(stat), rows)) return fail("a row statistic's sizes are not the input's rows");
    }
    p->symbolic_ = true;
    p->bindings_ = gm.graph().symbol_bindings();
  }
  p->isa_ = selected_isa();
  p->kernels_ = &kernels_of(p->isa_);
  return p;
}

const at::Tensor& RowProgram::source(const TensorSource& s, const std::vector<at::Tensor>& inputs, const char* what,
                                     const CallSizes& call) const {
  return symbolic_ ? s.resolve_symbolic(inputs, what, call.symbols) : s.resolve(inputs, what);
}

std::vector<int64_t> RowProgram::result_sizes(size_t i, const CallSizes& call) const {
  return sizes_at(result_dims_.at(i), call.symbols);
}

std::vector<at::Tensor> RowProgram::run(const std::vector<at::Tensor>& inputs) const {
  CallSizes call;
  if (symbolic_) read_symbol_values(bindings_, inputs, call.symbols);
  const at::Tensor x = source(x_, inputs, "the input", call).contiguous();
  call.cols = cols_;
  if (kind_ == Kind::Reduce) {
    call.cols = 1;
    for (int64_t d = 0; d < x.dim(); ++d) (d < first_ ? call.outer : d > last_ ? call.inner : call.cols) *= x.size(d);
  } else if (kind_ != Kind::LayerNorm && kind_ != Kind::NativeLayerNorm && kind_ != Kind::LayerNormBackward) {
    call.cols = x.size(-1);  // softmax: rows of the last dimension
  }
  std::vector<at::Tensor> results;
  if (kind_ == Kind::Reduce) {
    results = {reduce(x, call)};
  } else if (kind_ == Kind::LayerNormBackward) {
    results = layer_norm_backward(inputs, x, call);
  } else {
    results = rows(inputs, x, call);
  }
  std::vector<at::Tensor> out;
  out.reserve(output_index_.size());
  for (size_t i : output_index_) out.push_back(results.at(i));
  return out;
}

std::vector<at::Tensor> RowProgram::rows(const std::vector<at::Tensor>& inputs, const at::Tensor& x,
                                         const CallSizes& call) const {
  at::Tensor w, b, y;
  if (y_.present) y = source(y_, inputs, "the softmax result", call).contiguous();
  if (weight_.present) w = source(weight_, inputs, "the weight", call).contiguous();
  if (bias_.present) b = source(bias_, inputs, "the bias", call).contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options());
  const int64_t cols = call.cols, rows = x.numel() / cols;
  at::Tensor mean, rstd;  // native_layer_norm's second and third results
  if (kind_ == Kind::NativeLayerNorm) {
    mean = at::empty(result_sizes(1, call), x.options());
    rstd = at::empty(result_sizes(2, call), x.options());
  }
  float* mp = mean.defined() ? mean.data_ptr<float>() : nullptr;
  float* rp = rstd.defined() ? rstd.data_ptr<float>() : nullptr;
  const float* in = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const float* wp = w.defined() ? w.data_ptr<float>() : nullptr;
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  const float* yp = y.defined() ? y.data_ptr<float>() : nullptr;
  auto body = [&](int64_t begin, int64_t end) {
    if (kind_ == Kind::LayerNorm || kind_ == Kind::NativeLayerNorm) {
      kernels_->layer_norm_rows(in + begin * cols, o + begin * cols, wp, bp, end - begin, cols, eps_,
                                mp ? mp + begin : nullptr, rp ? rp + begin : nullptr);
    } else if (yp) {
      kernels_->softmax_backward_rows(in + begin * cols, yp + begin * cols, o + begin * cols, end - begin, cols,
                                      kind_ == Kind::LogSoftmaxBackward);
    } else {
      kernels_->softmax_rows(in + begin * cols, o + begin * cols, end - begin, cols, kind_ == Kind::LogSoftmax);
    }
  };
  // Inline below kRowGrain elements: an OpenMP region costs microseconds.
  const int64_t grain = std::max<int64_t>(1, kRowGrain / cols);
  if (rows <= grain) {
    body(0, rows);
  } else {
    at::parallel_for(0, rows, grain, body);
  }
  if (kind_ == Kind::NativeLayerNorm) return {out, mean, rstd};
  return {out};
}

// native_layer_norm_backward over blocks of rows in parallel: dx row by row; the weight and bias
// gradients as one partial sum per block, then the blocks added in order.
std::vector<at::Tensor> RowProgram::layer_norm_backward(const std::vector<at::Tensor>& inputs, const at::Tensor& grad,
                                                        const CallSizes& call) const {
  const at::Tensor x = source(y_, inputs, "the input", call).contiguous();
  const at::Tensor mean = source(mean_src_, inputs, "the mean", call).contiguous();
  const at::Tensor rstd = source(rstd_src_, inputs, "the rstd", call).contiguous();
  at::Tensor w;
  if (weight_.present) w = source(weight_, inputs, "the weight", call).contiguous();
  const int64_t cols = cols_, rows = x.numel() / cols;
  std::vector<at::Tensor> results(3);
  if (output_mask_[0]) results[0] = at::empty(x.sizes(), x.options());
  const bool want_params = output_mask_[1] || output_mask_[2];
  const int64_t blocks = std::clamp<int64_t>(rows * cols / kRowGrain, 1, 16);
  const int64_t per_block = (rows + blocks - 1) / blocks;
  at::Tensor partial = want_params ? at::zeros({blocks, 2, cols}, x.options()) : at::Tensor();
  const float *g = grad.data_ptr<float>(), *xp = x.data_ptr<float>(), *mp = mean.data_ptr<float>(),
              *rp = rstd.data_ptr<float>(), *wp = w.defined() ? w.data_ptr<float>() : nullptr;
  float* dx = output_mask_[0] ? results[0].data_ptr<float>() : nullptr;
  float* pp = want_params ? partial.data_ptr<float>() : nullptr;
  auto body = [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * per_block, r1 = std::min(rows, r0 + per_block);
      if (r0 >= r1) continue;
      float* dw = output_mask_[1] ? pp + (b * 2) * cols : nullptr;
      float* db = output_mask_[2] ? pp + (b * 2 + 1) * cols : nullptr;
      kernels_->layer_norm_backward_rows(g + r0 * cols, xp + r0 * cols, mp + r0, rp + r0, wp,
                                         dx ? dx + r0 * cols : nullptr, dw, db, r1 - r0, cols);
    }
  };
  if (blocks == 1) {  // inline: an OpenMP region costs microseconds
    body(0, 1);
  } else {
    at::parallel_for(0, blocks, 1, body);
  }
  if (want_params) {
    at::Tensor sums = partial.sum(0);  // (2, cols), blocks added in order
    if (output_mask_[1]) results[1] = sums[0].reshape(result_sizes(1, call)).contiguous();
    if (output_mask_[2]) results[2] = sums[1].reshape(result_sizes(2, call)).contiguous();
  }
  return results;
}

// One task per (outer slice, chunk of at least 256 columns); a full reduction of one long column
// (outer = inner = 1) is split along the column instead, partial results combined.
at::Tensor RowProgram::reduce(const at::Tensor& x, const CallSizes& call) const {
  at::Tensor out = at::empty(result_sizes(0, call), x.options());
  const float* in = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const int64_t red = call.cols, inner = call.inner, outer = call.outer;
  const auto kernel = kernels_->reduce_block;
  const ReduceOp op = reduce_;
  const float scale = mean_ ? static_cast<float>(red) : 1.f;
  const int64_t total = outer * red * inner;
  const double divisor = std::max(0.0, static_cast<double>(red) - correction_);
  const bool variance = op == ReduceOp::Variance || op == ReduceOp::StdDev;
  if (outer * inner == 1 && total > kRowGrain && !variance) {  // (a variance's partial results do not add)
    const int64_t grain = kRowGrain;
    const float ident = op == ReduceOp::Sum ? 0.f : op == ReduceOp::Max ? -INFINITY : INFINITY;
    *o = at::parallel_reduce(
        0, red, grain, ident,
        [&](int64_t b, int64_t e, float) {
          float r;
          kernel(in + b, &r, e - b, 1, 0, 1, op, divisor);
          return r;
        },
        [op](float a, float b) {
          if (op == ReduceOp::Sum) return a + b;
          if (a != a || b != b) return a != a ? a : b;
          return op == ReduceOp::Max ? std::max(a, b) : std::min(a, b);
        });
  } else {
    const int64_t chunk = inner == 1 ? 1 : std::max<int64_t>(256, inner / 8);
    const int64_t chunks = (inner + chunk - 1) / chunk;
    auto body = [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t s = t / chunks, c0 = (t % chunks) * chunk, c1 = std::min(inner, c0 + chunk);
        kernel(in + s * red * inner, o + s * inner + c0, red, inner, c0, c1, op, divisor);
      }
    };
    const int64_t tasks = outer * chunks;
    const int64_t grain = std::max<int64_t>(1, kRowGrain / std::max<int64_t>(1, red * chunk));
    if (total <= kRowGrain) {
      body(0, tasks);
    } else {
      at::parallel_for(0, tasks, grain, body);
    }
  }
  if (mean_) out.div_(scale);
  return out;
}

std::string RowProgram::describe() const {
  const std::string isa = (symbolic_ ? "every size, " : "") + std::string(to_string(isa_));
  if (kind_ == Kind::Reduce)
    return "fused: " + name_ + " (" + std::to_string(outer_) + " x " + std::to_string(cols_) + " x " +
           std::to_string(inner_) + (symbolic_ ? " as traced" : "") + ", " + isa + ")";
  if (kind_ == Kind::NativeLayerNorm || kind_ == Kind::LayerNormBackward)
    return std::string("fused: ") + (kind_ == Kind::NativeLayerNorm ? "native_layer_norm" : "layer_norm_backward") +
           " (rows of " + std::to_string(cols_) + ", " + isa + ")";
  const char* name = kind_ == Kind::Softmax                ? "softmax"
                     : kind_ == Kind::LogSoftmax           ? "log_softmax"
                     : kind_ == Kind::SoftmaxBackward      ? "softmax_backward"
                     : kind_ == Kind::LogSoftmaxBackward   ? "log_softmax_backward"
                                                           : "layer_norm";
  const bool varying = symbolic_ && kind_ != Kind::LayerNorm && x_.dims.back().symbol >= 0;  // softmax over a symbol
  return std::string("fused: ") + name + " (rows of " + (varying ? "any length" : std::to_string(cols_)) + ", " + isa + ")";
}

}  // namespace torchcompile::fused
