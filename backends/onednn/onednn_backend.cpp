#include "onednn_backend.h"

#include "dnnl_compat.h"
#include "onednn_runtime.h"
#include "onednn_rnn.h"

#include <torchcompile/compile/partitioner.h>
#include <torchcompile/ir/interpreter.h>
#include <torchcompile/ir/op_step.h>
#include <torchcompile/ir/op_properties.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/stack.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <map>
#include <unordered_map>
#include <unordered_set>

namespace torchcompile::backends {

namespace onednn {

namespace {

using namespace detail;
using ir::Node;
using ir::NodeKind;
using ir::TensorMeta;
using ir::Value;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;
using md_t = dnnl::memory::desc;

// ---- small helpers ----------------------------------------------------------------------------

const TensorMeta& meta(const Value& v) { return v.node->output_meta().at(v.index); }

bool is_f32(const TensorMeta& m) {
  return m.defined && m.dtype == at::kFloat && m.device.is_cpu() && !m.sizes.empty();
}

bool is_contiguous(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  int64_t expected = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= sizes[i];
  }
  return true;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> s(sizes.size());
  int64_t acc = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    s[i] = acc;
    acc *= std::max<int64_t>(sizes[i], 1);
  }
  return s;
}

int64_t numel(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

std::optional<std::vector<int64_t>> int_list(const c10::IValue& v) {
  if (v.isIntList()) return v.toIntVector();
  if (!v.isList()) return std::nullopt;
  std::vector<int64_t> out;
  for (const c10::IValue& e : v.toListRef()) {
    if (e.isInt()) {
      out.push_back(e.toInt());
    } else if (e.isSymInt()) {
      auto s = e.toSymInt();
      if (s.is_symbolic()) return std::nullopt;
      out.push_back(s.expect_int());
    } else {
      return std::nullopt;
    }
  }
  return out;
}

std::optional<double> scalar(const c10::IValue& v) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  return std::nullopt;
}

const ir::Argument& arg(const Node* n, size_t i) { return n->args().at(i); }

// A convolution's stride / padding / dilation: one value for both spatial dims, or two.
std::vector<int64_t> pair_of(std::vector<int64_t> v) { return v.size() == 1 ? std::vector<int64_t>{v[0], v[0]} : v; }

// The tensor value of argument i, if it is one and defined.
std::optional<Value> value_arg(const Node* n, size_t i) {
  if (i >= n->args().size()) return std::nullopt;
  const ir::Argument& a = arg(n, i);
  if (!a.is_value() || !meta(a.value()).defined) return std::nullopt;
  return a.value();
}

// Argument i is a constant None (or an undefined tensor).
bool none_arg(const Node* n, size_t i) {
  if (i >= n->args().size()) return true;
  const ir::Argument& a = arg(n, i);
  if (a.is_constant()) return a.constant().isNone();
  return a.is_value() && !meta(a.value()).defined;
}

std::optional<double> scalar_arg(const Node* n, size_t i) {
  if (i >= n->args().size() || !arg(n, i).is_constant()) return std::nullopt;
  return scalar(arg(n, i).constant());
}

bool is_call(const Node* n, std::initializer_list<const char*> targets) {
  if (n->kind() != NodeKind::CallFunction) return false;
  for (const char* t : targets)
    if (n->target() == t) return true;
  return false;
}

// Uses of every output of `n`.
size_t total_uses(const Node* n) {
  size_t u = 0;
  for (size_t i = 0; i < n->num_outputs(); ++i) u += n->uses(i).size();
  return u;
}

md_t plain_md(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  return md_t(dims(sizes.begin(), sizes.end()), dt::f32, dims(strides.begin(), strides.end()));
}

bool is_ref_impl(const char* impl) {
  std::string s = impl ? impl : "";
  return s.rfind("ref", 0) == 0 || s.find(":ref") != std::string::npos;
}

// A GEMM whose weight is not a module attribute (both operands activations, or the weights
// AOT's training graphs take as inputs) cannot be prepacked: oneDNN reads it in its plain layout
// on every call. oneDNN runs such a GEMM faster than the BLAS ATen calls only with its brgemm
// kernels (AVX-512 machines with oneDNN 2.6). Its other f32 GEMM (`gemm:jit`, what oneDNN 2.6
// and 3.7 use on AVX2 machines) measured 0.5-1.1x OpenBLAS on the GEMMs of transformer and MLP
// training steps (0.5x with a transposed first operand, as weight gradients have), so there ATen
// runs it.
// TORCHCOMPILE_ONEDNN_DYNAMIC_GEMM=1 / 0 overrides. (Read at each compile.)
bool dynamic_gemm_pays(const md_t& src, const md_t& wei) {
  const char* e = std::getenv("TORCHCOMPILE_ONEDNN_DYNAMIC_GEMM");
  if (e && *e) return std::string(e) == "1";
  const dims s = compat::dims_of(src), w = compat::dims_of(wei);
  try {
    auto pd = compat::matmul_pd(cpu_engine(), src, wei, md_t(), md_t({s[0], w[1]}, dt::f32, tag::ab),
                                dnnl::primitive_attr());
    return std::string(pd.impl_info_str()).rfind("brg", 0) == 0;
  } catch (const dnnl::error&) {
    return false;
  }
}

// ---- post-ops ---------------------------------------------------------------------------------

struct Eltwise {
  dnnl::algorithm alg;
  float alpha = 0.f, beta = 0.f;
  std::string label;
};

std::optional<Eltwise> eltwise_of(const Node* n) {
  using A = dnnl::algorithm;
  const std::string& t = n->target();
  if (t == "aten::relu" || t == "aten::relu_") return Eltwise{A::eltwise_relu, 0.f, 0.f, "relu"};
  if (t == "aten::leaky_relu" || t == "aten::leaky_relu_") {
    auto s = scalar_arg(n, 1);
    if (!s) return std::nullopt;
    return Eltwise{A::eltwise_relu, static_cast<float>(*s), 0.f, "leaky_relu"};
  }
  if (t == "aten::gelu" || t == "aten::gelu_") {
    std::string approx = "none";
    if (n->args().size() > 1 && arg(n, 1).is_constant() && arg(n, 1).constant().isString())
      approx = arg(n, 1).constant().toStringRef();
    if (approx == "none") return Eltwise{A::eltwise_gelu_erf, 0.f, 0.f, "gelu"};
    if (approx == "tanh") return Eltwise{A::eltwise_gelu_tanh, 0.f, 0.f, "gelu_tanh"};
    return std::nullopt;
  }
  if (t == "aten::sigmoid" || t == "aten::sigmoid_") return Eltwise{A::eltwise_logistic, 0.f, 0.f, "sigmoid"};
  if (t == "aten::tanh" || t == "aten::tanh_") return Eltwise{A::eltwise_tanh, 0.f, 0.f, "tanh"};
  if (t == "aten::silu" || t == "aten::silu_") return Eltwise{A::eltwise_swish, 1.f, 0.f, "silu"};
  if (t == "aten::hardswish" || t == "aten::hardswish_") return Eltwise{A::eltwise_hardswish, 1.f / 6.f, 0.5f, "hardswish"};  // x * clip(x/6 + 1/2, 0, 1): oneDNN 3 reads alpha, beta; 2.x ignores them
  if (t == "aten::relu6" || t == "aten::relu6_") return Eltwise{A::eltwise_clip, 0.f, 6.f, "clamp"};
  if (t == "aten::hardtanh" || t == "aten::hardtanh_") {
    auto lo = scalar_arg(n, 1), hi = scalar_arg(n, 2);
    if (!lo || !hi) return std::nullopt;
    return Eltwise{A::eltwise_clip, static_cast<float>(*lo), static_cast<float>(*hi), "clamp"};
  }
  if (t == "aten::clamp" || t == "aten::clamp_") {
    if (n->args().size() < 3) return std::nullopt;
    auto lo = scalar_arg(n, 1), hi = scalar_arg(n, 2);
    bool lo_none = none_arg(n, 1), hi_none = none_arg(n, 2);
    if ((!lo && !lo_none) || (!hi && !hi_none) || (lo_none && hi_none)) return std::nullopt;
    return Eltwise{A::eltwise_clip, lo ? static_cast<float>(*lo) : -FLT_MAX, hi ? static_cast<float>(*hi) : FLT_MAX,
                   "clamp"};
  }
  return std::nullopt;
}

bool is_identity_dropout(const Node* n) { return ir::node_is_identity(*n); }

// ---- matched groups ---------------------------------------------------------------------------

struct PostOp {
  bool is_add = false;
  Eltwise e;
  Value other;  // is_add: the residual
};

enum class GroupKind { Linear, Batched, Conv, Pool, TrainConv, TrainConvBackward, Rnn };

struct Group {
  GroupKind kind;
  Node* anchor = nullptr;
  std::string label;
  Value src;
  // Linear / Batched: the weight operand (logical (K, N) or (B, K, N)).
  Value weight;
  const at::Tensor* weight_attr = nullptr;  // prepacked: the module attribute
  bool weight_transposed = false;           // logical weight = attr^T
  std::vector<int64_t> w_sizes, w_strides;  // logical weight layout (dynamic weights)
  std::optional<Value> bias;                // Linear: a 1-D value of size N
  // Conv
  const at::Tensor* conv_bias_attr = nullptr;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;
  bool has_bn = false;
  const at::Tensor *bn_w = nullptr, *bn_b = nullptr, *bn_rm = nullptr, *bn_rv = nullptr;
  double bn_eps = 1e-5;
  // The anchor (+ bias / BN) result, and the chain after it.
  Value base;
  std::vector<PostOp> post;
  // Chain nodes, each with the number of post-ops applied once it has run.
  std::vector<std::pair<Node*, size_t>> chain;
  std::vector<Node*> head;  // anchor, bias add, BN: always part of the group
  std::vector<Node*> helpers;  // get_attr / t nodes read only by the group (emitted on demand)
  Value out;
  size_t kept = 0;  // post-ops actually fused (after trimming)
  bool winograd = false;  // Conv: oneDNN's Winograd algorithm
  bool transposed = false;  // Conv: a transposed convolution (oneDNN's deconvolution)
  // Pool: max (else average) with this kernel (also uses stride, padding, dilation)
  bool pool_max = false;
  bool ceil_mode = false;
  bool count_include_pad = false;  // average pooling: divide by the window including padding
  std::vector<int64_t> kernel;
  // Rnn: the layer's shape and parameters; the initial states (c0: LSTM only).
  RnnSpec rnn;
  std::optional<Value> h0, c0;
};

std::string make_label(const Group& g, size_t kept) {
  std::string s;
  switch (g.kind) {
    case GroupKind::Linear: s = "linear"; break;
    case GroupKind::Batched: s = g.anchor->target() == "aten::bmm" || g.anchor->target() == "aten::baddbmm" ? "bmm" : "matmul"; break;
    case GroupKind::Conv: s = g.transposed ? "deconv" : "conv"; break;
    case GroupKind::Pool: s = g.pool_max ? "maxpool" : "avgpool"; break;
    case GroupKind::TrainConv: return "conv (winograd, weights as inputs)";
    case GroupKind::TrainConvBackward: return "conv backward (winograd)";
    case GroupKind::Rnn:
      return std::string(g.rnn.gru ? "gru" : "lstm") + " (" + std::to_string(g.rnn.layers) + " layer" +
             (g.rnn.layers > 1 ? "s" : "") + (g.rnn.dirs == 2 ? ", bidirectional" : "") + ")";
  }
  if (g.bias || g.conv_bias_attr) s += "+bias";
  if (g.has_bn) s += "+bn";
  for (size_t i = 0; i < kept; ++i) s += "+" + (g.post[i].is_add ? std::string("add") : g.post[i].e.label);
  return s;
}

// ---- the compiler -------------------------------------------------------------------------------

struct Reorder;
struct AtenFallback;
struct ActOut;

class Compiler {
 public:
  Compiler(GraphModule& gm) : gm_(gm) {
    size_t i = 0;
    for (const auto& n : gm.graph().nodes()) {
      order_.push_back(n.get());
      pos_[n.get()] = i++;
    }
  }

  void match();
  std::shared_ptr<Program> build();
  const std::vector<std::string>& fused() const { return fused_; }
  size_t num_groups() const { return groups_.size(); }
  // The call_function nodes of the matched groups: members and helpers (weight transposes).
  std::unordered_set<const Node*> group_nodes() const {
    std::unordered_set<const Node*> nodes = claimed_;
    for (const auto& g : groups_)
      for (const Node* h : g->helpers)
        if (h->kind() == NodeKind::CallFunction) nodes.insert(h);
    return nodes;
  }
  size_t blocked_values() const { return blocked_values_; }
  size_t winograd_convs() const { return winograd_convs_; }

 private:
  // matching
  bool match_linear(Node* n, Group& g);
  bool match_batched(Node* n, Group& g);
  bool match_conv(Node* n, Group& g);
  bool match_pool(Node* n, Group& g);
  bool match_train_conv(Node* n, Group& g);
  bool match_rnn(Node* n, Group& g);
  void extend_chain(Group& g);
  bool sole_use(const Value& v, ir::Use* use) const;
  bool claimed(const Node* n) const { return claimed_.count(n) != 0; }
  const at::Tensor* attr_of(const Value& v) const;
  bool side_effects_between(const Group& g, const Node* n) const;
  // A 2-D weight operand (K, N): prepacked attribute (through t / transpose) or a plain value.
  bool set_weight_2d(Group& g, const Value& w, bool transposed_by_op);

  // building
  uint32_t new_slot() { return static_cast<uint32_t>(prog_->num_slots++); }
  uint32_t plain(const Value& v);
  void emit_node(Node* n);
  void emit_aten(Node* n);
  bool emit_group(Group& g);
  bool emit_linear(Group& g, bool batched);
  bool emit_conv(Group& g);
  bool emit_pool(Group& g);
  bool emit_train_conv(Group& g);
  bool emit_rnn(Group& g);
  bool keep_blocked(const Value& v) const;
  PlainIn plain_in(const Value& v);
  // `out` written as the plain tensor `v` (NCHW): by the primitive itself when its destination
  // layout `dst` is plain, else into a buffer reordered to plain.
  void plain_output(ActOut& out, const md_t& dst, const md_t& plain_dst, const Value& v);
  // The ATen path of a group fusing a NaN-losing activation (AtenFallback), or null.
  std::shared_ptr<AtenFallback> make_fallback(const Group& g, size_t kept, const Value& out,
                                              std::vector<uint32_t>& reads);
  uint32_t add_mem(const md_t& md) {
    prog_->mem_descs.push_back(md);
    return static_cast<uint32_t>(prog_->mem_descs.size() - 1);
  }
  uint32_t add_buffer(size_t size) {
    prog_->buffer_sizes.push_back(size);
    return static_cast<uint32_t>(prog_->buffer_sizes.size() - 1);
  }
  // A reorder between two memory objects of the set, with its scratchpad.
  Reorder make_reorder(const md_t& from, const md_t& to);
  void note_scratchpad(const md_t& md) {
    prog_->buffer_sizes[0] = std::max(prog_->buffer_sizes[0], md.get_size());
  }
  // A primitive's scratchpad: a memory object over the shared scratch buffer, if it needs one.
  void add_scratchpad(const md_t& md, bool& has_scratch, uint32_t& mem) {
    if (!md.get_size()) return;
    has_scratch = true;
    mem = add_mem(md);
    note_scratchpad(md);
  }
  // The value a group produces with its first `kept` post-ops fused.
  static Value kept_output(const Group& g, size_t kept) {
    Value out = g.base;
    for (const auto& c : g.chain)
      if (c.second <= kept) out = c.first->output(0);
      else break;
    return out;
  }
  void push(std::unique_ptr<Step> s, std::vector<uint32_t> reads) {
    reads_.push_back(std::move(reads));
    prog_->steps.push_back(std::move(s));
  }

  GraphModule& gm_;
  std::vector<Node*> order_;
  std::unordered_map<const Node*, size_t> pos_;
  std::vector<std::unique_ptr<Group>> groups_;
  std::unordered_set<const Node*> claimed_;                 // group members (anchor, head, chain)
  std::unordered_map<const Node*, Group*> group_of_;        // every member -> its group
  std::unordered_map<const Node*, Group*> group_end_;       // last member -> group
  std::unordered_set<const Node*> deferred_;                // helpers emitted only on demand
  std::vector<std::string> fused_;
  size_t blocked_values_ = 0;
  size_t winograd_convs_ = 0;

  struct Loc {
    enum Kind { None, Slot, Blocked } kind = None;
    uint32_t index = 0;  // slot, or buffer
    md_t md;
    int64_t plain_slot = -1;
    std::vector<int64_t> sizes;
  };
  static Loc slot_loc(uint32_t slot) {
    Loc l;
    l.kind = Loc::Slot;
    l.index = slot;
    return l;
  }
  std::unordered_map<Value, Loc, ir::ValueHash> locs_;
  std::shared_ptr<Program> prog_;
  std::vector<std::vector<uint32_t>> reads_;
};

const at::Tensor* Compiler::attr_of(const Value& v) const {
  if (v.node->kind() != NodeKind::GetAttr) return nullptr;
  const at::Tensor& t = gm_.attribute(v.node->target());
  if (!t.defined() || t.is_inference() || t.scalar_type() != at::kFloat || !t.device().is_cpu() || t.is_sparse() ||
      t.is_mkldnn())
    return nullptr;
  return &t;
}

bool Compiler::sole_use(const Value& v, ir::Use* use) const {
  const auto& uses = v.node->uses(v.index);
  if (uses.size() != 1) return false;
  if (uses[0].user->kind() != NodeKind::CallFunction) return false;
  *use = uses[0];
  return true;
}

bool Compiler::side_effects_between(const Group& g, const Node* n) const {
  size_t a = pos_.at(g.anchor), b = pos_.at(n);
  for (size_t i = a + 1; i < b; ++i) {
    Node* m = order_[i];
    if (m->kind() == NodeKind::CallFunction && m->has_side_effects() && !group_of_.count(m)) {
      bool member = std::find(g.head.begin(), g.head.end(), m) != g.head.end();
      for (auto& c : g.chain) member |= c.first == m;
      if (!member) return true;
    }
  }
  return false;
}

bool Compiler::set_weight_2d(Group& g, const Value& w, bool) {
  const TensorMeta& wm = meta(w);
  if (!is_f32(wm) || wm.sizes.size() != 2) return false;
  g.weight = w;
  g.w_sizes = wm.sizes;
  g.w_strides = wm.strides;
  // Prepack an attribute read directly or through a 2-D transpose used only here.
  Node* wn = w.node;
  if (const at::Tensor* a = attr_of(w)) {
    g.weight_attr = a;
    g.weight_transposed = false;
    if (wn->uses(0).size() == 1) g.helpers.push_back(wn);
    return true;
  }
  bool is_t = is_call(wn, {"aten::t"}) ||
              (is_call(wn, {"aten::transpose.int"}) && wn->args().size() >= 3 && arg(wn, 1).is_constant() &&
               arg(wn, 2).is_constant() && scalar(arg(wn, 1).constant()) && scalar(arg(wn, 2).constant()) &&
               std::abs(*scalar(arg(wn, 1).constant()) - *scalar(arg(wn, 2).constant())) == 1.0) ||
              (is_call(wn, {"aten::permute"}) && int_list(arg(wn, 1).constant()) &&
               *int_list(arg(wn, 1).constant()) == std::vector<int64_t>{1, 0});
  if (is_t) {
    auto base = value_arg(wn, 0);
    if (base && meta(*base).sizes.size() == 2) {
      if (const at::Tensor* a = attr_of(*base)) {
        g.weight_attr = a;
        g.weight_transposed = true;
        if (total_uses(wn) == 1) {
          g.helpers.push_back(wn);
          if (base->node->uses(0).size() == 1) g.helpers.push_back(base->node);
        }
        return true;
      }
    }
  }
  return true;  // dynamic weight, read from its slot with the traced layout
}

// Collapse leading dims of an activation (..., K) into (M, K); nullopt if the layout does not allow it.
std::optional<std::pair<std::vector<int64_t>, std::vector<int64_t>>> as_2d(const TensorMeta& m) {
  const auto& s = m.sizes;
  const auto& st = m.strides;
  size_t n = s.size();
  if (n < 2) return std::nullopt;
  int64_t M = 1;
  for (size_t i = 0; i + 1 < n; ++i) M *= s[i];
  if (M == 0 || s[n - 1] == 0) return std::nullopt;
  // The non-trivial leading dims must collapse into one with a single stride.
  int64_t row = -1, expect = -1;
  for (size_t i = n - 1; i-- > 0;) {
    if (s[i] == 1) continue;
    if (row < 0) {
      row = st[i];
    } else if (st[i] != expect) {
      return std::nullopt;
    }
    expect = st[i] * s[i];
  }
  if (row < 0) row = s[n - 1] * st[n - 1];
  return std::make_pair(std::vector<int64_t>{M, s[n - 1]}, std::vector<int64_t>{row, st[n - 1]});
}

// Plain 2-D (M, N) layout of an activation (..., N), as_2d's.
md_t md_2d(const TensorMeta& m) {
  auto p = *as_2d(m);
  return plain_md(p.first, p.second);
}

bool Compiler::match_linear(Node* n, Group& g) {
  const std::string& t = n->target();
  g.kind = GroupKind::Linear;
  g.anchor = n;
  if (t == "aten::linear") {
    auto x = value_arg(n, 0), w = value_arg(n, 1);
    if (!x || !w || !is_f32(meta(*x)) || meta(*x).sizes.size() < 2) return false;
    const TensorMeta& wm = meta(*w);
    if (!is_f32(wm) || wm.sizes.size() != 2) return false;
    // The weight is (N, K): the logical (K, N) operand is its transpose.
    g.weight = *w;
    g.w_sizes = {wm.sizes[1], wm.sizes[0]};
    g.w_strides = {wm.strides[1], wm.strides[0]};
    if (const at::Tensor* a = attr_of(*w)) {
      g.weight_attr = a;
      g.weight_transposed = true;
      if (w->node->uses(0).size() == 1) g.helpers.push_back(w->node);
    }
    if (auto b = value_arg(n, 2)) {
      g.bias = *b;
    } else if (!none_arg(n, 2)) {
      return false;
    }
    g.src = *x;
  } else if (t == "aten::addmm") {
    auto b = value_arg(n, 0), x = value_arg(n, 1), w = value_arg(n, 2);
    auto beta = scalar_arg(n, 3), alpha = scalar_arg(n, 4);
    if (!b || !x || !w || beta != 1.0 || alpha != 1.0) return false;
    if (!is_f32(meta(*x)) || meta(*x).sizes.size() != 2) return false;
    g.bias = *b;
    g.src = *x;
    if (!set_weight_2d(g, *w, false)) return false;
  } else if (t == "aten::mm" || t == "aten::matmul") {
    auto x = value_arg(n, 0), w = value_arg(n, 1);
    if (!x || !w || !is_f32(meta(*x)) || meta(*w).sizes.size() != 2) return false;
    if (t == "aten::mm" && meta(*x).sizes.size() != 2) return false;
    if (meta(*x).sizes.size() < 2) return false;
    g.src = *x;
    if (!set_weight_2d(g, *w, false)) return false;
  } else {
    return false;
  }
  const TensorMeta& om = meta(n->output(0));
  if (!is_f32(om) || !is_contiguous(om.sizes, om.strides)) return false;
  if (!as_2d(meta(g.src))) return false;
  const int64_t N = g.w_sizes[1];
  if (g.w_sizes[0] != meta(g.src).sizes.back() || om.sizes.back() != N) return false;
  if (!g.weight_attr && !dynamic_gemm_pays(md_2d(meta(g.src)), plain_md(g.w_sizes, g.w_strides))) return false;
  if (g.bias) {
    const TensorMeta& bm = meta(*g.bias);
    if (!is_f32(bm) || bm.sizes != std::vector<int64_t>{N}) return false;
  }
  g.head.push_back(n);
  g.base = n->output(0);
  // A bias added by a separate (in-place) add, as LibTorch's Linear does for 3-D inputs.
  ir::Use u;
  if (!g.bias && sole_use(g.base, &u) && is_call(u.user, {"aten::add.Tensor", "aten::add_.Tensor"}) &&
      scalar_arg(u.user, 2) == 1.0) {
    Node* add = u.user;
    bool inplace = add->target() == "aten::add_.Tensor";
    auto other = value_arg(add, u.arg_index == 0 ? 1 : 0);
    if (other && (!inplace || u.arg_index == 0) && is_f32(meta(*other)) &&
        meta(*other).sizes == std::vector<int64_t>{N} && meta(add->output(0)).sizes == om.sizes &&
        is_f32(meta(add->output(0))) && other->node != n) {
      g.bias = *other;
      g.head.push_back(add);
      g.base = add->output(0);
    }
  }
  return true;
}

bool Compiler::match_batched(Node* n, Group& g) {
  g.kind = GroupKind::Batched;
  g.anchor = n;
  std::optional<Value> a, b, self;
  if (is_call(n, {"aten::bmm", "aten::matmul"})) {
    a = value_arg(n, 0);
    b = value_arg(n, 1);
  } else if (is_call(n, {"aten::baddbmm"})) {
    self = value_arg(n, 0);
    a = value_arg(n, 1);
    b = value_arg(n, 2);
    if (scalar_arg(n, 3) != 1.0 || scalar_arg(n, 4) != 1.0 || !self) return false;
  } else {
    return false;
  }
  if (!a || !b) return false;
  const TensorMeta &am = meta(*a), &bm = meta(*b), &om = meta(n->output(0));
  if (!is_f32(am) || !is_f32(bm) || !is_f32(om) || am.sizes.size() != 3 || bm.sizes.size() != 3) return false;
  if (am.sizes[0] != bm.sizes[0] || am.sizes[2] != bm.sizes[1] || !is_contiguous(om.sizes, om.strides)) return false;
  if (numel(am.sizes) == 0 || numel(bm.sizes) == 0) return false;
  g.src = *a;
  g.weight = *b;
  g.w_sizes = bm.sizes;
  g.w_strides = bm.strides;
  g.head.push_back(n);
  g.base = n->output(0);
  if (self) {
    const TensorMeta& sm = meta(*self);
    if (!is_f32(sm) || sm.sizes != om.sizes) return false;
    PostOp p;
    p.is_add = true;
    p.other = *self;
    g.post.push_back(p);
  }
  return true;
}

// Transposed convolutions run as oneDNN deconvolutions (channels-last activations) where that
// wins over ATen: with oneDNN 3 (brgemm kernels; a DCGAN generator 1.2x over LibTorch 2.6's eager,
// which runs oneDNN deconvolutions itself, but without BatchNorm folded), not with oneDNN 2.6,
// whose direct kernels ran that generator 2x slower than ATen 1.13's slow_conv_transpose2d.
// TORCHCOMPILE_ONEDNN_DECONV=1 / 0 overrides. (Read at each compile.)
bool deconv_enabled() {
  const char* e = std::getenv("TORCHCOMPILE_ONEDNN_DECONV");
  if (e && *e) return std::string(e) == "1";
  return DNNL_VERSION_MAJOR >= 3;
}

bool Compiler::match_conv(Node* n, Group& g) {
  g.kind = GroupKind::Conv;
  g.anchor = n;
  // Argument positions: conv2d(input, weight, bias, stride, padding, dilation, groups);
  // convolution(..., stride, padding, dilation, transposed, output_padding, groups);
  // conv_transpose2d(..., stride, padding, output_padding, groups, dilation).
  size_t groups_index, dilation_index = 5, output_padding_index = 7;
  if (is_call(n, {"aten::conv2d"})) {
    groups_index = 6;
  } else if (is_call(n, {"aten::convolution", "aten::_convolution"})) {
    auto transposed = scalar_arg(n, 6);
    if (!transposed) return false;
    g.transposed = *transposed != 0.0;
    groups_index = 8;
  } else if (is_call(n, {"aten::conv_transpose2d.input"})) {
    if (!deconv_enabled()) return false;
    g.transposed = true;
    groups_index = 6;
    dilation_index = 7;
    output_padding_index = 5;
  } else {
    return false;
  }
  auto x = value_arg(n, 0), w = value_arg(n, 1);
  if (!x || !w) return false;
  const TensorMeta &xm = meta(*x), &wm = meta(*w), &om = meta(n->output(0));
  if (!is_f32(xm) || !is_f32(wm) || !is_f32(om) || xm.sizes.size() != 4 || wm.sizes.size() != 4) return false;
  // Output channels: weight (OC, IC/groups, KH, KW), transposed (IC, OC/groups, KH, KW).
  const int64_t OC = g.transposed ? wm.sizes[1] : wm.sizes[0];
  if (!is_contiguous(xm.sizes, xm.strides) || !is_contiguous(om.sizes, om.strides)) return false;
  if (numel(xm.sizes) == 0 || numel(om.sizes) == 0) return false;
  g.weight_attr = attr_of(*w);
  if (!g.weight_attr) return false;
  if (w->node->uses(0).size() == 1) g.helpers.push_back(w->node);
  if (auto b = value_arg(n, 2)) {
    g.conv_bias_attr = attr_of(*b);
    if (!g.conv_bias_attr || meta(*b).sizes != std::vector<int64_t>{OC}) return false;
    if (b->node->uses(0).size() == 1) g.helpers.push_back(b->node);
  } else if (!none_arg(n, 2)) {
    return false;
  }
  for (size_t i : {size_t{3}, size_t{4}, dilation_index})
    if (!arg(n, i).is_constant()) return false;
  auto st = int_list(arg(n, 3).constant()), pd = int_list(arg(n, 4).constant()),
       dl = int_list(arg(n, dilation_index).constant());
  auto gr = scalar_arg(n, groups_index);
  if (!st || !pd || !dl || !gr) return false;
  g.stride = pair_of(*st);
  g.padding = pair_of(*pd);
  g.dilation = pair_of(*dl);
  g.groups = static_cast<int64_t>(*gr);
  if (g.stride.size() != 2 || g.padding.size() != 2 || g.dilation.size() != 2 || g.groups < 1) return false;
  if (g.transposed && !deconv_enabled()) return false;
  if (g.transposed) {
    // Ungrouped only; the output padding only shows in the output size (the right padding).
    if (g.groups != 1 || xm.sizes[1] != wm.sizes[0] || om.sizes[1] != OC) return false;
    if (!arg(n, output_padding_index).is_constant() || !int_list(arg(n, output_padding_index).constant())) return false;
    const std::vector<int64_t> k{wm.sizes[2], wm.sizes[3]};
    for (size_t d = 0; d < 2; ++d)  // oneDNN's right padding of the deconvolution must not be negative
      if ((xm.sizes[d + 2] - 1) * g.stride[d] + (k[d] - 1) * g.dilation[d] + 1 - om.sizes[d + 2] - g.padding[d] < 0)
        return false;
  } else if (xm.sizes[1] != wm.sizes[1] * g.groups || wm.sizes[0] % g.groups != 0) {
    return false;
  }
  g.src = *x;
  g.head.push_back(n);
  g.base = n->output(0);
  // Eval BatchNorm right after: folded into the weights.
  ir::Use u;
  if (sole_use(g.base, &u) && u.arg_index == 0) {
    Node* bn = u.user;
    bool ok = false;
    size_t eps_index = 0;
    if (is_call(bn, {"aten::batch_norm"})) {
      ok = scalar_arg(bn, 5) == 0.0;
      eps_index = 7;
    } else if (is_call(bn, {"aten::native_batch_norm"})) {
      ok = scalar_arg(bn, 5) == 0.0 && bn->uses(1).empty() && bn->uses(2).empty();
      eps_index = 7;
    } else if (is_call(bn, {"aten::_native_batch_norm_legit_no_training"})) {
      ok = bn->uses(1).empty() && bn->uses(2).empty();
      eps_index = 6;
    }
    if (ok) {
      auto eps = scalar_arg(bn, eps_index);
      auto rm = value_arg(bn, 3), rv = value_arg(bn, 4), bw = value_arg(bn, 1), bb = value_arg(bn, 2);
      const int64_t C = OC;
      auto attr_c = [&](const std::optional<Value>& v) -> const at::Tensor* {
        if (!v) return nullptr;
        const at::Tensor* a = attr_of(*v);
        return a && a->dim() == 1 && a->size(0) == C ? a : nullptr;
      };
      g.bn_rm = attr_c(rm);
      g.bn_rv = attr_c(rv);
      g.bn_w = attr_c(bw);
      g.bn_b = attr_c(bb);
      ok = eps && g.bn_rm && g.bn_rv && (g.bn_w || none_arg(bn, 1)) && (g.bn_b || none_arg(bn, 2)) &&
           is_f32(meta(bn->output(0))) && meta(bn->output(0)).sizes == om.sizes;
      if (ok) {
        g.has_bn = true;
        g.bn_eps = *eps;
        g.head.push_back(bn);
        for (auto& v : {rm, rv, bw, bb})
          if (v && v->node->kind() == NodeKind::GetAttr && v->node->uses(0).size() == 1) g.helpers.push_back(v->node);
        g.base = bn->output(0);
      } else {
        g.bn_rm = g.bn_rv = g.bn_w = g.bn_b = nullptr;
      }
    }
  }
  return true;
}

// oneDNN's Winograd F(4x4, 3x3) convolution does about half the multiplications of the direct
// one. Here it runs M3's second convolution (32 -> 64 channels, 64x64) in ~7 ms where the
// direct kernels take 11-17 ms. Used for 3x3, stride-1, undilated, ungrouped convolutions with
// channel counts that are multiples of 16 (its blocked layout) and at least 16x16 outputs;
// TORCHCOMPILE_ONEDNN_WINOGRAD=0 turns it off. Its results differ from a direct convolution
// by rounding only (a relative error around 1e-6 in fp32).
// (Read at each compile.)
bool winograd_enabled() {
  const char* e = std::getenv("TORCHCOMPILE_ONEDNN_WINOGRAD");
  return (!e || std::string(e) != "0") && winograd_available();
}

// Whether a convolution has the shapes above (`w` OIHW, `out` NCHW).
bool winograd_shape(const std::vector<int64_t>& w, const Group& g, const std::vector<int64_t>& out) {
  const std::vector<int64_t> one{1, 1};
  return w.size() == 4 && w[2] == 3 && w[3] == 3 && g.stride == one && g.dilation == one && g.groups == 1 &&
         w[0] % 16 == 0 && w[1] % 16 == 0 && out.size() == 4 && out[2] >= 16 && out[3] >= 16;
}

// An inference convolution with a prepacked weight that Winograd takes.
bool winograd_candidate(const Group& g, const std::vector<int64_t>& out_sizes) {
  return winograd_enabled() && g.kind == GroupKind::Conv && !g.transposed && g.weight_attr &&
         winograd_shape(g.weight_attr->sizes().vec(), g, out_sizes);
}

// oneDNN's right (bottom) padding of a convolution from `in` to `out` sizes with kernel `k`.
dnnl::memory::dims conv_pad_r(const Group& g, const std::vector<int64_t>& in, const std::vector<int64_t>& k,
                              const std::vector<int64_t>& out) {
  dnnl::memory::dims r(2);
  for (size_t d = 0; d < 2; ++d)
    r[d] = (out[d + 2] - 1) * g.stride[d] + (k[d + 2] - 1) * g.dilation[d] + 1 - in[d + 2] - g.padding[d];
  return r;
}

// Training graphs (AOT's forward and backward): convolutions whose weights are graph inputs, and
// their gradients (`convolution_backward`), with oneDNN's Winograd algorithm where it applies
// (3x3, stride 1, no dilation, one group, channel counts multiples of 16, outputs of at least
// 16x16): about twice as fast here as the direct kernel ATen runs them with, reorders included.
// Other training convolutions stay with ATen (oneDNN's direct kernel would gain nothing).
bool Compiler::match_train_conv(Node* n, Group& g) {
  if (!winograd_enabled()) return false;
  const bool backward = is_call(n, {"aten::convolution_backward"});
  if (!backward && !is_call(n, {"aten::convolution"})) return false;
  // convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups);
  // convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
  //                      transposed, output_padding, groups, output_mask)
  const size_t o = backward ? 1 : 0;
  auto x = value_arg(n, o), w = value_arg(n, o + 1);
  if (!x || !w || attr_of(*w)) return false;  // a module's weight: match_conv prepacks it
  std::optional<Value> gy = backward ? value_arg(n, 0) : std::nullopt;
  if (backward && !gy) return false;
  const size_t a = o + 3;
  for (size_t i = a; i < a + 3; ++i)
    if (!arg(n, i).is_constant()) return false;
  auto st = int_list(arg(n, a).constant()), pd = int_list(arg(n, a + 1).constant()),
       dl = int_list(arg(n, a + 2).constant());
  auto tr = scalar_arg(n, a + 3), gr = scalar_arg(n, a + 5);
  if (!st || !pd || !dl || !tr || *tr != 0.0 || !gr || *gr != 1.0) return false;
  g.stride = pair_of(*st);
  g.padding = pair_of(*pd);
  g.dilation = pair_of(*dl);
  g.groups = static_cast<int64_t>(*gr);
  if (g.padding.size() != 2) return false;
  const TensorMeta &xm = meta(*x), &wm = meta(*w);
  const Value y = backward ? *gy : n->output(0);
  const TensorMeta& ym = meta(y);
  for (const TensorMeta* m : {&xm, &wm, &ym})
    if (!is_f32(*m) || m->sizes.size() != 4 || !is_contiguous(m->sizes, m->strides) || numel(m->sizes) == 0)
      return false;
  if (!winograd_shape(wm.sizes, g, ym.sizes) || xm.sizes[1] != wm.sizes[1] || ym.sizes[1] != wm.sizes[0])
    return false;
  if (backward) {
    if (!arg(n, 10).is_constant() || !arg(n, 10).constant().isBoolList()) return false;
    auto mask = arg(n, 10).constant().toBoolList();
    if (mask.size() != 3 || (mask.get(2) && !mask.get(1))) return false;
  } else if (auto b = value_arg(n, 2)) {
    const TensorMeta& bm = meta(*b);
    if (!is_f32(bm) || bm.sizes != std::vector<int64_t>{wm.sizes[0]} || bm.strides != std::vector<int64_t>{1})
      return false;
    g.bias = *b;
  } else if (!none_arg(n, 2)) {
    return false;
  }
  g.kind = backward ? GroupKind::TrainConvBackward : GroupKind::TrainConv;
  g.anchor = n;
  g.src = *x;
  g.weight = *w;
  g.head.push_back(n);
  g.base = n->output(0);
  return true;
}

// Kernel, stride (empty: the kernel's), padding and ceil_mode of a 2-D pooling node (arguments
// 1-3 and `ceil_arg`) whose output is a plain, non-empty 4-D fp32 tensor.
bool read_pool_window(Node* n, Group& g, size_t ceil_arg) {
  for (size_t i = 1; i < 4; ++i)
    if (!arg(n, i).is_constant() || !int_list(arg(n, i).constant())) return false;
  g.kernel = pair_of(*int_list(arg(n, 1).constant()));
  std::vector<int64_t> st = *int_list(arg(n, 2).constant());
  g.stride = st.empty() ? g.kernel : pair_of(st);
  g.padding = pair_of(*int_list(arg(n, 3).constant()));
  auto ceil = arg(n, ceil_arg).is_constant() ? scalar_arg(n, ceil_arg) : std::nullopt;
  if (!ceil || g.kernel.size() != 2 || g.stride.size() != 2 || g.padding.size() != 2) return false;
  g.ceil_mode = *ceil != 0.0;
  const TensorMeta& om = meta(n->output(0));
  return is_f32(om) && om.sizes.size() == 4 && is_contiguous(om.sizes, om.strides) && numel(om.sizes) != 0;
}

bool Compiler::match_pool(Node* n, Group& g) {
  g.kind = GroupKind::Pool;
  g.anchor = n;
  auto x = value_arg(n, 0);
  if (!x) return false;
  const TensorMeta& xm = meta(*x);
  if (!is_f32(xm) || xm.sizes.size() != 4 || !is_contiguous(xm.sizes, xm.strides)) return false;
  // Max pooling: max_pool2d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode)
  // whose indices nothing reads (LibTorch's max_pool2d without grad), or max_pool2d itself.
  if (is_call(n, {"aten::max_pool2d_with_indices", "aten::max_pool2d"})) {
    if (n->target() == "aten::max_pool2d_with_indices" && !n->uses(1).empty()) return false;
    if (!arg(n, 4).is_constant() || !int_list(arg(n, 4).constant())) return false;
    g.dilation = pair_of(*int_list(arg(n, 4).constant()));
    if (g.dilation != std::vector<int64_t>{1, 1} || !read_pool_window(n, g, 5)) return false;
    g.pool_max = true;
    g.src = *x;
    g.head.push_back(n);
    g.base = n->output(0);
    return true;
  }
  // Average pooling: avg_pool2d(self, kernel_size, stride, padding, ceil_mode, count_include_pad,
  // divisor_override) without a divisor override. ATen divides by the window clipped to the
  // padded input (count_include_pad) or to the input (oneDNN's include / exclude padding), except
  // that the window ceil_mode adds past the padding is not counted by ATen: that case stays with it.
  if (is_call(n, {"aten::avg_pool2d"})) {
    g.dilation = {1, 1};
    auto include = arg(n, 5).is_constant() ? scalar_arg(n, 5) : std::nullopt;
    if (!include || !none_arg(n, 6) || !read_pool_window(n, g, 4)) return false;
    const TensorMeta& om = meta(n->output(0));
    g.count_include_pad = *include != 0.0;
    if (g.count_include_pad)
      for (size_t d = 0; d < 2; ++d)
        if ((om.sizes[d + 2] - 1) * g.stride[d] + g.kernel[d] > xm.sizes[d + 2] + 2 * g.padding[d]) return false;
    g.src = *x;
    g.head.push_back(n);
    g.base = n->output(0);
    return true;
  }
  // Global average pooling: only after a lowered convolution, whose output may then stay blocked.
  bool after_conv = false;
  for (auto& og : groups_)
    if (og->kind == GroupKind::Conv && og->out == *x) after_conv = true;
  if (!after_conv) return false;
  if (is_call(n, {"aten::adaptive_avg_pool2d"})) {
    auto os = int_list(arg(n, 1).constant());
    if (!arg(n, 1).is_constant() || !os || !(*os == std::vector<int64_t>{1, 1} || *os == std::vector<int64_t>{1}))
      return false;
  } else if (is_call(n, {"aten::mean.dim"})) {
    if (!arg(n, 1).is_constant()) return false;
    auto d = int_list(arg(n, 1).constant());
    if (!d || d->size() != 2 || !none_arg(n, 3)) return false;
    std::vector<int64_t> dd = *d;
    for (auto& v : dd) v = v < 0 ? v + 4 : v;
    std::sort(dd.begin(), dd.end());
    if (dd != std::vector<int64_t>{2, 3}) return false;
  } else {
    return false;
  }
  const TensorMeta& om = meta(n->output(0));
  if (!is_f32(om) || !is_contiguous(om.sizes, om.strides) || numel(om.sizes) != xm.sizes[0] * xm.sizes[1]) return false;
  g.kernel = {xm.sizes[2], xm.sizes[3]};
  g.stride = {1, 1};
  g.padding = {0, 0};
  g.src = *x;
  g.head.push_back(n);
  g.base = n->output(0);
  return true;
}

// aten::lstm.input(input, hx[], params[], has_biases, num_layers, dropout, train, bidirectional,
// batch_first) and aten::gru.input (the same with one hx tensor) over fp32 sequences, with the
// parameters as module attributes (prepacked) and without dropout between layers.
bool Compiler::match_rnn(Node* n, Group& g) {
  if (!rnn_enabled() || !is_call(n, {"aten::lstm.input", "aten::gru.input"})) return false;
  g.kind = GroupKind::Rnn;
  g.anchor = n;
  RnnSpec& s = g.rnn;
  s.gru = n->target() == "aten::gru.input";
  for (size_t i = 3; i < 9; ++i)
    if (!scalar_arg(n, i)) return false;
  s.has_biases = *scalar_arg(n, 3) != 0;
  s.layers = static_cast<int64_t>(*scalar_arg(n, 4));
  const bool dropout_active = *scalar_arg(n, 6) != 0 && *scalar_arg(n, 5) != 0 && s.layers > 1;
  s.dirs = *scalar_arg(n, 7) != 0 ? 2 : 1;
  s.batch_first = *scalar_arg(n, 8) != 0;
  if (dropout_active || s.layers < 1) return false;
  auto x = value_arg(n, 0);
  if (!x) return false;
  const TensorMeta& xm = meta(*x);
  if (!is_f32(xm) || xm.sizes.size() != 3 || !is_contiguous(xm.sizes, xm.strides) || numel(xm.sizes) == 0) return false;
  s.seq = xm.sizes[s.batch_first ? 1 : 0];
  s.batch = xm.sizes[s.batch_first ? 0 : 1];
  s.input_size = xm.sizes[2];
  // Initial states: (layers * dirs, batch, hidden), contiguous fp32.
  std::vector<Value> states;
  if (s.gru) {
    auto h = value_arg(n, 1);
    if (!h) return false;
    states.push_back(*h);
  } else {
    if (!arg(n, 1).is_list() || arg(n, 1).list().size() != 2) return false;
    for (const auto& e : arg(n, 1).list())
      if (!e || !meta(*e).defined) return false;
      else states.push_back(*e);
  }
  if (meta(states[0]).sizes.size() != 3) return false;
  s.hidden = meta(states[0]).sizes[2];
  const std::vector<int64_t> state_sizes{s.layers * s.dirs, s.batch, s.hidden};
  for (const Value& v : states)
    if (!is_f32(meta(v)) || meta(v).sizes != state_sizes || !is_contiguous(meta(v).sizes, meta(v).strides)) return false;
  // Parameters: module attributes of LibTorch's shapes (no projections).
  if (!arg(n, 2).is_list()) return false;
  const auto& ps = arg(n, 2).list();
  const int64_t per = s.params_per_cell(), G = s.gates(), H = s.hidden;
  if (static_cast<int64_t>(ps.size()) != s.layers * s.dirs * per) return false;
  for (size_t i = 0; i < ps.size(); ++i) {
    if (!ps[i]) return false;
    const at::Tensor* t = attr_of(*ps[i]);
    if (!t || !t->is_contiguous()) return false;
    const int64_t layer = static_cast<int64_t>(i) / (s.dirs * per), which = static_cast<int64_t>(i) % per;
    const int64_t in = layer == 0 ? s.input_size : s.dirs * H;
    const std::vector<int64_t> want = which == 0 ? std::vector<int64_t>{G * H, in}
                                      : which == 1 ? std::vector<int64_t>{G * H, H}
                                                   : std::vector<int64_t>{G * H};
    if (t->sizes().vec() != want) return false;
    s.params.push_back(t);
    g.helpers.push_back(ps[i]->node);
  }
  // The states come out contiguous; the sequence output is (T, N, D*H), batch-first as its
  // transposed view (ATen's layout).
  for (size_t i = 0; i < n->num_outputs(); ++i) {
    const TensorMeta& om = meta(n->output(i));
    if (!is_f32(om)) return false;
    if (i == 0 && s.batch_first) {
      std::vector<int64_t> tnc{om.sizes.at(1), om.sizes.at(0), om.sizes.at(2)};
      if (!is_contiguous(tnc, {om.strides.at(1), om.strides.at(0), om.strides.at(2)})) return false;
    } else if (!is_contiguous(om.sizes, om.strides)) {
      return false;
    }
  }
  g.src = *x;
  g.h0 = states[0];
  if (!s.gru) g.c0 = states[1];
  g.head.push_back(n);
  g.base = n->output(0);
  return true;
}

void Compiler::extend_chain(Group& g) {
  Value v = g.base;
  size_t adds = 0;
  for (auto& p : g.post) adds += p.is_add;
  const std::vector<int64_t>& out_sizes = meta(v).sizes;
  while (true) {
    ir::Use u;
    if (!sole_use(v, &u)) break;
    Node* n = u.user;
    if (claimed(n)) break;
    if (!is_f32(meta(n->output(0))) || meta(n->output(0)).sizes != out_sizes) break;
    if (side_effects_between(g, n)) break;
    if (is_identity_dropout(n)) {
      if (u.arg_index != 0) break;
      g.chain.emplace_back(n, g.post.size());
      v = n->output(0);
      continue;
    }
    if (auto e = eltwise_of(n)) {
      if (u.arg_index != 0) break;
      PostOp p;
      p.e = *e;
      g.post.push_back(p);
      g.chain.emplace_back(n, g.post.size());
      v = n->output(0);
      continue;
    }
    if (is_call(n, {"aten::add.Tensor", "aten::add_.Tensor"}) && scalar_arg(n, 2) == 1.0 && adds == 0) {
      bool inplace = n->target() == "aten::add_.Tensor";
      if (inplace && u.arg_index != 0) break;
      if (u.arg_index > 1) break;
      auto other = value_arg(n, u.arg_index == 0 ? 1 : 0);
      if (!other || *other == v || !is_f32(meta(*other)) || meta(*other).sizes != out_sizes) break;
      if (g.kind == GroupKind::Linear && !as_2d(meta(*other))) break;
      if (g.kind == GroupKind::Pool) break;
      PostOp p;
      p.is_add = true;
      p.other = *other;
      g.post.push_back(p);
      g.chain.emplace_back(n, g.post.size());
      ++adds;
      v = n->output(0);
      continue;
    }
    break;
  }
  // Trailing dropouts are kept in the chain; the group's value is the last chain node's.
  g.out = v;
  g.kept = g.post.size();
}

void Compiler::match() {
  for (Node* n : order_) {
    if (n->kind() != NodeKind::CallFunction || claimed(n)) continue;
    auto g = std::make_unique<Group>();
    bool ok = false;
    // Each matcher checks the exact operator and its arguments; the kind picks the matcher.
    switch (ir::node_properties(*n).kind) {
      case ir::OpKind::Other: ok = match_rnn(n, *g); break;
      case ir::OpKind::Gemm: ok = match_linear(n, *g) || match_batched(n, *g); break;
      case ir::OpKind::Convolution: ok = match_conv(n, *g) || match_train_conv(n, *g); break;
      case ir::OpKind::Pooling:
      case ir::OpKind::Reduction: ok = match_pool(n, *g); break;
      default: break;
    }
    if (!ok) continue;
    if (g->kind == GroupKind::Linear || g->kind == GroupKind::Batched || g->kind == GroupKind::Conv) extend_chain(*g);
    else g->out = g->base;
    for (Node* m : g->head) claimed_.insert(m), group_of_[m] = g.get();
    for (auto& c : g->chain) claimed_.insert(c.first), group_of_[c.first] = g.get();
    Node* end = g->chain.empty() ? g->head.back() : g->chain.back().first;
    group_end_[end] = g.get();
    groups_.push_back(std::move(g));
  }
  // Helpers (get_attr, t of a prepacked weight) are emitted only if something else needs them.
  for (auto& g : groups_)
    for (Node* h : g->helpers) deferred_.insert(h);
}

// ---- steps --------------------------------------------------------------------------------------

struct AttrStep : Step {
  const at::Tensor* attr;
  uint32_t out;
  void run(Ctx& c) const override {
    c.slots[out] = *attr;
    if (c.below_autograd) c.below_autograd = ir::may_dispatch_below_autograd(attr, 1);
  }
};

// An ATen call of a node oneDNN does not run: the interpreter's prepared step.
struct AtenStep : Step {
  ir::OpStep call;
  explicit AtenStep(ir::OpStep c) : call(std::move(c)) {}
  void run(Ctx& c) const override { call.run(c.slots, *c.stack, c.below_autograd); }
};

inline void set_handle(const dnnl::memory& m, void* p) {
  dnnl::error::wrap_c_api(dnnl_memory_set_data_handle(m.get(), p), "could not set a memory handle");
}

struct ExecArgs {
  dnnl_exec_arg_t a[12];
  int n = 0;
  void add(int arg, const dnnl::memory& m) { a[n++] = {arg, m.get()}; }
  // Points `m` at `p` and passes it as `arg`.
  void bind(int arg, const dnnl::memory& m, void* p) {
    set_handle(m, p);
    add(arg, m);
  }
};

inline void execute(const dnnl::primitive& p, const Ctx& c, const ExecArgs& args) {
  dnnl::error::wrap_c_api(dnnl_primitive_execute(p.get(), c.stream, args.n, args.a), "could not execute a primitive");
}

// Reorder between two memory objects of the set.
struct Reorder {
  dnnl::reorder prim;
  uint32_t mem_from = 0, mem_to = 0, mem_scratch = 0;
  bool has_scratch = false;
  void run(const Ctx& c, void* from, void* to) const {
    const auto& m = c.ms->mems;
    set_handle(m[mem_from], from);
    set_handle(m[mem_to], to);
    ExecArgs args;
    args.add(DNNL_ARG_FROM, m[mem_from]);
    args.add(DNNL_ARG_TO, m[mem_to]);
    if (has_scratch) {
      args.bind(DNNL_ARG_SCRATCHPAD, m[mem_scratch], c.ms->buffer_ptrs[0]);
    }
    execute(prim, c, args);
  }
};

dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

Reorder Compiler::make_reorder(const md_t& from, const md_t& to) {
  Reorder r;
  dnnl::reorder::primitive_desc rpd(cpu_engine(), from, cpu_engine(), to, user_scratchpad_attr());
  r.prim = dnnl::reorder(rpd);
  r.mem_from = add_mem(from);
  r.mem_to = add_mem(to);
  add_scratchpad(rpd.scratchpad_desc(), r.has_scratch, r.mem_scratch);
  return r;
}

// Blocked value -> plain fp32 tensor.
struct ToPlainStep : Step {
  Reorder r;
  uint32_t buffer, out;
  std::vector<int64_t> sizes;
  void run(Ctx& c) const override {
    at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(at::kFloat));
    r.run(c, c.ms->buffer_ptrs[buffer], t.data_ptr());
    c.slots[out] = std::move(t);
  }
};

// Whether one of `n` floats at `p` has a magnitude whose bits exceed `limit`: 0x7f800000 finds a
// NaN, 0x7f7fffff a NaN or an infinity. One pass of integer compares, vectorized for AVX-512,
// AVX2 or SSE2, chosen at the first call (~0.1 ms for 2 M floats here). Not GCC's target_clones:
// its ifunc resolver runs before ThreadSanitizer's runtime is up and crashes the process.
inline __attribute__((always_inline)) bool magnitude_above(const void* p, size_t n, int32_t limit) {
  typedef int32_t __attribute__((may_alias)) word;  // float data read as integers
  const word* bits = static_cast<const word*>(p);
  int32_t found = 0;
  for (size_t i = 0; i < n; ++i) found |= (bits[i] & 0x7fffffff) > limit;
  return found != 0;
}
__attribute__((target("avx512f"), optimize("O3"))) bool magnitude_above_avx512(const void* p, size_t n, int32_t l) {
  return magnitude_above(p, n, l);
}
__attribute__((target("avx2"), optimize("O3"))) bool magnitude_above_avx2(const void* p, size_t n, int32_t l) {
  return magnitude_above(p, n, l);
}
__attribute__((optimize("O3"))) bool magnitude_above_sse2(const void* p, size_t n, int32_t l) {
  return magnitude_above(p, n, l);
}
bool any_magnitude_above(const void* p, size_t n, int32_t limit) {
  static const auto fn = __builtin_cpu_supports("avx512f") ? magnitude_above_avx512
                         : __builtin_cpu_supports("avx2")  ? magnitude_above_avx2
                                                           : magnitude_above_sse2;
  return fn(p, n, limit);
}

bool any_nan(const void* p, size_t n) { return any_magnitude_above(p, n, 0x7f800000); }

// Whether `n` floats at `p` hold a NaN or an infinity.
bool any_nonfinite(const void* p, size_t n) { return any_magnitude_above(p, n, 0x7f7fffff); }

// Scans the floats between the tensor's first and last element: exactly its elements when its
// layout is dense (contiguous, or a transposed / permuted weight as training graphs pass them);
// for a view with gaps of at most 3x its size, those gaps too, which can only send a call to the
// ATen path, never keep it from it. Other tensors go through ATen's isfinite (several kernels).
bool any_nonfinite(const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return false;
  if (t.scalar_type() == at::kFloat) {
    int64_t span = 1;
    for (int64_t d = 0; d < t.dim(); ++d) span += (t.size(d) - 1) * t.stride(d);  // ATen strides are >= 0
    if (span <= 4 * t.numel()) return any_nonfinite(t.data_ptr(), static_cast<size_t>(span));
  }
  return !at::isfinite(t).all().item<bool>();
}

// oneDNN computes relu and clip (relu6, hardtanh, clamp) post-ops as a max/min against a
// constant, which turns a NaN into the constant where ATen keeps the NaN. A group fusing one of
// them checks its inputs on every call (activations and, when packing, weights); when one holds a
// NaN or an infinity (an infinity can make a NaN inside the GEMM), the call runs the group's nodes
// through ATen, as eager does. Finite inputs give finite pre-activations (barring overflow), which
// those post-ops compute exactly.
struct AtenFallback {
  struct Scan {
    bool blocked = false;
    uint32_t index = 0;  // buffer (blocked) or slot
    size_t floats = 0;   // blocked: the buffer's size in floats
  };
  struct Unblock {  // a blocked input, made plain for the ATen steps
    uint32_t buffer = 0;
    std::vector<int64_t> sizes;
    std::optional<Reorder> reorder;
    uint32_t slot = 0;
  };
  std::vector<Scan> scans;
  std::vector<Unblock> unblock;
  std::vector<ir::OpStep> steps;   // the group's nodes, in graph order
  std::vector<uint32_t> private_slots;
  uint32_t result_slot = 0;

  bool triggered(const Ctx& c, const Packed* packed) const {
    if (packed && packed->nonfinite) return true;
    for (const Scan& s : scans) {
      if (s.blocked ? any_nonfinite(c.ms->buffer_ptrs[s.index], s.floats) : any_nonfinite(c.slots[s.index])) return true;
    }
    return false;
  }
  // Runs the group's nodes; returns their result (and clears the private slots).
  at::Tensor run(Ctx& c) const {
    for (const Unblock& u : unblock) {
      at::Tensor t = at::empty(u.sizes, at::TensorOptions().dtype(at::kFloat));
      u.reorder->run(c, c.ms->buffer_ptrs[u.buffer], t.data_ptr());
      c.slots[u.slot] = std::move(t);
    }
    for (const ir::OpStep& s : steps) s.run(c.slots, *c.stack, c.below_autograd);
    at::Tensor result = std::move(c.slots[result_slot]);
    for (uint32_t s : private_slots) c.slots[s] = at::Tensor();
    return result;
  }
};

struct MatmulStep : Step {
  dnnl::matmul prim;
  PlainIn src;
  std::shared_ptr<PackedHolder> packed;
  PlainIn wei;  // dynamic weights
  bool has_bias = false;
  PlainIn bias;
  std::vector<PlainIn> bins;  // binary-add operands
  std::vector<int> bin_post_index;  // their positions among the post-ops
  std::vector<int64_t> out_sizes;
  uint32_t out = 0;
  uint32_t m_src, m_wei, m_bias, m_dst, m_scratch;
  std::vector<uint32_t> m_bins;
  bool has_scratch = false;
  std::shared_ptr<const AtenFallback> fallback;

  void run(Ctx& c) const override {
    const auto& m = c.ms->mems;
    at::Tensor tmp_src, tmp_wei, tmp_bias;
    ExecArgs args;
    std::shared_ptr<const Packed> pk;
    if (packed) pk = packed->get();
    if (fallback && fallback->triggered(c, pk.get())) {
      c.slots[out] = fallback->run(c);
      return;
    }
    const at::Tensor& x = src.get(c, tmp_src);
    args.bind(DNNL_ARG_SRC, m[m_src], x.data_ptr());
    if (packed) {
      set_handle(m[m_wei], pk->weight.data_ptr());
    } else {
      set_handle(m[m_wei], wei.get(c, tmp_wei).data_ptr());
    }
    args.add(DNNL_ARG_WEIGHTS, m[m_wei]);
    if (has_bias) {
      args.bind(DNNL_ARG_BIAS, m[m_bias], bias.get(c, tmp_bias).data_ptr());
    }
    at::Tensor tmp_bins[2];
    for (size_t i = 0; i < bins.size(); ++i) {
      args.bind(DNNL_ARG_ATTR_MULTIPLE_POST_OP(bin_post_index[i]) | DNNL_ARG_SRC_1, m[m_bins[i]], bins[i].get(c, tmp_bins[i]).data_ptr());
    }
    at::Tensor y = at::empty(out_sizes, at::TensorOptions().dtype(at::kFloat));
    args.bind(DNNL_ARG_DST, m[m_dst], y.data_ptr());
    if (has_scratch) {
      args.bind(DNNL_ARG_SCRATCHPAD, m[m_scratch], c.ms->buffer_ptrs[0]);
    }
    execute(prim, c, args);
    c.slots[out] = std::move(y);
  }
};

// Where a conv / pool reads its source: a plain slot or a blocked buffer, optionally reordered
// into the primitive's source layout first.
struct ActIn {
  bool blocked = false;
  uint32_t index = 0;  // buffer (blocked) or slot
  PlainIn plain;
  std::optional<Reorder> reorder;  // to `reorder_buffer`
  uint32_t reorder_buffer = 0;
  void* get(const Ctx& c, at::Tensor& tmp) const {
    void* p = blocked ? c.ms->buffer_ptrs[index] : plain.get(c, tmp).data_ptr();
    if (!reorder) return p;
    void* q = c.ms->buffer_ptrs[reorder_buffer];
    reorder->run(c, p, q);
    return q;
  }
};

// Conv / pool output: a blocked buffer, a plain tensor directly, or a buffer reordered to plain.
struct ActOut {
  bool blocked = false;  // stays in `buffer`
  bool direct = false;   // the primitive writes the plain tensor
  uint32_t buffer = 0;
  std::optional<Reorder> to_plain;
  std::vector<int64_t> sizes;  // plain tensor
  uint32_t slot = 0;
};

struct ConvStep : Step {
  dnnl::primitive prim;
  ActIn src;
  std::shared_ptr<PackedHolder> packed;
  ActOut out;
  bool has_sum = false;
  ActIn sum_src;           // residual: read, then reordered into the destination
  std::optional<Reorder> sum_reorder;
  uint32_t m_src, m_wei, m_bias, m_dst, m_scratch;
  bool has_scratch = false;
  std::shared_ptr<const AtenFallback> fallback;
  std::optional<Reorder> fallback_to_blocked;  // the ATen result into a blocked output

  void run(Ctx& c) const override {
    const auto& m = c.ms->mems;
    at::Tensor tmp_src, tmp_sum;
    std::shared_ptr<const Packed> pk = packed->get();
    if (fallback && fallback->triggered(c, pk.get())) {
      at::Tensor y = fallback->run(c).contiguous();
      if (out.blocked) {
        fallback_to_blocked->run(c, y.data_ptr(), c.ms->buffer_ptrs[out.buffer]);
      } else {
        c.slots[out.slot] = std::move(y);
      }
      return;
    }
    void* x = src.get(c, tmp_src);
    at::Tensor y;
    void* dst;
    if (out.direct) {
      y = at::empty(out.sizes, at::TensorOptions().dtype(at::kFloat));
      dst = y.data_ptr();
    } else {
      dst = c.ms->buffer_ptrs[out.buffer];
    }
    if (has_sum) {
      void* r = sum_src.get(c, tmp_sum);
      sum_reorder->run(c, r, dst);
    }
    ExecArgs args;
    args.bind(DNNL_ARG_SRC, m[m_src], x);
    args.bind(DNNL_ARG_WEIGHTS, m[m_wei], pk->weight.data_ptr());
    args.bind(DNNL_ARG_BIAS, m[m_bias], pk->bias.data_ptr());
    args.bind(DNNL_ARG_DST, m[m_dst], dst);
    if (has_scratch) {
      args.bind(DNNL_ARG_SCRATCHPAD, m[m_scratch], c.ms->buffer_ptrs[0]);
    }
    execute(prim, c, args);
    if (out.direct) {
      c.slots[out.slot] = std::move(y);
    } else if (!out.blocked) {
      y = at::empty(out.sizes, at::TensorOptions().dtype(at::kFloat));
      out.to_plain->run(c, dst, y.data_ptr());
      c.slots[out.slot] = std::move(y);
    }
  }
};


// What a max pooling runs when its input holds a NaN: ATen's kernel, which propagates it (oneDNN's
// max does not).
struct NanFallback {
  std::vector<int64_t> kernel, stride, padding;
  bool ceil_mode = false;
  std::vector<int64_t> src_sizes;  // plain NCHW
  size_t src_floats = 0;           // what the NaN scan reads (a blocked layout's padding included)
  std::optional<Reorder> to_plain;  // a blocked source, to NCHW
};

struct PoolStep : Step {
  dnnl::primitive prim;
  ActIn src;
  ActOut out;
  uint32_t m_src, m_dst, m_scratch;
  bool has_scratch = false;
  std::optional<NanFallback> nan;  // max pooling
  void run(Ctx& c) const override {
    const auto& m = c.ms->mems;
    at::Tensor tmp_src;
    void* x = src.get(c, tmp_src);
    if (nan && any_nan(x, nan->src_floats)) {
      at::Tensor plain;
      if (src.blocked) {
        plain = at::empty(nan->src_sizes, at::TensorOptions().dtype(at::kFloat));
        nan->to_plain->run(c, x, plain.data_ptr());
      } else {
        plain = src.plain.get(c, tmp_src);
      }
      c.slots[out.slot] = at::max_pool2d(plain, nan->kernel, nan->stride, nan->padding, 1, nan->ceil_mode);
      return;
    }
    at::Tensor y = out.blocked ? at::Tensor() : at::empty(out.sizes, at::TensorOptions().dtype(at::kFloat));
    void* dst = out.direct ? y.data_ptr() : c.ms->buffer_ptrs[out.buffer];
    ExecArgs args;
    args.bind(DNNL_ARG_SRC, m[m_src], x);
    args.bind(DNNL_ARG_DST, m[m_dst], dst);
    if (has_scratch) {
      args.bind(DNNL_ARG_SCRATCHPAD, m[m_scratch], c.ms->buffer_ptrs[0]);
    }
    execute(prim, c, args);
    if (out.blocked) return;
    if (!out.direct) out.to_plain->run(c, dst, y.data_ptr());
    c.slots[out.slot] = std::move(y);
  }
};

// ---- building -----------------------------------------------------------------------------------

// A oneDNN primitive over plain (NCHW / OIHW) tensors from slots: each input reordered into the
// primitive's layout if it has another, each result allocated plain and reordered back into it.
struct PlainPrimitiveStep : Step {
  struct In {
    int arg = 0;
    PlainIn src;
    uint32_t mem = 0;
    std::optional<Reorder> reorder;
    uint32_t buffer = 0;
  };
  struct Out {
    int arg = 0;
    uint32_t slot = 0;
    std::vector<int64_t> sizes;
    uint32_t mem = 0;
    std::optional<Reorder> reorder;
    uint32_t buffer = 0;
  };
  dnnl::primitive prim;
  std::vector<In> ins;
  std::vector<Out> outs;
  uint32_t m_scratch = 0;
  bool has_scratch = false;

  void run(Ctx& c) const override {
    const auto& m = c.ms->mems;
    ExecArgs args;
    c10::SmallVector<at::Tensor, 4> tmp(ins.size());
    for (size_t i = 0; i < ins.size(); ++i) {
      const In& in = ins[i];
      void* p = in.src.get(c, tmp[i]).data_ptr();
      if (in.reorder) {
        void* b = c.ms->buffer_ptrs[in.buffer];
        in.reorder->run(c, p, b);
        p = b;
      }
      args.bind(in.arg, m[in.mem], p);
    }
    c10::SmallVector<at::Tensor, 3> results(outs.size());
    for (size_t i = 0; i < outs.size(); ++i) {
      const Out& o = outs[i];
      results[i] = at::empty(o.sizes, at::TensorOptions().dtype(at::kFloat));
      args.bind(o.arg, m[o.mem], o.reorder ? c.ms->buffer_ptrs[o.buffer] : results[i].data_ptr());
    }
    if (has_scratch) args.bind(DNNL_ARG_SCRATCHPAD, m[m_scratch], c.ms->buffer_ptrs[0]);
    execute(prim, c, args);
    for (size_t i = 0; i < outs.size(); ++i) {
      const Out& o = outs[i];
      if (o.reorder) o.reorder->run(c, c.ms->buffer_ptrs[o.buffer], results[i].data_ptr());
      c.slots[o.slot] = std::move(results[i]);
    }
  }
};

PlainIn Compiler::plain_in(const Value& v) {
  PlainIn p;
  p.slot = plain(v);
  p.sizes = meta(v).sizes;
  p.strides = meta(v).strides;
  return p;
}

uint32_t Compiler::plain(const Value& v) {
  auto it = locs_.find(v);
  if (it == locs_.end() || it->second.kind == Loc::None) {
    TORCH_INTERNAL_ASSERT(deferred_.count(v.node), "onednn backend: value of ", v.node->name(), " is not available");
    deferred_.erase(v.node);
    emit_node(v.node);
    it = locs_.find(v);
    TORCH_INTERNAL_ASSERT(it != locs_.end());
  }
  Loc& l = it->second;
  if (l.kind == Loc::Slot) return l.index;
  if (l.plain_slot < 0) {
    auto s = std::make_unique<ToPlainStep>();
    s->r = make_reorder(l.md, md_t(dims(l.sizes.begin(), l.sizes.end()), dt::f32, tag::nchw));
    s->buffer = l.index;
    s->sizes = l.sizes;
    s->out = new_slot();
    l.plain_slot = s->out;
    push(std::move(s), {});
  }
  return static_cast<uint32_t>(l.plain_slot);
}

void Compiler::emit_node(Node* n) {
  switch (n->kind()) {
    case NodeKind::Placeholder:
      TORCH_INTERNAL_ASSERT(false, "placeholder emitted as a step");
    case NodeKind::GetAttr: {
      auto s = std::make_unique<AttrStep>();
      s->attr = &gm_.attribute(n->target());
      s->out = new_slot();
      locs_[n->output(0)] = slot_loc(s->out);
      push(std::move(s), {});
      return;
    }
    case NodeKind::CallFunction:
      emit_aten(n);
      return;
    default:
      TORCH_CHECK(false, "onednn backend: cannot run node ", n->name());
  }
}

void Compiler::emit_aten(Node* n) {
  std::vector<uint32_t> outs;
  for (size_t i = 0; i < n->num_outputs(); ++i) outs.push_back(new_slot());
  ir::OpStep call(*n, [&](const ir::Value& v) { return plain(v); }, outs);
  for (size_t i = 0; i < n->num_outputs(); ++i) locs_[n->output(i)] = slot_loc(outs[i]);
  std::vector<uint32_t> reads = call.reads();
  push(std::make_unique<AtenStep>(std::move(call)), std::move(reads));
}

dnnl::post_ops make_post_ops(const Group& g, size_t kept, const std::vector<md_t>& add_mds, bool conv_sum) {
  dnnl::post_ops po;
  size_t add_index = 0;
  for (size_t i = 0; i < kept; ++i) {
    const PostOp& p = g.post[i];
    if (p.is_add) {
      if (conv_sum) po.append_sum(1.f);
      else po.append_binary(dnnl::algorithm::binary_add, add_mds.at(add_index++));
    } else {
      compat::append_eltwise(po, p.e.alg, p.e.alpha, p.e.beta);
    }
  }
  return po;
}

bool Compiler::emit_linear(Group& g, bool batched) {
  const TensorMeta& xm = meta(g.src);
  const TensorMeta& om = meta(g.out);
  md_t src_md, wei_md, dst_md, bias_md;
  std::vector<int64_t> out_sizes = om.sizes;
  if (batched) {
    src_md = plain_md(xm.sizes, xm.strides);
    wei_md = plain_md(g.w_sizes, g.w_strides);
    dst_md = plain_md(out_sizes, contiguous_strides(out_sizes));
  } else {
    src_md = md_2d(xm);
    const int64_t K = g.w_sizes[0], N = g.w_sizes[1];
    const int64_t M = compat::dims_of(src_md)[0];
    wei_md = g.weight_attr ? md_t({K, N}, dt::f32, tag::any) : plain_md(g.w_sizes, g.w_strides);
    dst_md = md_t({M, N}, dt::f32, tag::ab);
    if (g.bias) bias_md = md_t({1, N}, dt::f32, tag::ab);
  }
  // Trim post-ops until oneDNN accepts the chain (never below the anchor itself).
  for (size_t kept = g.kept + 1; kept-- > 0;) {
    std::vector<md_t> add_mds;
    for (size_t i = 0; i < kept; ++i)
      if (g.post[i].is_add) {
        const TensorMeta& rm = meta(g.post[i].other);
        add_mds.push_back(batched ? plain_md(rm.sizes, rm.strides) : md_2d(rm));
      }
    dnnl::primitive_attr attr = user_scratchpad_attr();
    attr.set_post_ops(make_post_ops(g, kept, add_mds, false));
    std::optional<dnnl::matmul::primitive_desc> pd;
    try {
      pd.emplace(compat::matmul_pd(cpu_engine(), src_md, wei_md, g.bias ? bias_md : md_t(), dst_md, attr));
    } catch (const dnnl::error&) {
      continue;
    }
    if (is_ref_impl(pd->impl_info_str())) continue;
    g.kept = kept;
    auto s = std::make_unique<MatmulStep>();
    std::vector<uint32_t> reads;
    s->prim = dnnl::matmul(*pd);
    s->src = plain_in(g.src);
    reads.push_back(s->src.slot);
    s->m_src = add_mem(src_md);
    s->m_wei = add_mem(pd->weights_desc());
    if (g.weight_attr) {
      const at::Tensor* attr_t = g.weight_attr;
      bool transposed = g.weight_transposed;
      md_t packed_md = pd->weights_desc();
      std::vector<int64_t> lsz = g.w_sizes;
      s->packed = std::make_shared<PackedHolder>(std::vector<const at::Tensor*>{attr_t}, [=]() {
        auto p = std::make_shared<Packed>();
        record_sources(*p, {attr_t});
        at::NoGradGuard no_grad;
        at::Tensor w = transposed ? attr_t->t() : *attr_t;
        w = w.contiguous();  // a plain (K, N) source
        p->nonfinite = any_nonfinite(w);
        md_t user = plain_md(lsz, contiguous_strides(lsz));
        p->weight = at::empty({static_cast<int64_t>(packed_md.get_size()) + 64}, at::kByte);
        reorder_now(user, w.data_ptr(), packed_md, p->weight.data_ptr());
        return std::shared_ptr<const Packed>(std::move(p));
      });
    } else {
      s->wei.slot = plain(g.weight);
      s->wei.sizes = meta(g.weight).sizes;
      s->wei.strides = meta(g.weight).strides;
      reads.push_back(s->wei.slot);
    }
    if (g.bias) {
      s->has_bias = true;
      s->bias.slot = plain(*g.bias);
      s->bias.sizes = meta(*g.bias).sizes;
      s->bias.strides = {1};
      s->m_bias = add_mem(bias_md);
      reads.push_back(s->bias.slot);
    }
    size_t ai = 0;
    for (size_t i = 0; i < kept; ++i)
      if (g.post[i].is_add) {
        s->bins.push_back(plain_in(g.post[i].other));
        reads.push_back(s->bins.back().slot);
        s->bin_post_index.push_back(static_cast<int>(i));  // one post-op per chain entry
        s->m_bins.push_back(add_mem(add_mds[ai++]));
      }
    s->m_dst = add_mem(dst_md);
    add_scratchpad(pd->scratchpad_desc(), s->has_scratch, s->m_scratch);
    // The result of the kept part of the chain.
    Value out = kept_output(g, kept);
    g.out = out;
    s->fallback = make_fallback(g, kept, out, reads);
    s->out_sizes = meta(out).sizes;
    s->out = new_slot();
    locs_[out] = slot_loc(s->out);
    push(std::move(s), std::move(reads));
    return true;
  }
  return false;
}


void Compiler::plain_output(ActOut& out, const md_t& dst, const md_t& plain_dst, const Value& v) {
  out.slot = new_slot();
  if (dst == plain_dst) {
    out.direct = true;
  } else {
    out.buffer = add_buffer(dst.get_size());
    out.to_plain = make_reorder(dst, plain_dst);
  }
  locs_[v] = slot_loc(out.slot);
}

bool fuses_nan_losing_activation(const Group& g, size_t kept) {
  for (size_t i = 0; i < kept; ++i) {
    const PostOp& p = g.post[i];
    if (p.is_add) continue;
    if ((p.e.alg == dnnl::algorithm::eltwise_relu && p.e.alpha == 0.f) || p.e.alg == dnnl::algorithm::eltwise_clip)
      return true;
  }
  return false;
}

std::shared_ptr<AtenFallback> Compiler::make_fallback(const Group& g, size_t kept, const Value& out,
                                                      std::vector<uint32_t>& reads) {
  if (!fuses_nan_losing_activation(g, kept)) return nullptr;
  auto f = std::make_shared<AtenFallback>();
  std::vector<Node*> nodes(g.head.begin(), g.head.end());
  for (const auto& ch : g.chain) {
    if (ch.second > kept) break;
    nodes.push_back(ch.first);
  }
  std::sort(nodes.begin(), nodes.end(), [&](Node* a, Node* b) { return pos_.at(a) < pos_.at(b); });
  std::unordered_map<Value, uint32_t, ir::ValueHash> local, outside;
  // A value from outside the group: its slot (a blocked one made plain on the ATen path only),
  // scanned on every call unless it is the packed weight (checked when packing).
  auto from_outside = [&](const Value& v) -> uint32_t {
    if (auto it = outside.find(v); it != outside.end()) return it->second;
    uint32_t slot;
    auto it = locs_.find(v);
    if (it != locs_.end() && it->second.kind == Loc::Blocked) {
      AtenFallback::Unblock u;
      u.buffer = it->second.index;
      u.sizes = it->second.sizes;
      u.reorder = make_reorder(it->second.md, md_t(u.sizes, dt::f32, tag::nchw));
      u.slot = slot = new_slot();
      f->scans.push_back({true, u.buffer, it->second.md.get_size() / sizeof(float)});
      f->private_slots.push_back(u.slot);
      f->unblock.push_back(std::move(u));
    } else {
      slot = plain(v);
      reads.push_back(slot);
      const bool packed_weight = g.weight_attr && (v == g.weight || attr_of(v) == g.weight_attr);
      if (!packed_weight) f->scans.push_back({false, slot, 0});
    }
    outside.emplace(v, slot);
    return slot;
  };
  for (Node* n : nodes) {
    std::vector<uint32_t> outs;
    for (size_t i = 0; i < n->num_outputs(); ++i) {
      outs.push_back(new_slot());
      local.emplace(n->output(i), outs.back());
      f->private_slots.push_back(outs.back());
    }
    f->steps.emplace_back(
        *n, [&](const Value& v) { return local.count(v) ? local.at(v) : from_outside(v); }, std::move(outs));
  }
  f->result_slot = local.at(out);
  return f;
}

bool Compiler::keep_blocked(const Value& v) const {
  const auto& uses = v.node->uses(v.index);
  if (uses.empty()) return false;
  for (const auto& u : uses) {
    auto it = group_of_.find(u.user);
    if (it == group_of_.end()) return false;
    if (it->second->kind != GroupKind::Conv && it->second->kind != GroupKind::Pool) return false;
  }
  return true;
}

bool Compiler::emit_conv(Group& g) {
  const TensorMeta& xm = meta(g.src);
  const at::Tensor& w = *g.weight_attr;
  const int64_t N = xm.sizes[0], IC = xm.sizes[1], IH = xm.sizes[2], IW = xm.sizes[3];
  const int64_t OC = g.transposed ? w.size(1) : w.size(0), KH = w.size(2), KW = w.size(3);
  const std::vector<int64_t>& os = meta(g.base).sizes;
  const int64_t OH = os[2], OW = os[3];
  dims pad_l = {g.padding[0], g.padding[1]};
  // A deconvolution's padding is that of the convolution it transposes (output and input swapped).
  dims pad_r = g.transposed ? conv_pad_r(g, os, w.sizes().vec(), xm.sizes) : conv_pad_r(g, xm.sizes, w.sizes().vec(), os);
  dims strides = {g.stride[0], g.stride[1]};
  dims dil = {g.dilation[0] - 1, g.dilation[1] - 1};
  md_t wei_any = g.groups == 1 ? md_t({OC, IC, KH, KW}, dt::f32, tag::any)
                               : md_t({g.groups, OC / g.groups, IC / g.groups, KH, KW}, dt::f32, tag::any);
  md_t bias_md({OC}, dt::f32, tag::a);
  md_t dst_any({N, OC, OH, OW}, dt::f32, tag::any);
  md_t plain_src({N, IC, IH, IW}, dt::f32, tag::nchw);

  // Does a Winograd convolution read this one's result (through the fused chain)?
  bool feeds_winograd = false;
  {
    const Value last = g.chain.empty() ? g.base : g.chain.back().first->output(0);
    for (const auto& u : last.node->uses(last.index)) {
      auto it = group_of_.find(u.user);
      if (it != group_of_.end() && it->second->kind == GroupKind::Conv && it->second->anchor == u.user &&
          winograd_candidate(*it->second, meta(it->second->base).sizes))
        feeds_winograd = true;
    }
  }

  // The source: blocked from an earlier conv (use its layout if the primitive takes it) or plain.
  auto sit = locs_.find(g.src);
  bool src_blocked = sit != locs_.end() && sit->second.kind == Loc::Blocked;
  md_t src_have = src_blocked ? sit->second.md : plain_src;

  for (size_t kept = g.kept + 1; kept-- > 0;) {
    dnnl::primitive_attr attr = user_scratchpad_attr();
    attr.set_post_ops(make_post_ops(g, kept, {}, true));
    std::optional<dnnl::primitive_desc> pd;
    dnnl::primitive prim;
    std::vector<md_t> src_tries, dst_tries;
    if (src_blocked) src_tries.push_back(src_have);
    // Deconvolutions: oneDNN's fast (brgemm) kernels take channels-last activations (what ATen
    // 2.x's own oneDNN path uses); with `any` it picks a blocked layout and a much slower kernel.
    if (g.transposed) src_tries.push_back(md_t({N, IC, IH, IW}, dt::f32, tag::nhwc));
    src_tries.push_back(md_t({N, IC, IH, IW}, dt::f32, tag::any));
    // A destination read by a Winograd convolution is written in that one's layout.
    if (feeds_winograd && OC % 16 == 0) dst_tries.push_back(md_t({N, OC, OH, OW}, dt::f32, tag::nChw16c));
    if (g.transposed) dst_tries.push_back(md_t({N, OC, OH, OW}, dt::f32, tag::nhwc));
    dst_tries.push_back(dst_any);
    std::vector<dnnl::algorithm> algs;
    if (winograd_candidate(g, os)) algs.push_back(dnnl::algorithm::convolution_winograd);
    algs.push_back(dnnl::algorithm::convolution_direct);
    for (size_t t = 0; !pd && t < algs.size() * src_tries.size() * dst_tries.size(); ++t) {
      const dnnl::algorithm alg = algs[t / (src_tries.size() * dst_tries.size())];
      const md_t& src_try = src_tries[t / dst_tries.size() % src_tries.size()];
      const md_t& dst_try = dst_tries[t % dst_tries.size()];
      try {
        if (g.transposed) {
          if (alg != dnnl::algorithm::convolution_direct) continue;
          auto p = compat::deconv_forward_pd(cpu_engine(), dnnl::prop_kind::forward_inference, src_try, wei_any,
                                             bias_md, dst_try, strides, dil, pad_l, pad_r, attr);
          if (is_ref_impl(p.impl_info_str())) continue;
          prim = dnnl::deconvolution_forward(p);
          pd.emplace(p);
        } else {
          auto p = compat::conv_forward_pd(cpu_engine(), dnnl::prop_kind::forward_inference, alg, src_try, wei_any,
                                           bias_md, dst_try, strides, dil, pad_l, pad_r, attr);
          if (is_ref_impl(p.impl_info_str())) continue;
          prim = dnnl::convolution_forward(p);
          pd.emplace(p);
        }
        g.winograd = alg == dnnl::algorithm::convolution_winograd;
      } catch (const dnnl::error&) {
      }
    }
    if (!pd) continue;
    g.kept = kept;
    auto s = std::make_unique<ConvStep>();
    std::vector<uint32_t> reads;
    s->prim = prim;
    // Source.
    if (src_blocked) {
      s->src.blocked = true;
      s->src.index = sit->second.index;
    } else {
      s->src.plain = plain_in(g.src);
      reads.push_back(s->src.plain.slot);
    }
    if (!(pd->src_desc() == src_have)) {
      s->src.reorder = make_reorder(src_have, pd->src_desc());
      s->src.reorder_buffer = add_buffer(pd->src_desc().get_size());
    }
    // Weights (BN folded) and bias, packed.
    std::vector<const at::Tensor*> sources{g.weight_attr};
    for (const at::Tensor* t : {g.conv_bias_attr, g.bn_w, g.bn_b, g.bn_rm, g.bn_rv})
      if (t) sources.push_back(t);
    {
      const at::Tensor *wt = g.weight_attr, *bt = g.conv_bias_attr, *bw = g.bn_w, *bb = g.bn_b, *rm = g.bn_rm,
                       *rv = g.bn_rv;
      const bool bn = g.has_bn;
      const double eps = g.bn_eps;
      const int64_t G = g.groups;
      const bool transposed = g.transposed;
      md_t packed_md = pd->weights_desc();
      s->packed = std::make_shared<PackedHolder>(sources, [=]() {
        auto p = std::make_shared<Packed>();
        record_sources(*p, sources);
        at::NoGradGuard no_grad;
        // (OC, IC, KH, KW): a transposed convolution's weight is (IC, OC, KH, KW); oneDNN's
        // deconvolution takes it with the channels swapped, not flipped.
        at::Tensor W = transposed ? wt->detach().transpose(0, 1) : wt->detach();
        at::Tensor B = bt ? bt->detach().clone() : at::zeros({W.size(0)}, W.options());
        if (bn) {
          at::Tensor inv = (rv->detach() + eps).rsqrt();
          at::Tensor scale = bw ? bw->detach() * inv : inv;
          at::Tensor shift = bb ? bb->detach() - rm->detach() * scale : -rm->detach() * scale;
          W = W * scale.reshape({-1, 1, 1, 1});
          B = B * scale + shift;
        }
        W = W.contiguous();
        p->bias = B.contiguous();
        p->nonfinite = any_nonfinite(W) || any_nonfinite(p->bias);
        dims wd = G == 1 ? dims{W.size(0), W.size(1), W.size(2), W.size(3)}
                         : dims{G, W.size(0) / G, W.size(1), W.size(2), W.size(3)};
        md_t user(wd, dt::f32, G == 1 ? tag::oihw : tag::goihw);
        p->weight = at::empty({static_cast<int64_t>(packed_md.get_size()) + 64}, at::kByte);
        reorder_now(user, W.data_ptr(), packed_md, p->weight.data_ptr());
        return std::shared_ptr<const Packed>(std::move(p));
      });
    }
    s->m_src = add_mem(pd->src_desc());
    s->m_wei = add_mem(pd->weights_desc());
    s->m_bias = add_mem(bias_md);
    s->m_dst = add_mem(pd->dst_desc());
    add_scratchpad(pd->scratchpad_desc(), s->has_scratch, s->m_scratch);
    Value out = kept_output(g, kept);
    g.out = out;
    s->fallback = make_fallback(g, kept, out, reads);
    const std::vector<int64_t>& out_sizes = meta(out).sizes;
    md_t plain_dst({N, OC, OH, OW}, dt::f32, tag::nchw);
    // Residual (sum): copied into the destination in its layout first.
    for (size_t i = 0; i < kept; ++i)
      if (g.post[i].is_add) {
        s->has_sum = true;
        const Value& r = g.post[i].other;
        auto rit = locs_.find(r);
        md_t have = plain_dst;
        if (rit != locs_.end() && rit->second.kind == Loc::Blocked) {
          s->sum_src.blocked = true;
          s->sum_src.index = rit->second.index;
          have = rit->second.md;
        } else {
          s->sum_src.plain = plain_in(r);
          reads.push_back(s->sum_src.plain.slot);
        }
        s->sum_reorder = make_reorder(have, pd->dst_desc());
      }
    // Destination.
    s->out.sizes = out_sizes;
    if (keep_blocked(out)) {
      s->out.blocked = true;
      ++blocked_values_;
      s->out.buffer = add_buffer(pd->dst_desc().get_size());
      if (s->fallback) s->fallback_to_blocked = make_reorder(plain_dst, pd->dst_desc());
      Loc l;
      l.kind = Loc::Blocked;
      l.index = s->out.buffer;
      l.md = pd->dst_desc();
      l.sizes = out_sizes;
      locs_[out] = l;
    } else {
      plain_output(s->out, pd->dst_desc(), plain_dst, out);
    }
    push(std::move(s), std::move(reads));
    return true;
  }
  return false;
}

bool Compiler::emit_train_conv(Group& g) {
  Node* n = g.anchor;
  const bool backward = g.kind == GroupKind::TrainConvBackward;
  const TensorMeta &xm = meta(g.src), &wm = meta(g.weight);
  const Value y = backward ? *value_arg(n, 0) : n->output(0);
  const std::vector<int64_t>& ys = meta(y).sizes;
  const int64_t N = xm.sizes[0], IC = xm.sizes[1], IH = xm.sizes[2], IW = xm.sizes[3];
  const int64_t OC = wm.sizes[0], KH = wm.sizes[2], KW = wm.sizes[3], OH = ys[2], OW = ys[3];
  const dims pad_l = {g.padding[0], g.padding[1]};
  const dims pad_r = conv_pad_r(g, xm.sizes, wm.sizes, ys);
  const dims strides = {1, 1};
  const md_t src_plain({N, IC, IH, IW}, dt::f32, tag::nchw), wei_plain({OC, IC, KH, KW}, dt::f32, tag::oihw),
      dst_plain({N, OC, OH, OW}, dt::f32, tag::nchw), bias_plain({OC}, dt::f32, tag::a);
  const md_t src_any({N, IC, IH, IW}, dt::f32, tag::any), wei_any({OC, IC, KH, KW}, dt::f32, tag::any),
      dst_any({N, OC, OH, OW}, dt::f32, tag::any);
  const auto alg = dnnl::algorithm::convolution_winograd;
  const bool has_bias = !backward && g.bias.has_value();
  const dnnl::primitive_attr attr = user_scratchpad_attr();
  dnnl::convolution_forward::primitive_desc fpd = compat::conv_forward_pd(
      cpu_engine(), dnnl::prop_kind::forward_training, alg, src_any, wei_any, has_bias || backward ? bias_plain : md_t(),
      dst_any, strides, {0, 0}, pad_l, pad_r, attr);
  if (is_ref_impl(fpd.impl_info_str())) return false;

  std::vector<uint32_t> reads;
  auto add_in = [&](PlainPrimitiveStep& st, int arg, const Value& v, const md_t& plain_md, const md_t& prim_md) {
    PlainPrimitiveStep::In in;
    in.arg = arg;
    in.src = plain_in(v);
    reads.push_back(in.src.slot);
    in.mem = add_mem(prim_md);
    if (!(plain_md == prim_md)) {
      in.reorder = make_reorder(plain_md, prim_md);
      in.buffer = add_buffer(prim_md.get_size());
    }
    st.ins.push_back(std::move(in));
  };
  auto add_out = [&](PlainPrimitiveStep& st, int arg, const Value& v, const md_t& plain_md, const md_t& prim_md) {
    PlainPrimitiveStep::Out out;
    out.arg = arg;
    out.slot = new_slot();
    out.sizes = meta(v).sizes;
    locs_[v] = slot_loc(out.slot);
    out.mem = add_mem(prim_md);
    if (!(plain_md == prim_md)) {
      out.reorder = make_reorder(prim_md, plain_md);
      out.buffer = add_buffer(prim_md.get_size());
    }
    st.outs.push_back(std::move(out));
  };
  auto finish = [&](std::unique_ptr<PlainPrimitiveStep> st, const md_t& scratch) {
    add_scratchpad(scratch, st->has_scratch, st->m_scratch);
    push(std::move(st), std::move(reads));
    reads.clear();
  };

  if (!backward) {
    auto st = std::make_unique<PlainPrimitiveStep>();
    st->prim = dnnl::convolution_forward(fpd);
    add_in(*st, DNNL_ARG_SRC, g.src, src_plain, fpd.src_desc());
    add_in(*st, DNNL_ARG_WEIGHTS, g.weight, wei_plain, fpd.weights_desc());
    if (has_bias) add_in(*st, DNNL_ARG_BIAS, *g.bias, bias_plain, fpd.bias_desc());
    add_out(*st, DNNL_ARG_DST, n->output(0), dst_plain, fpd.dst_desc());
    finish(std::move(st), fpd.scratchpad_desc());
  } else {
    auto mask = arg(n, 10).constant().toBoolList();
    // Build every primitive before emitting a step: a refusal leaves nothing half emitted.
    std::optional<dnnl::convolution_backward_data::primitive_desc> dpd;
    std::optional<dnnl::convolution_backward_weights::primitive_desc> wpd;
    if (mask.get(0)) {
      dpd.emplace(compat::conv_backward_data_pd(cpu_engine(), alg, src_any, wei_any, dst_any, strides, pad_l, pad_r,
                                                attr, fpd));
      if (is_ref_impl(dpd->impl_info_str())) return false;
    }
    if (mask.get(1)) {
      wpd.emplace(compat::conv_backward_weights_pd(cpu_engine(), alg, src_any, wei_any,
                                                   mask.get(2) ? bias_plain : md_t(), dst_any, strides, pad_l, pad_r,
                                                   attr, fpd));
      if (is_ref_impl(wpd->impl_info_str())) return false;
    }
    if (!dpd && !wpd) return false;
    const Value gy = *value_arg(n, 0);
    for (size_t i = 0; i < 3; ++i)
      if (!mask.get(i)) locs_[n->output(i)] = slot_loc(new_slot());  // stays undefined
    if (dpd) {
      auto st = std::make_unique<PlainPrimitiveStep>();
      st->prim = dnnl::convolution_backward_data(*dpd);
      add_in(*st, DNNL_ARG_DIFF_DST, gy, dst_plain, dpd->diff_dst_desc());
      add_in(*st, DNNL_ARG_WEIGHTS, g.weight, wei_plain, dpd->weights_desc());
      add_out(*st, DNNL_ARG_DIFF_SRC, n->output(0), src_plain, dpd->diff_src_desc());
      finish(std::move(st), dpd->scratchpad_desc());
    }
    if (wpd) {
      auto st = std::make_unique<PlainPrimitiveStep>();
      st->prim = dnnl::convolution_backward_weights(*wpd);
      add_in(*st, DNNL_ARG_DIFF_DST, gy, dst_plain, wpd->diff_dst_desc());
      add_in(*st, DNNL_ARG_SRC, g.src, src_plain, wpd->src_desc());
      add_out(*st, DNNL_ARG_DIFF_WEIGHTS, n->output(1), wei_plain, wpd->diff_weights_desc());
      if (mask.get(2)) add_out(*st, DNNL_ARG_DIFF_BIAS, n->output(2), bias_plain, wpd->diff_bias_desc());
      finish(std::move(st), wpd->scratchpad_desc());
    }
  }
  g.out = n->output(0);
  g.winograd = true;
  return true;
}

bool Compiler::emit_pool(Group& g) {
  const TensorMeta& xm = meta(g.src);
  const int64_t N = xm.sizes[0], C = xm.sizes[1], H = xm.sizes[2], W = xm.sizes[3];
  // The output's 4-D sizes (global average pooling may have flattened them).
  const bool global = is_call(g.anchor, {"aten::adaptive_avg_pool2d", "aten::mean.dim"});
  const std::vector<int64_t> os4 = global ? std::vector<int64_t>{N, C, 1, 1} : meta(g.base).sizes;
  auto sit = locs_.find(g.src);
  bool src_blocked = sit != locs_.end() && sit->second.kind == Loc::Blocked;
  md_t plain_src({N, C, H, W}, dt::f32, tag::nchw);
  md_t src_md = src_blocked ? sit->second.md : plain_src;
  md_t dst_any(os4, dt::f32, tag::any);
  md_t plain_dst(os4, dt::f32, tag::nchw);
  // The right padding: ATen's symmetric padding, or more where ceil_mode adds a last window (then
  // the one that makes oneDNN's output size ATen's).
  dims pad_r(2);
  for (size_t d = 0; d < 2; ++d)
    pad_r[d] = std::max(g.padding[d], (os4[d + 2] - 1) * g.stride[d] + g.kernel[d] - xm.sizes[d + 2] - g.padding[d]);
  std::optional<dnnl::pooling_forward::primitive_desc> pd;
  try {
    pd.emplace(compat::pooling_forward_pd(
        cpu_engine(), dnnl::prop_kind::forward_inference,
        g.pool_max            ? dnnl::algorithm::pooling_max
        : g.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                              : dnnl::algorithm::pooling_avg_exclude_padding,
        src_md, dst_any,
        {g.stride[0], g.stride[1]}, {g.kernel[0], g.kernel[1]}, {0, 0}, {g.padding[0], g.padding[1]}, pad_r,
        user_scratchpad_attr()));
  } catch (const dnnl::error&) {
    return false;
  }
  if (is_ref_impl(pd->impl_info_str())) return false;
  auto s = std::make_unique<PoolStep>();
  std::vector<uint32_t> reads;
  s->prim = dnnl::pooling_forward(*pd);
  if (src_blocked) {
    s->src.blocked = true;
    s->src.index = sit->second.index;
  } else {
    s->src.plain = plain_in(g.src);
    reads.push_back(s->src.plain.slot);
  }
  s->m_src = add_mem(src_md);
  s->m_dst = add_mem(pd->dst_desc());
  add_scratchpad(pd->scratchpad_desc(), s->has_scratch, s->m_scratch);
  s->out.sizes = meta(g.out).sizes;
  if (g.pool_max) {
    // A NaN in the input: ATen's kernel computes the (plain) result instead.
    NanFallback f;
    f.kernel = g.kernel;
    f.stride = g.stride;
    f.padding = g.padding;
    f.ceil_mode = g.ceil_mode;
    f.src_sizes = xm.sizes;
    f.src_floats = src_md.get_size() / sizeof(float);
    if (src_blocked) f.to_plain = make_reorder(src_md, plain_src);
    s->nan = std::move(f);
  }
  plain_output(s->out, pd->dst_desc(), plain_dst, g.out);
  push(std::move(s), std::move(reads));
  return true;
}

bool Compiler::emit_rnn(Group& g) {
  Node* n = g.anchor;
  std::vector<uint32_t> outs;
  for (size_t i = 0; i < n->num_outputs(); ++i) outs.push_back(new_slot());
  PlainIn x = plain_in(g.src), h0 = plain_in(*g.h0);
  std::optional<PlainIn> c0;
  if (g.c0) c0 = plain_in(*g.c0);
  std::vector<uint32_t> reads{x.slot, h0.slot};
  if (c0) reads.push_back(c0->slot);
  auto step = make_rnn_step(g.rnn, std::move(x), std::move(h0), std::move(c0), outs);
  for (size_t i = 0; i < n->num_outputs(); ++i) locs_[n->output(i)] = slot_loc(outs[i]);
  push(std::move(step), std::move(reads));
  return true;
}

bool Compiler::emit_group(Group& g) {
  try {
    switch (g.kind) {
      case GroupKind::Linear: return emit_linear(g, false);
      case GroupKind::Batched: return emit_linear(g, true);
      case GroupKind::Conv: return emit_conv(g);
      case GroupKind::Pool: return emit_pool(g);
      case GroupKind::TrainConv:
      case GroupKind::TrainConvBackward: return emit_train_conv(g);
      case GroupKind::Rnn: return emit_rnn(g);
    }
  } catch (const dnnl::error&) {
  }
  return false;
}

std::shared_ptr<Program> Compiler::build() {
  prog_ = std::make_shared<Program>();
  prog_->buffer_sizes.push_back(0);  // scratchpad
  for (Node* n : order_) {
    switch (n->kind()) {
      case NodeKind::Placeholder: {
        uint32_t s = new_slot();
        prog_->input_slots.push_back(s);
        locs_[n->output(0)] = slot_loc(s);
        break;
      }
      case NodeKind::Output: {
        for (const auto& e : n->args().at(0).list()) {
          TORCH_CHECK(e.has_value(), "onednn backend: the output node returns None");
          prog_->output_slots.push_back(plain(*e));
        }
        break;
      }
      default: {
        if (deferred_.count(n)) break;
        auto ge = group_end_.find(n);
        if (ge != group_end_.end()) {
          Group& g = *ge->second;
          size_t steps_before = prog_->steps.size();
          if (emit_group(g)) {
            fused_.push_back(make_label(g, g.kept));
            winograd_convs_ += g.winograd;
            // Chain nodes beyond what oneDNN accepted run with ATen, in order.
            size_t first_left = 0;
            for (size_t i = 0; i < g.chain.size(); ++i)
              if (g.chain[i].first->output(0) == g.out) first_left = i + 1;
            for (size_t i = first_left; i < g.chain.size(); ++i) emit_aten(g.chain[i].first);
          } else {
            TORCH_INTERNAL_ASSERT(prog_->steps.size() >= steps_before);
            for (Node* m : g.head) emit_aten(m);
            for (auto& c : g.chain) emit_aten(c.first);
          }
          break;
        }
        if (claimed(n)) break;  // emitted with its group
        emit_node(n);
      }
    }
  }
  // Free each slot after its last reader (outputs are never freed).
  std::vector<int64_t> last(prog_->num_slots, -1);
  for (size_t i = 0; i < reads_.size(); ++i)
    for (uint32_t s : reads_[i]) last[s] = static_cast<int64_t>(i);
  for (uint32_t s : prog_->output_slots) last[s] = -2;
  for (uint32_t s = 0; s < prog_->num_slots; ++s)
    if (last[s] >= 0) prog_->steps[last[s]]->free_after.push_back(s);
  return prog_;
}

}  // namespace

Compiled compile(GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
  Compiled result;
  auto decline_graph = [&](std::string reason) {
    result.fn = nullptr;
    result.declined = true;
    result.reason = std::move(reason);
    result.fused.clear();
    return result;
  };
  if (needs_autograd(gm, example_inputs)) return decline_graph(kNeedsAutogradReason);
  for (const auto& n : gm.graph().nodes())
    if (n->kind() == NodeKind::CallModule) return decline_graph("the graph has call_module nodes");
  try {
    Compiler c(gm);
    c.match();
    if (c.num_groups() == 0) return decline_graph("nothing to fuse");
    std::shared_ptr<Program> prog = c.build();
    if (c.fused().empty()) return decline_graph("oneDNN accepted no fused primitive");
    result.fused = c.fused();
    result.blocked_values = c.blocked_values();
    result.winograd_convs = c.winograd_convs();
    for (const auto& step : prog->steps) result.aten_ops += dynamic_cast<const AtenStep*>(step.get()) != nullptr;
    result.fn = [prog](std::vector<at::Tensor> inputs) { return prog->run(std::move(inputs)); };
  } catch (const std::exception& e) {
    TORCH_WARN("onednn backend: cannot compile the graph (", e.what(), "); declining it");
    return decline_graph(std::string("compile error: ") + e.what());
  }
  return result;
}

std::unordered_set<const Node*> claim(const GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
  if (needs_autograd(gm, example_inputs)) {
    decline(kNeedsAutogradReason);
    return {};
  }
  for (const auto& n : gm.graph().nodes())
    if (n->kind() == NodeKind::CallModule) return {};
  Compiler c(const_cast<GraphModule&>(gm));  // matching reads the graph only
  c.match();
  return c.group_nodes();
}

bool winograd_available() {
  static const bool available = [] {
    try {
      const md_t src({1, 16, 16, 16}, dt::f32, tag::any), wei({16, 16, 3, 3}, dt::f32, tag::any);
      auto pd = compat::conv_forward_pd(cpu_engine(), dnnl::prop_kind::forward_inference,
                                        dnnl::algorithm::convolution_winograd, src, wei, md_t(), src, {1, 1}, {0, 0},
                                        {1, 1}, {1, 1}, dnnl::primitive_attr());
      return !is_ref_impl(pd.impl_info_str());
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return available;
}

}  // namespace onednn

CompiledFn onednn_backend(GraphModule& gm, const std::vector<at::Tensor>& example_inputs) {
  onednn::Compiled c = onednn::compile(gm, example_inputs);
  if (c.declined) return decline(c.reason);
  for (const auto& f : c.fused) report_partition("onednn: " + f);
  if (c.winograd_convs) report_partition("onednn: " + std::to_string(c.winograd_convs) + " conv(s) with the Winograd algorithm");
  if (c.blocked_values) report_partition("onednn: " + std::to_string(c.blocked_values) + " value(s) kept in blocked layout");
  if (c.aten_ops) report_partition("aten: " + std::to_string(c.aten_ops) + " other operator(s)");
  return std::move(c.fn);
}

void register_onednn_backend() {
  register_backend("onednn", &onednn_backend);
  register_claim("onednn", &onednn::claim);
}

}  // namespace torchcompile::backends
