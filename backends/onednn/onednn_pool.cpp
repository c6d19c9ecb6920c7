// Pooling groups of the onednn backend: max pooling, average pooling and (after a lowered
// convolution, whose output may then stay blocked) global average pooling, as one oneDNN pooling
// primitive each (PoolStep). A max pooling whose input holds a NaN runs with ATen on that call
// (AtenFallback): oneDNN's max skips NaNs, ATen's propagates them.
#include "onednn_internal.h"

namespace torchcompile::backends::onednn::detail {

namespace {

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

}  // namespace

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
  } else if (is_call(n, {"aten::avg_pool2d"})) {
    // Average pooling: avg_pool2d(self, kernel_size, stride, padding, ceil_mode,
    // count_include_pad, divisor_override) without a divisor override. ATen divides by the window
    // clipped to the padded input (count_include_pad) or to the input (oneDNN's include / exclude
    // padding), except that the window ceil_mode adds past the padding is not counted by ATen:
    // that case stays with it.
    g.dilation = {1, 1};
    auto include = arg(n, 5).is_constant() ? scalar_arg(n, 5) : std::nullopt;
    if (!include || !none_arg(n, 6) || !read_pool_window(n, g, 4)) return false;
    const TensorMeta& om = meta(n->output(0));
    g.count_include_pad = *include != 0.0;
    if (g.count_include_pad)
      for (size_t d = 0; d < 2; ++d)
        if ((om.sizes[d + 2] - 1) * g.stride[d] + g.kernel[d] > xm.sizes[d + 2] + 2 * g.padding[d]) return false;
  } else {
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
    if (!is_f32(om) || !is_contiguous(om.sizes, om.strides) || numel(om.sizes) != xm.sizes[0] * xm.sizes[1])
      return false;
    g.kernel = {xm.sizes[2], xm.sizes[3]};
    g.stride = {1, 1};
    g.padding = {0, 0};
  }
  g.src = *x;
  g.head.push_back(n);
  g.base = n->output(0);
  return true;
}

bool Compiler::emit_pool(Group& g) {
  const TensorMeta& xm = meta(g.src);
  const int64_t N = xm.sizes[0], C = xm.sizes[1], H = xm.sizes[2], W = xm.sizes[3];
  // The output's 4-D sizes (global average pooling may have flattened them).
  const bool global = is_call(g.anchor, {"aten::adaptive_avg_pool2d", "aten::mean.dim"});
  const std::vector<int64_t> os4 = global ? std::vector<int64_t>{N, C, 1, 1} : meta(g.base).sizes;
  const Loc* src_loc = blocked_loc(g.src);
  md_t src_md = src_loc ? src_loc->md : md_t({N, C, H, W}, dt::f32, tag::nchw);
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
  s->src = act_in(g.src, reads);
  s->m_src = add_mem(src_md);
  s->m_dst = add_mem(pd->dst_desc());
  add_scratchpad(pd->scratchpad_desc(), s->has_scratch, s->m_scratch);
  s->out.sizes = meta(g.out).sizes;
  // A NaN in a max pooling's input: its node runs with ATen instead.
  if (g.pool_max) s->fallback = make_fallback(g, 0, g.out, kNanAbove, reads);
  plain_output(s->out, pd->dst_desc(), plain_dst, g.out);
  push(std::move(s), std::move(reads));
  return true;
}

}  // namespace torchcompile::backends::onednn::detail
