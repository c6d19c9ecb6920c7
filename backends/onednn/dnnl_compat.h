// The oneDNN API differences between 2.x (Debian 12: 2.6) and 3.x (Debian 13: 3.7) that the
// backend meets, in one place. oneDNN 3 removed the operation descriptors (`matmul::desc`,
// `lstm_forward::desc`, ...): primitive descriptors are built directly from the engine and the
// memory descriptors, with the attributes as an argument; post-op eltwise lost its scale;
// `memory::desc::dims()` became `get_dims()`; pooling always takes a dilation. Everything else the
// backend uses (memory descriptors, reorders, the C execution API, post-ops sum and binary) is the
// same in both.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

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

}  // namespace torchcompile::backends::onednn::compat
