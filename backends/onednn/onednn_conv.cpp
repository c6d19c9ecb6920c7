// Convolution groups of the onednn backend, matching and emission:
//  - inference convolutions (`conv2d`, `convolution`) and transposed ones (oneDNN deconvolution)
//    with a module attribute weight, an eval BatchNorm after them folded into the prepacked
//    weights and bias, and the chain's post-ops (ConvStep). Outputs read only by other oneDNN
//    convolutions / poolings stay in oneDNN's blocked layout (Compiler::keep_blocked).
//  - training convolutions and `convolution_backward` with weights as graph inputs, run with
//    oneDNN's Winograd algorithm where it applies (PlainPrimitiveStep).
#include "onednn_internal.h"

#include <cstdio>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstdlib>

namespace torchcompile::backends::onednn::detail {

namespace {

// How transposed convolutions run (TORCHCOMPILE_ONEDNN_DECONV; read at each compile):
//  - `gemm` (the default with oneDNN 2): a GEMM and a gather (TConvStep). With oneDNN 2.6 the
//    deconvolution primitive's direct kernels ran a DCGAN generator 2x slower than ATen 1.13's
//    slow_conv_transpose2d (which makes one small GEMM per image, then col2im), while one GEMM
//    over the whole batch runs at oneDNN matmul's rate (brgemm on AVX-512, ~210 GFLOP/s here):
//    the generator 2.3-4.7x over ATen 1.13 across runs (3.0x limited to AVX2).
//  - `1` (the default with oneDNN 3): oneDNN's deconvolution over channels-last activations
//    (brgemm kernels; a DCGAN generator 1.21x over LibTorch 2.6's eager, which runs oneDNN
//    deconvolutions itself, but without BatchNorm folded; the gemm way 1.11x there).
//  - `0`: ATen's.
enum class TransposedPath { Aten, Deconv, Gemm };
TransposedPath transposed_path() {
  const char* e = std::getenv("TORCHCOMPILE_ONEDNN_DECONV");
  const std::string v = e ? e : "";
  if (v == "0") return TransposedPath::Aten;
  if (v == "1") return TransposedPath::Deconv;
  if (v == "gemm") return TransposedPath::Gemm;
  TORCH_CHECK(v.empty(), "TORCHCOMPILE_ONEDNN_DECONV: expected 0, 1 or gemm, got '", v, "'");
  return DNNL_VERSION_MAJOR >= 3 ? TransposedPath::Deconv : TransposedPath::Gemm;
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
dims conv_pad_r(const Group& g, const std::vector<int64_t>& in, const std::vector<int64_t>& k,
                const std::vector<int64_t>& out) {
  dims r(2);
  for (size_t d = 0; d < 2; ++d)
    r[d] = (out[d + 2] - 1) * g.stride[d] + (k[d + 2] - 1) * g.dilation[d] + 1 - in[d + 2] - g.padding[d];
  return r;
}

// Whether a Winograd convolution reads the group's result (through its fused chain).
bool feeds_winograd(const Group& g, const std::unordered_map<const Node*, Group*>& group_of) {
  const Value last = g.chain.empty() ? g.base : g.chain.back().first->output(0);
  for (const auto& u : last.node->uses(last.index)) {
    auto it = group_of.find(u.user);
    if (it != group_of.end() && it->second->kind == GroupKind::Conv && it->second->anchor == u.user &&
        winograd_candidate(*it->second, meta(it->second->base).sizes))
      return true;
  }
  return false;
}

// The prepacked weights (BatchNorm folded in) and bias of a convolution group, in `packed_md`;
// re-packed when one of the module's tensors changes. With `gemm` (a transposed convolution's
// TConvStep) the weights are the (IC, KH * KW * OC) matrix of the step's GEMM, else oneDNN's
// convolution or deconvolution weights.
std::shared_ptr<PackedHolder> pack_conv(const Group& g, const md_t& packed_md, const ScanKernels* scan,
                                        bool gemm = false) {
  const FoldedBatchNorm fbn = g.bn.value_or(FoldedBatchNorm{});
  std::vector<const at::Tensor*> sources{g.weight_attr};
  for (const at::Tensor* t : {g.conv_bias_attr, fbn.weight, fbn.bias, fbn.running_mean, fbn.running_var})
    if (t) sources.push_back(t);
  // The running statistics (the last two sources with a BatchNorm) change without a version bump
  // when the module runs in training mode (record_sources).
  std::vector<bool> unversioned(sources.size(), false);
  if (g.bn) unversioned[sources.size() - 1] = unversioned[sources.size() - 2] = true;
  const at::Tensor *wt = g.weight_attr, *bt = g.conv_bias_attr;
  const std::optional<FoldedBatchNorm> bn = g.bn;
  const int64_t G = g.groups;
  const bool transposed = g.transposed;
  // Which sources are which, and the folding's constant.
  std::string what = "conv G=" + std::to_string(G) + (transposed ? " transposed" : "") + (gemm ? " gemm" : "") +
                     (bt ? " bias" : "");
  if (bn) {
    char eps[32];
    std::snprintf(eps, sizeof eps, "%.17g", bn->eps);
    what += std::string(" bn(") + eps + (bn->weight ? " weight" : "") + (bn->bias ? " bias" : "") + ")";
  }
  return std::make_shared<PackedHolder>(sources, [=]() {
    auto p = std::make_shared<Packed>();
    record_sources(*p, sources, unversioned);
    at::NoGradGuard no_grad;
    // (OC, IC, KH, KW): a transposed convolution's weight is (IC, OC, KH, KW); oneDNN's
    // deconvolution takes it with the channels swapped, not flipped.
    at::Tensor W = transposed ? wt->detach().transpose(0, 1) : wt->detach();
    at::Tensor B = bt ? bt->detach().clone() : at::zeros({W.size(0)}, W.options());
    if (bn) {
      at::Tensor inv = (bn->running_var->detach() + bn->eps).rsqrt();
      at::Tensor scale = bn->weight ? bn->weight->detach() * inv : inv;
      at::Tensor shift =
          bn->bias ? bn->bias->detach() - bn->running_mean->detach() * scale : -bn->running_mean->detach() * scale;
      W = W * scale.reshape({-1, 1, 1, 1});
      B = B * scale + shift;
    }
    // (OC, IC, KH, KW) -> (IC, KH, KW, OC) for the GEMM.
    W = gemm ? W.permute({1, 2, 3, 0}).contiguous() : W.contiguous();
    p->bias = B.contiguous();
    p->nonfinite = any_above(*scan, W, kNonFiniteAbove) || any_above(*scan, p->bias, kNonFiniteAbove);
    dims wd = gemm     ? dims{W.size(0), W.size(1) * W.size(2) * W.size(3)}
              : G == 1 ? dims{W.size(0), W.size(1), W.size(2), W.size(3)}
                       : dims{G, W.size(0) / G, W.size(1), W.size(2), W.size(3)};
    md_t user(wd, dt::f32, gemm ? tag::ab : G == 1 ? tag::oihw : tag::goihw);
    p->weight = at::empty({static_cast<int64_t>(packed_md.get_size()) + 64}, at::kByte);
    reorder_now(user, W.data_ptr(), packed_md, p->weight.data_ptr());
    return std::shared_ptr<const Packed>(std::move(p));
  }, PackKey{what, {packed_md}});
}

}  // namespace

// ---- matching -----------------------------------------------------------------------------------

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
  const TransposedPath path = g.transposed ? transposed_path() : TransposedPath::Aten;
  if (g.transposed && path == TransposedPath::Aten) return false;
  if (g.transposed) {
    // Ungrouped only; the output padding only shows in the output size (the right padding).
    if (g.groups != 1 || xm.sizes[1] != wm.sizes[0] || om.sizes[1] != OC) return false;
    if (!arg(n, output_padding_index).is_constant() || !int_list(arg(n, output_padding_index).constant())) return false;
    const std::vector<int64_t> k{wm.sizes[2], wm.sizes[3]};
    for (size_t d = 0; d < 2; ++d) {
      if (g.stride[d] < 1 || g.dilation[d] < 1 || g.padding[d] < 0) return false;
      // oneDNN's right padding of the deconvolution must not be negative
      if (path == TransposedPath::Deconv &&
          (xm.sizes[d + 2] - 1) * g.stride[d] + (k[d] - 1) * g.dilation[d] + 1 - om.sizes[d + 2] - g.padding[d] < 0)
        return false;
    }
    g.transposed_gemm = path == TransposedPath::Gemm;
  } else if (xm.sizes[1] != wm.sizes[1] * g.groups || wm.sizes[0] % g.groups != 0) {
    return false;
  }
  g.src = *x;
  g.head.push_back(n);
  g.base = n->output(0);
  match_batch_norm(g, OC);
  return true;
}

// An eval BatchNorm right after the convolution (its sole user), with its parameters and running
// statistics module attributes of `channels` elements: folded into the weights.
bool Compiler::match_batch_norm(Group& g, int64_t channels) {
  ir::Use u;
  if (!sole_use(g.base, &u) || u.arg_index != 0) return false;
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
  if (!ok) return false;
  auto eps = scalar_arg(bn, eps_index);
  auto rm = value_arg(bn, 3), rv = value_arg(bn, 4), bw = value_arg(bn, 1), bb = value_arg(bn, 2);
  auto attr_c = [&](const std::optional<Value>& v) -> const at::Tensor* {
    if (!v) return nullptr;
    const at::Tensor* a = attr_of(*v);
    return a && a->dim() == 1 && a->size(0) == channels ? a : nullptr;
  };
  FoldedBatchNorm f;
  f.running_mean = attr_c(rm);
  f.running_var = attr_c(rv);
  f.weight = attr_c(bw);
  f.bias = attr_c(bb);
  if (!eps || !f.running_mean || !f.running_var || !(f.weight || none_arg(bn, 1)) || !(f.bias || none_arg(bn, 2)) ||
      !is_f32(meta(bn->output(0))) || meta(bn->output(0)).sizes != meta(g.base).sizes)
    return false;
  f.eps = *eps;
  g.bn = f;
  g.head.push_back(bn);
  for (auto& v : {rm, rv, bw, bb})
    if (v && v->node->kind() == NodeKind::GetAttr && v->node->uses(0).size() == 1) g.helpers.push_back(v->node);
  g.base = bn->output(0);
  return true;
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

// ---- emission -----------------------------------------------------------------------------------

bool Compiler::emit_conv(Group& g) {
  if (g.transposed_gemm) return emit_tconv_gemm(g);
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
  md_t plain_dst({N, OC, OH, OW}, dt::f32, tag::nchw);
  const bool winograd_dst = feeds_winograd(g, group_of_);

  // The source: blocked from an earlier conv (use its layout if the primitive takes it) or plain.
  const Loc* src_loc = blocked_loc(g.src);
  const md_t src_have = src_loc ? src_loc->md : plain_src;
  // Layouts to try, in order (each algorithm, then each source, then each destination).
  std::vector<md_t> src_tries, dst_tries;
  if (src_loc) src_tries.push_back(src_have);
  // Deconvolutions: oneDNN's fast (brgemm) kernels take channels-last activations (what ATen
  // 2.x's own oneDNN path uses); with `any` it picks a blocked layout and a much slower kernel.
  if (g.transposed) src_tries.push_back(md_t({N, IC, IH, IW}, dt::f32, tag::nhwc));
  src_tries.push_back(md_t({N, IC, IH, IW}, dt::f32, tag::any));
  // A destination read by a Winograd convolution is written in that one's layout.
  if (winograd_dst && OC % 16 == 0) dst_tries.push_back(md_t({N, OC, OH, OW}, dt::f32, tag::nChw16c));
  if (g.transposed) dst_tries.push_back(md_t({N, OC, OH, OW}, dt::f32, tag::nhwc));
  dst_tries.push_back(dst_any);
  std::vector<dnnl::algorithm> algs;
  if (winograd_candidate(g, os)) algs.push_back(dnnl::algorithm::convolution_winograd);
  algs.push_back(dnnl::algorithm::convolution_direct);

  // Trim post-ops until oneDNN accepts the chain (never below the anchor itself).
  for (size_t kept = g.kept + 1; kept-- > 0;) {
    dnnl::primitive_attr attr = user_scratchpad_attr();
    attr.set_post_ops(make_post_ops(g, kept, {}, true));
    std::optional<dnnl::primitive_desc> pd;
    dnnl::primitive prim;
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
    s->src = act_in(g.src, reads);
    if (!(pd->src_desc() == src_have)) {
      s->src.reorder = make_reorder(src_have, pd->src_desc());
      s->src.reorder_buffer = add_buffer(pd->src_desc().get_size());
    }
    s->packed = pack_conv(g, pd->weights_desc(), scan_);
    s->m_src = add_mem(pd->src_desc());
    s->m_wei = add_mem(pd->weights_desc());
    s->m_bias = add_mem(bias_md);
    s->m_dst = add_mem(pd->dst_desc());
    add_scratchpad(pd->scratchpad_desc(), s->has_scratch, s->m_scratch);
    Value out = kept_output(g, kept);
    g.out = out;
    if (fuses_nan_losing_activation(g, kept)) s->fallback = make_fallback(g, kept, out, kNonFiniteAbove, reads);
    const std::vector<int64_t>& out_sizes = meta(out).sizes;
    // Residual (sum): copied into the destination in its layout first.
    for (size_t i = 0; i < kept; ++i)
      if (g.post[i].is_add) {
        s->has_sum = true;
        const Value& r = g.post[i].other;
        const Loc* rl = blocked_loc(r);
        const md_t have = rl ? rl->md : plain_dst;
        s->sum_src = act_in(r, reads);
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

namespace {

// For each output row o in [0, O), the kernel rows k and input rows i (i * stride - padding + k *
// dilation == o) that reach it, as pairs (k, i) in `taps`, those of o from begin[o] to begin[o + 1].
void transposed_taps(int64_t O, int64_t I, int64_t K, int64_t stride, int64_t padding, int64_t dilation,
                     std::vector<int32_t>& taps, std::vector<int32_t>& begin) {
  begin.assign(1, 0);
  for (int64_t o = 0; o < O; ++o) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t t = o + padding - k * dilation;
      if (t >= 0 && t % stride == 0 && t / stride < I) {
        taps.push_back(static_cast<int32_t>(k));
        taps.push_back(static_cast<int32_t>(t / stride));
      }
    }
    begin.push_back(static_cast<int32_t>(taps.size() / 2));
  }
}

}  // namespace

// A transposed convolution as TConvStep: fuses the leading relus of the chain (the gather applies
// them); the rest of the chain stays with ATen.
bool Compiler::emit_tconv_gemm(Group& g) {
  const TensorMeta& xm = meta(g.src);
  const at::Tensor& w = *g.weight_attr;  // (IC, OC, KH, KW)
  const int64_t N = xm.sizes[0], IC = xm.sizes[1], IH = xm.sizes[2], IW = xm.sizes[3];
  const int64_t OC = w.size(1), KH = w.size(2), KW = w.size(3);
  const std::vector<int64_t>& os = meta(g.base).sizes;
  const int64_t OH = os[2], OW = os[3], M = N * IH * IW, taps_oc = KH * KW * OC;
  if (M * taps_oc > (int64_t(1) << 31)) return false;  // the columns would take more than 8 GiB
  size_t kept = 0;
  while (kept < g.kept && !g.post[kept].is_add && g.post[kept].e.alg == dnnl::algorithm::eltwise_relu &&
         g.post[kept].e.alpha == 0.f)
    ++kept;
  const md_t src_md({M, IC}, dt::f32, tag::ab), wei_any({IC, taps_oc}, dt::f32, tag::any),
      dst_md({M, taps_oc}, dt::f32, tag::ab);
  dnnl::matmul::primitive_desc pd;
  try {
    pd = compat::matmul_pd(cpu_engine(), src_md, wei_any, md_t(), dst_md, user_scratchpad_attr());
  } catch (const dnnl::error&) {
    return false;
  }
  if (is_ref_impl(pd.impl_info_str())) return false;
  pd = with_spaced_weight_rows(pd, src_md, md_t(), dst_md, user_scratchpad_attr());
  impls_.push_back(matmul_impl_label(pd));
  g.kept = kept;
  auto s = std::make_unique<TConvStep>();
  std::vector<uint32_t> reads;
  s->prim = dnnl::matmul(pd);
  s->src = act_in(g.src, reads);
  // The source channels-last: a blocked value in another layout, or a plain NCHW one with more
  // than one pixel per channel, is reordered first.
  const md_t nhwc({N, IC, IH, IW}, dt::f32, tag::nhwc);
  const Loc* src_loc = blocked_loc(g.src);
  if (src_loc ? !(src_loc->md == nhwc) : IH * IW != 1) {
    s->src.reorder = make_reorder(src_loc ? src_loc->md : md_t({N, IC, IH, IW}, dt::f32, tag::nchw), nhwc);
    s->src.reorder_buffer = add_buffer(nhwc.get_size());
  }
  s->packed = pack_conv(g, pd.weights_desc(), scan_, /*gemm=*/true);
  s->m_src = add_mem(src_md);
  s->m_wei = add_mem(pd.weights_desc());
  s->m_dst = add_mem(dst_md);
  add_scratchpad(pd.scratchpad_desc(), s->has_scratch, s->m_scratch);
  s->cols = add_buffer(dst_md.get_size());
  s->N = N;
  s->shape.IH = IH;
  s->shape.IW = IW;
  s->shape.OC = OC;
  s->shape.KH = KH;
  s->shape.KW = KW;
  s->shape.OH = OH;
  s->shape.OW = OW;
  s->shape.relu = kept > 0;
  s->shape.SW = g.stride[1];
  s->shape.PW = g.padding[1];
  s->shape.DW = g.dilation[1];
  transposed_taps(OH, IH, KH, g.stride[0], g.padding[0], g.dilation[0], s->row_taps, s->row_begin);
  s->kernels = scan_;
  const Value out = kept_output(g, kept);
  g.out = out;
  s->out.sizes = meta(out).sizes;
  if (keep_blocked(out)) {  // read by other convolutions / poolings: channels-last
    const md_t out_md({N, OC, OH, OW}, dt::f32, tag::nhwc);
    s->out.blocked = true;
    ++blocked_values_;
    s->out.buffer = add_buffer(out_md.get_size());
    Loc l;
    l.kind = Loc::Blocked;
    l.index = s->out.buffer;
    l.md = out_md;
    l.sizes = s->out.sizes;
    locs_[out] = l;
  } else {
    s->shape.nchw = true;
    s->out.slot = new_slot();
    locs_[out] = slot_loc(s->out.slot);
  }
  push(std::move(s), std::move(reads));
  return true;
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

}  // namespace torchcompile::backends::onednn::detail
