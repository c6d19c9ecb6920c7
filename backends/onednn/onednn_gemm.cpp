// GEMM groups of the onednn backend: matching (`linear`, `addmm`, `mm`, `matmul` with a 2-D
// weight, and a following bias `add`; `bmm`, 3-D `matmul`, `baddbmm`) and emission as one oneDNN
// matmul primitive with the chain's post-ops (MatmulStep). A weight read from a module attribute
// is prepacked into the primitive's layout; any other weight is read from its slot as traced.
#include "onednn_internal.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace torchcompile::backends::onednn::detail {

namespace {

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

constexpr int64_t kWeightRowSpacing = 16;  // floats added to a weight row: 64 bytes

// The distance between rows (in floats) of a plain row-major 2-D f32 layout, as the weights of
// `gemm:jit` (AVX2, and run-time rows everywhere) are, or 0 for any other layout.
int64_t plain_row_stride(const md_t& m) {
  const dims d = compat::dims_of(m);
  if (d.size() != 2) return 0;
  for (int64_t ld : {d[1], d[1] + kWeightRowSpacing})
    if (m == md_t(d, dt::f32, dims{ld, 1})) return ld;
  return 0;
}

// Writes the 2-D float matrix `w` (K, N), of any strides, into `dst` in the layout `packed_md`.
// Into a plain layout (`gemm:jit`'s, rows spaced or not), oneDNN's jit reorder reads `w`'s own
// layout: a Linear's weight, seen as (K, N) with strides (1, K), took 0.1 ms for a 1536 x 384
// weight (AMD EPYC, AVX-512 and AVX2 alike), where `contiguous()` followed by the reorder took
// 0.8-0.9 ms and wrote 2.3 MB more of fresh memory (each page a fault). Where oneDNN has only
// its generic reorder between the two layouts (`simple:any`: between two plain row-major layouts,
// several ms for such a weight; oneDNN 3's `brgemm_matmul_copy_reorder_t`), ATen copies
// (0.6-0.8 ms). A blocked layout (brgemm's) is reordered from a contiguous copy: oneDNN 3.7's jit
// reorder from the transposed layout into a blocked one wrote wrong values where K or N is not a
// multiple of the block (24 x 40, 96 x 100).
void pack_weight(const at::Tensor& w, const md_t& packed_md, void* dst) {
  const int64_t ld = plain_row_stride(packed_md);
  if (ld != 0 && w.scalar_type() == at::kFloat && !w.is_neg() && !w.is_conj() &&
      std::all_of(w.strides().begin(), w.strides().end(), [](int64_t s) { return s > 0; })) {
    const md_t user = plain_md(w.sizes().vec(), w.strides().vec());
    try {
      dnnl::reorder::primitive_desc rp(cpu_engine(), user, cpu_engine(), packed_md);
      if (std::string(rp.impl_info_str()).rfind("jit", 0) == 0) {
        dnnl::memory a(user, cpu_engine(), w.data_ptr()), b(packed_md, cpu_engine(), dst);
        dnnl::stream st(cpu_engine());
        dnnl::reorder(rp).execute(st, a, b);
        st.wait();
        return;
      }
    } catch (const dnnl::error&) {
    }
  }
  if (ld != 0) {
    at::from_blob(dst, w.sizes(), {ld, 1}, at::TensorOptions().dtype(at::kFloat)).copy_(w);
    return;
  }
  const at::Tensor c = w.contiguous();
  reorder_now(plain_md(c.sizes().vec(), c.strides().vec()), c.data_ptr(), packed_md, dst);
}

}  // namespace

// oneDNN's AVX2 f32 GEMM (`gemm:jit`, the kernel oneDNN 2.6 and 3.7 pick on CPUs without
// AVX-512) reads a prepacked weight in the plain (K, N) layout, and it slows down by up to 1.7x
// when that layout's rows lie a multiple of 512 bytes apart (N = 128, 256, 512, 1024, ...): the
// rows it reads together presumably map to the same cache sets (64 bytes more per row is
// enough). Measured on an AMD EPYC as on an AVX2 CPU (ONEDNN_MAX_CPU_ISA=AVX2), 2 threads: a
// Linear(1024, 1024) on 128 rows 130 GFLOP/s with N floats per row, 208 with N + 16 (OpenBLAS,
// eager's GEMM: 173); at one thread 63 against 109 (OpenBLAS 100); M1's first layer
// (64 x 784 x 512) 145 against 193; shapes whose rows are not so spaced (N = 1000, 768, 10) the
// same either way. So such a weight is stored with rows 16 floats longer. oneDNN's AVX-512
// kernels choose a blocked layout: nothing changes there.
dnnl::matmul::primitive_desc with_spaced_weight_rows(dnnl::matmul::primitive_desc pd, const md_t& src,
                                                     const md_t& bias, const md_t& dst,
                                                     const dnnl::primitive_attr& attr) {
  const md_t chosen = pd.weights_desc();
  const dims d = compat::dims_of(chosen);
  if (d.size() != 2 || !(chosen == md_t(d, dt::f32, tag::ab)) || (d[1] * 4) % 512 != 0) return pd;
  const md_t spaced(d, dt::f32, dims{d[1] + kWeightRowSpacing, 1});
  try {
    auto alt = compat::matmul_pd(cpu_engine(), src, spaced, bias, dst, attr);
    if (std::string(alt.impl_info_str()) == pd.impl_info_str()) return alt;
  } catch (const dnnl::error&) {
  }
  return pd;
}

// A static GEMM of at most kFewRows rows, in a graph whose weights together exceed
// kStreamedWeightBytes (graph_weight_bytes: the whole graph's where this is a part of it), reads
// its weight in the layout that the same weight's GEMM with run-time rows reads (oneDNN 2.6:
// `gemm:jit`'s plain layout, rows spaced as above), where oneDNN takes it, instead of the one it
// picks for these rows (brgemm's blocked layout on AVX-512 machines): both then share one pack
// (PackedHolder), and a graph with size expressions compiled after the first static sizes
// (automatic dynamic) packs nothing again.
// Such a GEMM reads its weight from memory at every call, and then the two kernels ran the same:
// in GPT's generation (6 layers of 384, 42 MB of weights) GEMMs of 6-32 rows took the same time
// with brgemm and with `gemm:jit` (AMD EPYC, AVX-512, 2 threads), and the second length's compile
// went from 30 to 20 ms without the second pack. A weight that stays in the caches between calls
// is another matter: one GEMM called again and again ran 1.1-1.9x faster with brgemm (1 to 32
// rows, weights of 64 KB to 4 MB), so smaller graphs keep brgemm.
constexpr int64_t kFewRows = 32;
constexpr int64_t kStreamedWeightBytes = int64_t(32) << 20;

dnnl::matmul::primitive_desc with_rows_program_weight(dnnl::matmul::primitive_desc pd, const md_t& src,
                                                      const md_t& bias, const md_t& dst,
                                                      const dnnl::primitive_attr& attr) {
  const md_t chosen = pd.weights_desc();
  const dims d = compat::dims_of(chosen), s = compat::dims_of(src);
  if (d.size() != 2 || s.size() != 2 || s[0] > kFewRows) return pd;
  try {
    // The layout Compiler::emit_linear gives this weight with run-time rows (post-ops do not
    // change oneDNN's choice of weight layout).
    const md_t rows_src({DNNL_RUNTIME_DIM_VAL, d[0]}, dt::f32, tag::ab);
    const md_t rows_dst({DNNL_RUNTIME_DIM_VAL, d[1]}, dt::f32, tag::ab);
    const dnnl::primitive_attr plain_attr = user_scratchpad_attr();
    auto rows = compat::matmul_pd(cpu_engine(), rows_src, md_t(d, dt::f32, tag::any), bias, rows_dst, plain_attr);
    rows = with_spaced_weight_rows(rows, rows_src, bias, rows_dst, plain_attr);
    const md_t layout = rows.weights_desc();
    if (layout == chosen) return pd;
    auto alt = compat::matmul_pd(cpu_engine(), src, layout, bias, dst, attr);
    // The kernel of the run-time rows (oneDNN 2.6 gives a plain layout of N = 100 to brgemm for
    // fixed rows, which would copy it at every call).
    if (std::string(alt.impl_info_str()) == rows.impl_info_str() && alt.weights_desc() == layout) return alt;
  } catch (const dnnl::error&) {
  }
  return pd;
}

// oneDNN runs a matmul in an OpenMP region of every thread, whatever its size: `gemm:jit` (AVX2)
// adds the bias and applies the post-ops in a region of the count its primitive descriptor was
// created with and runs the GEMM with the count at the call; brgemm (AVX-512) reads the count at
// the call. A small GEMM then pays a region's start and end, more than its arithmetic. Measured,
// 2 threads against one: as on AVX2, with a bias, 8 x 16 x 32 (and tanh) 5.1 against 1.4 us,
// 32 x 64 x 64 11.0 against 3.0, 32 x 128 x 128 15.7 against 10.6; with AVX-512 brgemm, a bias and
// tanh, 32 x 64 x 64 5.7 against 2.0, 32 x 128 x 128 8.4 against 6.4, M1's last layer
// (64 x 512 x 10) 8.1 against 6.1. At 2^20 multiply-adds (64 x 128 x 128) two threads are as fast
// or 10% faster, beyond that they win; OpenBLAS, eager's GEMM, runs up to 2^18 on one thread. So a
// GEMM of at most 2^19 multiply-adds is created and run at one thread.
bool runs_on_one_thread(int64_t macs) { return macs > 0 && macs <= (int64_t(1) << 19) && at::get_num_threads() > 1; }

std::string matmul_impl_label(const dnnl::matmul::primitive_desc& pd) {
  std::string label = pd.impl_info_str();
  const md_t w = pd.weights_desc();
  const int64_t ld = plain_row_stride(w);
  if (ld != 0 && ld != compat::dims_of(w)[1]) label += ", weight rows " + std::to_string(ld) + " apart";
  return label;
}

// ---- matching -----------------------------------------------------------------------------------

bool Compiler::set_weight_2d(Group& g, const Value& w) {
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
    if (!set_weight_2d(g, *w)) return false;
  } else if (t == "aten::mm" || t == "aten::matmul") {
    auto x = value_arg(n, 0), w = value_arg(n, 1);
    if (!x || !w || !is_f32(meta(*x)) || meta(*w).sizes.size() != 2) return false;
    if (t == "aten::mm" && meta(*x).sizes.size() != 2) return false;
    if (meta(*x).sizes.size() < 2) return false;
    g.src = *x;
    if (!set_weight_2d(g, *w)) return false;
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

// Run-time rows (Compiler::vary_rows): a 2-D GEMM whose reduced dimension, weight and bias have
// fixed sizes, its weight prepacked; its source's other dimensions may be symbols. An
// EmbeddingBag's loop takes any sizes.
std::string Compiler::rows_obstacle_of(const Group& g) const {
  const std::string what = "'" + g.anchor->name() + "' (" + g.anchor->target() + ")";
  if (g.kind == GroupKind::EmbeddingBag) return "";  // its loop reads the sizes at each call
  if (g.kind != GroupKind::Linear) return what + ": oneDNN builds this primitive for fixed sizes";
  if (!g.weight_attr) return what + ": its weight is not a module attribute";
  auto fixed = [&](const Value& v, size_t from_dim) {
    const TensorMeta& m = meta(v);
    for (size_t d = from_dim; d < m.sym_sizes.size(); ++d)
      if (!m.sym_sizes[d].is_constant()) return false;
    return true;
  };
  const size_t last = meta(g.src).sizes.size() - 1;
  if (!fixed(g.src, last)) return what + ": the reduced dimension is " + meta(g.src).sym_sizes[last].str();
  if (g.bias && !fixed(*g.bias, 0)) return what + ": the bias has symbolic sizes";
  return "";
}

// ---- emission -----------------------------------------------------------------------------------

bool Compiler::emit_linear(Group& g, bool batched) {
  const TensorMeta& xm = meta(g.src);
  const TensorMeta& om = meta(g.out);
  md_t src_md, wei_md, dst_md, bias_md;
  std::vector<int64_t> out_sizes = om.sizes;
  int64_t macs = 0;  // static rows: the multiply-adds of a call
  if (batched) {
    src_md = plain_md(xm.sizes, xm.strides);
    wei_md = plain_md(g.w_sizes, g.w_strides);
    dst_md = plain_md(out_sizes, contiguous_strides(out_sizes));
  } else {
    const int64_t K = g.w_sizes[0], N = g.w_sizes[1];
    src_md = rows_vary_ ? md_t({DNNL_RUNTIME_DIM_VAL, K}, dt::f32, tag::ab) : md_2d(xm);
    const int64_t M = compat::dims_of(src_md)[0];
    wei_md = g.weight_attr ? md_t({K, N}, dt::f32, tag::any) : plain_md(g.w_sizes, g.w_strides);
    dst_md = md_t({M, N}, dt::f32, tag::ab);
    if (g.bias) bias_md = md_t({1, N}, dt::f32, tag::ab);
    if (!rows_vary_) macs = M * K * N;
  }
  // A small GEMM's primitive is created (and later run) at one thread.
  const bool one_thread = runs_on_one_thread(macs);
  OneThreadScope one(one_thread);
  // Trim post-ops until oneDNN accepts the chain (never below the anchor itself).
  for (size_t kept = g.kept + 1; kept-- > 0;) {
    // A binary post-op's operand has fixed sizes: with run-time rows the chain stops before it.
    if (rows_vary_ && std::any_of(g.post.begin(), g.post.begin() + kept, [](const PostOp& p) { return p.is_add; }))
      continue;
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
    if (g.weight_attr && !batched) {
      pd = with_spaced_weight_rows(*pd, src_md, g.bias ? bias_md : md_t(), dst_md, attr);
      if (!rows_vary_ && weight_bytes_ > kStreamedWeightBytes)
        pd = with_rows_program_weight(*pd, src_md, g.bias ? bias_md : md_t(), dst_md, attr);
    }
    g.kept = kept;
    auto s = std::make_unique<MatmulStep>();
    std::vector<uint32_t> reads;
    s->one_thread = one_thread;
    s->prim = dnnl::matmul(*pd);
    impls_.push_back(matmul_impl_label(*pd) + (one_thread ? ", one thread" : ""));
    s->src = plain_in(g.src);
    reads.push_back(s->src.slot);
    if (rows_vary_ && !batched) {
      s->rows_k = g.w_sizes[0];
      s->rows_n = g.w_sizes[1];
    } else {
      s->m_src = add_mem(src_md);
    }
    s->m_wei = add_mem(pd->weights_desc());
    if (g.weight_attr) {
      const at::Tensor* attr_t = g.weight_attr;
      bool transposed = g.weight_transposed;
      md_t packed_md = pd->weights_desc();
      const ScanKernels* scan = scan_;
      s->packed = std::make_shared<PackedHolder>(std::vector<const at::Tensor*>{attr_t}, [=]() {
        auto p = std::make_shared<Packed>();
        record_sources(*p, {attr_t});
        at::NoGradGuard no_grad;
        at::Tensor w = transposed ? attr_t->t() : *attr_t;
        p->nonfinite = any_above(*scan, w, kNonFiniteAbove);
        p->weight = at::empty({static_cast<int64_t>(packed_md.get_size()) + 64}, at::kByte);
        pack_weight(w, packed_md, p->weight.data_ptr());
        return std::shared_ptr<const Packed>(std::move(p));
      }, PackKey{transposed ? "linear^T" : "linear", {packed_md}});
    } else {
      s->wei = plain_in(g.weight);
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
    if (!s->rows_k) s->m_dst = add_mem(dst_md);
    add_scratchpad(pd->scratchpad_desc(), s->has_scratch, s->m_scratch);
    // The result of the kept part of the chain.
    Value out = kept_output(g, kept);
    g.out = out;
    if (fuses_nan_losing_activation(g, kept)) s->fallback = make_fallback(g, kept, out, kNonFiniteAbove, reads);
    s->out_sizes = meta(out).sizes;
    s->out = new_slot();
    locs_[out] = slot_loc(s->out);
    push(std::move(s), std::move(reads));
    return true;
  }
  return false;
}

}  // namespace torchcompile::backends::onednn::detail
