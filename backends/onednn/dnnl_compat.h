// The oneDNN API differences between 2.x (Debian 12: 2.6) and 3.x (Debian 13: 3.7) that the
// backend meets, in one place. oneDNN 3 removed the operation descriptors (`matmul::desc`,
// `lstm_forward::desc`, ...): primitive descriptors are built directly from the engine and the
// memory descriptors, with the attributes as an argument; post-op eltwise lost its scale;
// `memory::desc::dims()` became `get_dims()`; pooling always takes a dilation. Everything else the
// backend uses (memory descriptors, reorders, the C execution API, post-ops sum and binary) is the
// same in both.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace torchcompile::backends::onednn::compat {

using md_t = dnnl::memory::desc;
using dims = dnnl::memory::dims;

inline dims dims_of(const md_t& md) {
#if DNNL_VERSION_MAJOR >= 3
  return md.get_dims();
#else
  return md.dims();
#endif
}

inline void append_eltwise(dnnl::post_ops& po, dnnl::algorithm alg, float alpha, float beta) {
#if DNNL_VERSION_MAJOR >= 3
  po.append_eltwise(alg, alpha, beta);
#else
  po.append_eltwise(1.f, alg, alpha, beta);
#endif
}

/// A matmul; `bias` may be a zero descriptor (no bias).
inline dnnl::matmul::primitive_desc matmul_pd(const dnnl::engine& e, const md_t& src, const md_t& wei, const md_t& bias,
                                              const md_t& dst, const dnnl::primitive_attr& attr) {
  const bool has_bias = !(bias == md_t());
#if DNNL_VERSION_MAJOR >= 3
  return has_bias ? dnnl::matmul::primitive_desc(e, src, wei, bias, dst, attr)
                  : dnnl::matmul::primitive_desc(e, src, wei, dst, attr);
#else
  auto d = has_bias ? dnnl::matmul::desc(src, wei, bias, dst) : dnnl::matmul::desc(src, wei, dst);
  return dnnl::matmul::primitive_desc(d, attr, e);
#endif
}

/// A 2-D convolution forward; `bias` may be a zero descriptor; dilations are 0-based (0: none).
inline dnnl::convolution_forward::primitive_desc conv_forward_pd(const dnnl::engine& e, dnnl::prop_kind prop,
                                                                 dnnl::algorithm alg, const md_t& src, const md_t& wei,
                                                                 const md_t& bias, const md_t& dst, const dims& strides,
                                                                 const dims& dilates, const dims& pad_l,
                                                                 const dims& pad_r, const dnnl::primitive_attr& attr) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::convolution_forward::primitive_desc(e, prop, alg, src, wei, bias, dst, strides, dilates, pad_l, pad_r,
                                                   attr);
#else
  dnnl::convolution_forward::desc d(prop, alg, src, wei, bias, dst, strides, dilates, pad_l, pad_r);
  return dnnl::convolution_forward::primitive_desc(d, attr, e);
#endif
}

/// A 2-D deconvolution (transposed convolution) forward; `bias` may be a zero descriptor.
inline dnnl::deconvolution_forward::primitive_desc deconv_forward_pd(const dnnl::engine& e, dnnl::prop_kind prop,
                                                                     const md_t& src, const md_t& wei, const md_t& bias,
                                                                     const md_t& dst, const dims& strides,
                                                                     const dims& dilates, const dims& pad_l,
                                                                     const dims& pad_r, const dnnl::primitive_attr& attr) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::deconvolution_forward::primitive_desc(e, prop, dnnl::algorithm::deconvolution_direct, src, wei, bias,
                                                     dst, strides, dilates, pad_l, pad_r, attr);
#else
  dnnl::deconvolution_forward::desc d(prop, dnnl::algorithm::deconvolution_direct, src, wei, bias, dst, strides,
                                      dilates, pad_l, pad_r);
  return dnnl::deconvolution_forward::primitive_desc(d, attr, e);
#endif
}

inline dnnl::convolution_backward_data::primitive_desc conv_backward_data_pd(
    const dnnl::engine& e, dnnl::algorithm alg, const md_t& diff_src, const md_t& wei, const md_t& diff_dst,
    const dims& strides, const dims& pad_l, const dims& pad_r, const dnnl::primitive_attr& attr,
    const dnnl::convolution_forward::primitive_desc& hint) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::convolution_backward_data::primitive_desc(e, alg, diff_src, wei, diff_dst, strides, pad_l, pad_r, hint,
                                                         attr);
#else
  dnnl::convolution_backward_data::desc d(alg, diff_src, wei, diff_dst, strides, pad_l, pad_r);
  return dnnl::convolution_backward_data::primitive_desc(d, attr, e, hint);
#endif
}

/// `diff_bias` may be a zero descriptor (no bias gradient).
inline dnnl::convolution_backward_weights::primitive_desc conv_backward_weights_pd(
    const dnnl::engine& e, dnnl::algorithm alg, const md_t& src, const md_t& diff_wei, const md_t& diff_bias,
    const md_t& diff_dst, const dims& strides, const dims& pad_l, const dims& pad_r, const dnnl::primitive_attr& attr,
    const dnnl::convolution_forward::primitive_desc& hint) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::convolution_backward_weights::primitive_desc(e, alg, src, diff_wei, diff_bias, diff_dst, strides, pad_l,
                                                            pad_r, hint, attr);
#else
  dnnl::convolution_backward_weights::desc d(alg, src, diff_wei, diff_bias, diff_dst, strides, pad_l, pad_r);
  return dnnl::convolution_backward_weights::primitive_desc(d, attr, e, hint);
#endif
}

/// A 2-D pooling forward; dilations are 0-based (with oneDNN 2.x only 0: undilated).
inline dnnl::pooling_forward::primitive_desc pooling_forward_pd(const dnnl::engine& e, dnnl::prop_kind prop,
                                                                dnnl::algorithm alg, const md_t& src, const md_t& dst,
                                                                const dims& strides, const dims& kernel,
                                                                const dims& dilation, const dims& pad_l,
                                                                const dims& pad_r, const dnnl::primitive_attr& attr) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::pooling_forward::primitive_desc(e, prop, alg, src, dst, strides, kernel, dilation, pad_l, pad_r, attr);
#else
  for (auto d : dilation)
    if (d != 0) throw dnnl::error(dnnl_unimplemented, "dilated pooling needs oneDNN's pooling_v2 (not used)");
  dnnl::pooling_forward::desc d(prop, alg, src, dst, strides, kernel, pad_l, pad_r);
  return dnnl::pooling_forward::primitive_desc(d, attr, e);
#endif
}

/// An LSTM forward (`src_iter_c` / `dst_iter_c`: the cell states).
inline dnnl::lstm_forward::primitive_desc lstm_forward_pd(const dnnl::engine& e, dnnl::prop_kind prop,
                                                          dnnl::rnn_direction dir, const md_t& src_layer,
                                                          const md_t& src_iter, const md_t& src_iter_c,
                                                          const md_t& wei_layer, const md_t& wei_iter,
                                                          const md_t& bias, const md_t& dst_layer,
                                                          const md_t& dst_iter, const md_t& dst_iter_c,
                                                          const dnnl::primitive_attr& attr) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::lstm_forward::primitive_desc(e, prop, dir, src_layer, src_iter, src_iter_c, wei_layer, wei_iter, bias,
                                            dst_layer, dst_iter, dst_iter_c, attr);
#else
  dnnl::lstm_forward::desc d(prop, dir, src_layer, src_iter, src_iter_c, wei_layer, wei_iter, bias, dst_layer,
                             dst_iter, dst_iter_c);
  return dnnl::lstm_forward::primitive_desc(d, attr, e);
#endif
}

/// A linear-before-reset GRU forward (PyTorch's GRU: the reset gate scales W_hn h + b_hn).
inline dnnl::lbr_gru_forward::primitive_desc lbr_gru_forward_pd(const dnnl::engine& e, dnnl::prop_kind prop,
                                                                dnnl::rnn_direction dir, const md_t& src_layer,
                                                                const md_t& src_iter, const md_t& wei_layer,
                                                                const md_t& wei_iter, const md_t& bias,
                                                                const md_t& dst_layer, const md_t& dst_iter,
                                                                const dnnl::primitive_attr& attr) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::lbr_gru_forward::primitive_desc(e, prop, dir, src_layer, src_iter, wei_layer, wei_iter, bias, dst_layer,
                                               dst_iter, attr);
#else
  dnnl::lbr_gru_forward::desc d(prop, dir, src_layer, src_iter, wei_layer, wei_iter, bias, dst_layer, dst_iter);
  return dnnl::lbr_gru_forward::primitive_desc(d, attr, e);
#endif
}

/// One zero point for the whole source, given at each execution (DNNL_ARG_ATTR_ZERO_POINTS |
/// DNNL_ARG_SRC, one s32).
inline void set_runtime_src_zero_point(dnnl::primitive_attr& attr) {
#if DNNL_VERSION_MAJOR >= 3
  attr.set_zero_points_mask(DNNL_ARG_SRC, 0);
#else
  attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
#endif
}

/// How the int8 GEMM at a fixed number of rows (uint8 source with a run-time zero point, int8
/// weight, int32 sums) is made. oneDNN 2 gives int8 matmuls only `gemm:jit` with the weight in the
/// plain layout, but a 1x1 convolution over the rows as pixels its blocked kernels: a convolution.
/// oneDNN 3.6 divides by zero (SIGFPE) creating such a convolution for some shapes (256 -> 1024
/// channels over 32 pixels, with VNNI), and gives fixed-rows matmuls its brgemm kernels: a matmul.
inline constexpr bool kInt8RowsAsConvolution = DNNL_VERSION_MAJOR < 3;

/// The attributes of a uint8 x int8 matmul whose scales (source: one, given per call; weights:
/// one per output column) and source zero point are given at run time.
inline void set_int8_dynamic_scales(dnnl::primitive_attr& attr) {
#if DNNL_VERSION_MAJOR >= 3
  attr.set_scales_mask(DNNL_ARG_SRC, 0);
  attr.set_scales_mask(DNNL_ARG_WEIGHTS, 1 << 1);
#else
  attr.set_output_scales(1 << 1, {DNNL_RUNTIME_F32_VAL});
#endif
  set_runtime_src_zero_point(attr);
}

/// One call's run-time scales, zero point and bias of such a matmul. oneDNN 3 takes the source
/// and weight scales apart and adds the bias after scaling; oneDNN 2 takes their products as
/// output scales and adds the bias before scaling (dst = scale * (acc + bias)), so the bias is
/// divided by the scales here.
class Int8Scales {
 public:
  Int8Scales(float src_scale, const std::vector<float>& wei_scales, int32_t zero_point, const at::Tensor& bias)
      : zero_point_(zero_point) {
    const size_t n = wei_scales.size();
    const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
#if DNNL_VERSION_MAJOR >= 3
    src_scale_ = src_scale;
    wei_scales_ = wei_scales;
    if (b) bias_.assign(b, b + n);
#else
    scales_.resize(n);
    for (size_t i = 0; i < n; ++i) scales_[i] = src_scale * wei_scales[i];
    if (b) {
      bias_.resize(n);
      for (size_t i = 0; i < n; ++i) bias_[i] = b[i] / scales_[i];
    }
#endif
  }
  const float* bias() const { return bias_.empty() ? nullptr : bias_.data(); }
  template <typename Args>
  void add_args(Args& args, std::vector<dnnl::memory>& keep, const dnnl::engine& e) {
    using dt = dnnl::memory::data_type;
    auto vec = [&](int arg, dt type, const void* p, int64_t n) {
      keep.emplace_back(md_t({n}, type, dnnl::memory::format_tag::a), e, const_cast<void*>(p));
      args.add(arg, keep.back());
    };
    vec(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, dt::s32, &zero_point_, 1);
#if DNNL_VERSION_MAJOR >= 3
    vec(DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, dt::f32, &src_scale_, 1);
    vec(DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS, dt::f32, wei_scales_.data(), static_cast<int64_t>(wei_scales_.size()));
#else
    vec(DNNL_ARG_ATTR_OUTPUT_SCALES, dt::f32, scales_.data(), static_cast<int64_t>(scales_.size()));
#endif
  }

 private:
  int32_t zero_point_;
#if DNNL_VERSION_MAJOR >= 3
  float src_scale_ = 1.f;
  std::vector<float> wei_scales_;
#else
  std::vector<float> scales_;
#endif
  std::vector<float> bias_;
};

}  // namespace torchcompile::backends::onednn::compat
