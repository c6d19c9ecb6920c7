// The onednn backend's matching pass (Compiler::match): which nodes become oneDNN groups. Each
// call_function node, by its operator kind, goes to the matchers of that kind (onednn_gemm.cpp,
// onednn_conv.cpp, onednn_pool.cpp, onednn_rnn.cpp), which check the exact operator and its
// arguments and fill a Group; GEMMs and convolutions then take the chain of post-ops after them
// (extend_chain). Also here: the helpers that read node arguments and tensor layouts, and the
// groups' labels (Compiled::fused).
#include "onednn_internal.h"

#include <torchcompile/compile/partitioner.h>

#include <cfloat>

namespace torchcompile::backends::onednn::detail {

// ---- reading the graph --------------------------------------------------------------------------

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

std::optional<Value> value_arg(const Node* n, size_t i) {
  if (i >= n->args().size()) return std::nullopt;
  const ir::Argument& a = arg(n, i);
  if (!a.is_value() || !meta(a.value()).defined) return std::nullopt;
  return a.value();
}

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

size_t total_uses(const Node* n) {
  size_t u = 0;
  for (size_t i = 0; i < n->num_outputs(); ++i) u += n->uses(i).size();
  return u;
}

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

md_t md_2d(const TensorMeta& m) {
  auto p = *as_2d(m);
  return plain_md(p.first, p.second);
}

bool is_ref_impl(const char* impl) {
  std::string s = impl ? impl : "";
  return s.rfind("ref", 0) == 0 || s.find(":ref") != std::string::npos;
}

// ---- post-ops -----------------------------------------------------------------------------------

namespace {

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

}  // namespace

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
    case GroupKind::EmbeddingBag: return std::string("embedding_bag (") + (g.bag_mean ? "mean" : "sum") + ")";
  }
  if (g.bias || g.conv_bias_attr) s += "+bias";
  if (g.bn) s += "+bn";
  for (size_t i = 0; i < kept; ++i) s += "+" + (g.post[i].is_add ? std::string("add") : g.post[i].e.label);
  return s;
}

// ---- the matching pass --------------------------------------------------------------------------

Compiler::Compiler(GraphModule& gm) : gm_(gm), weight_bytes_(graph_weight_bytes(gm)) {
  size_t i = 0;
  for (const auto& n : gm.graph().nodes()) {
    order_.push_back(n.get());
    pos_[n.get()] = i++;
  }
}

std::unordered_set<const Node*> Compiler::group_nodes() const {
  std::unordered_set<const Node*> nodes = claimed_;
  for (const auto& g : groups_)
    for (const Node* h : g->helpers)
      if (h->kind() == NodeKind::CallFunction) nodes.insert(h);
  return nodes;
}

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

// A post-op that turns NaN into a number (relu, clip) makes the group scan its inputs for
// non-finite values on every call (AtenFallback), except a prepacked weight (scanned once). When
// those inputs are much larger than the result — a training graph's GEMM, whose weight is an
// input: M6's first layer scans 451 K floats for a 32 K-float result — running the activation as
// its own pass over the result costs less than the scan (measured on M6: the scans were 3.7% of
// a compiled step, which ran 5% faster without them). Then the chain stops before it, and the
// activation runs outside the group (`fused` under `default`).
bool Compiler::scan_outweighs_activation(const Group& g, const Eltwise& e, const std::vector<int64_t>& out_sizes) const {
  if (!loses_nan(e)) return false;
  int64_t scanned = g.src.valid() ? numel(meta(g.src).sizes) : 0;
  if (g.weight.valid() && !g.weight_attr) scanned += numel(meta(g.weight).sizes);
  for (const PostOp& p : g.post)
    if (p.is_add) scanned += numel(meta(p.other).sizes);
  // A read-only scan against a pass that reads and writes the result, and a part of its own
  // (a call, an allocation: about what scanning 16 K floats takes).
  constexpr int64_t kScanPerActivation = 4, kScanPerPart = 16384;
  return scanned > kScanPerActivation * numel(out_sizes) + kScanPerPart;
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
      if (scan_outweighs_activation(g, *e, out_sizes)) break;
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
      case ir::OpKind::Other: ok = match_rnn(n, *g) || match_embedding_bag(n, *g); break;
      case ir::OpKind::Gemm: ok = match_linear(n, *g) || match_batched(n, *g); break;
      case ir::OpKind::Convolution: ok = match_conv(n, *g) || match_train_conv(n, *g); break;
      case ir::OpKind::Pooling:
      case ir::OpKind::Reduction: ok = match_pool(n, *g); break;
      default: break;
    }
    if (!ok) continue;
    if (rows_vary_ && rows_obstacle_.empty()) rows_obstacle_ = rows_obstacle_of(*g);
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

}  // namespace torchcompile::backends::onednn::detail
