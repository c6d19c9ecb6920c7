// What the onednn backend's steps do at run time (their fields are in onednn_internal.h, set by
// the emitters): execute a oneDNN primitive with the call's tensors and buffers bound to its
// memory objects, reorder blocked values, run ATen steps, and take AtenFallback's ATen path on a
// call whose inputs hold values the primitive would get wrong.
#include "onednn_internal.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/SmallVector.h>

#include <omp.h>

#include <algorithm>
#include <memory>

// at::parallel_for is an `omp parallel` region inline in LibTorch's headers: without OpenMP this
// file's parallel loops would silently run on one thread (CMakeLists.txt adds the flag).
#ifndef _OPENMP
#error "compile this file with OpenMP (at::parallel_for)"
#endif

namespace torchcompile::backends::onednn::detail {

OneThreadScope::OneThreadScope(bool active) : before_(active ? omp_get_max_threads() : 0) {
  if (before_ > 1) omp_set_num_threads(1);
}

OneThreadScope::~OneThreadScope() {
  if (before_ > 1) omp_set_num_threads(before_);
}

void AttrStep::run(Ctx& c) const {
  c.slots[out] = *attr;
  if (c.below_autograd) c.below_autograd = ir::may_dispatch_below_autograd(attr, 1);
}

void AtenStep::run(Ctx& c) const { call.run(c.slots, *c.stack, c.below_autograd); }

void Reorder::run(const Ctx& c, void* from, void* to) const {
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

void ToPlainStep::run(Ctx& c) const {
  at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(at::kFloat));
  r.run(c, c.ms->buffer_ptrs[buffer], t.data_ptr());
  c.slots[out] = std::move(t);
}

// ---- AtenFallback -------------------------------------------------------------------------------

// Scans the floats between the tensor's first and last element: exactly its elements when its
// layout is dense (contiguous, or a transposed / permuted weight as training graphs pass them);
// for a view with gaps of at most 3x its size, those gaps too, which can only send a call to the
// ATen path, never keep it from it. Other tensors go through ATen (several kernels).
bool any_above(const ScanKernels& scan, const at::Tensor& t, int32_t limit) {
  if (!t.defined() || t.numel() == 0) return false;
  if (t.scalar_type() == at::kFloat) {
    int64_t span = 1;
    for (int64_t d = 0; d < t.dim(); ++d) span += (t.size(d) - 1) * t.stride(d);  // ATen strides are >= 0
    if (span <= 4 * t.numel()) return scan.magnitude_above(t.data_ptr(), static_cast<size_t>(span), limit);
  }
  if (limit == kNanAbove) return at::isnan(t).any().item<bool>();
  return !at::isfinite(t).all().item<bool>();
}

bool AtenFallback::triggered(const Ctx& c, const Packed* packed) const {
  if (packed && packed->nonfinite) return true;
  for (const Scan& s : scans) {
    if (s.blocked ? scan->magnitude_above(c.ms->buffer_ptrs[s.index], s.floats, limit)
                  : any_above(*scan, c.slots[s.index], limit))
      return true;
  }
  return false;
}

at::Tensor AtenFallback::run(Ctx& c) const {
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

// ---- primitives ---------------------------------------------------------------------------------

void MatmulStep::run(Ctx& c) const {
  const auto& m = c.ms->mems;
  at::Tensor tmp_src, tmp_wei, tmp_bias;
  ExecArgs args;
  std::shared_ptr<const Packed> pk;
  if (packed) pk = packed->get();
  if (fallback && fallback->triggered(c, pk.get())) {
    c.slots[out] = fallback->run(c);
    return;
  }
  // Run-time rows: this call's source and destination memory objects.
  dnnl::memory rows_src, rows_dst;
  at::Tensor y;
  if (rows_k) {
    const at::Tensor& t = c.slots[src.slot];
    TORCH_CHECK(t.dim() == static_cast<int64_t>(src.sizes.size()) && t.size(-1) == rows_k,
                "onednn backend: a GEMM expected a source of ", src.sizes.size(), " dimensions ending in ", rows_k,
                ", got sizes ", t.sizes());
    if (t.scalar_type() == at::kFloat && t.is_contiguous() && !t.is_neg() && !t.is_conj()) {
      tmp_src = t;
    } else {
      tmp_src = at::empty(t.sizes(), t.options().dtype(at::kFloat));
      tmp_src.copy_(t);
    }
    std::vector<int64_t> sizes = t.sizes().vec();
    sizes.back() = rows_n;
    y = at::empty(sizes, at::TensorOptions().dtype(at::kFloat));
    const int64_t rows = tmp_src.numel() / rows_k;
    if (rows == 0) {
      c.slots[out] = std::move(y);
      return;
    }
    rows_src = dnnl::memory(md_t({rows, rows_k}, dt::f32, tag::ab), cpu_engine(), tmp_src.data_ptr());
    rows_dst = dnnl::memory(md_t({rows, rows_n}, dt::f32, tag::ab), cpu_engine(), y.data_ptr());
    args.add(DNNL_ARG_SRC, rows_src);
  } else {
    args.bind(DNNL_ARG_SRC, m[m_src], src.get(c, tmp_src).data_ptr());
  }
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
  if (rows_k) {
    args.add(DNNL_ARG_DST, rows_dst);
  } else {
    y = at::empty(out_sizes, at::TensorOptions().dtype(at::kFloat));
    args.bind(DNNL_ARG_DST, m[m_dst], y.data_ptr());
  }
  if (has_scratch) {
    args.bind(DNNL_ARG_SCRATCHPAD, m[m_scratch], c.ms->buffer_ptrs[0]);
  }
  {
    OneThreadScope one(one_thread);
    execute(prim, c, args);
  }
  c.slots[out] = std::move(y);
}

void* ActIn::get(const Ctx& c, at::Tensor& tmp) const {
  void* p = blocked ? c.ms->buffer_ptrs[index] : plain.get(c, tmp).data_ptr();
  if (!reorder) return p;
  void* q = c.ms->buffer_ptrs[reorder_buffer];
  reorder->run(c, p, q);
  return q;
}

void ConvStep::run(Ctx& c) const {
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

void TConvStep::run(Ctx& c) const {
  const auto& m = c.ms->mems;
  at::Tensor tmp_src;
  std::shared_ptr<const Packed> pk = packed->get();
  void* x = src.get(c, tmp_src);
  float* columns = static_cast<float*>(c.ms->buffer_ptrs[cols]);
  ExecArgs args;
  args.bind(DNNL_ARG_SRC, m[m_src], x);
  args.bind(DNNL_ARG_WEIGHTS, m[m_wei], pk->weight.data_ptr());
  args.bind(DNNL_ARG_DST, m[m_dst], columns);
  if (has_scratch) {
    args.bind(DNNL_ARG_SCRATCHPAD, m[m_scratch], c.ms->buffer_ptrs[0]);
  }
  execute(prim, c, args);
  at::Tensor y;
  float* dst;
  if (out.blocked) {
    dst = static_cast<float*>(c.ms->buffer_ptrs[out.buffer]);
  } else {
    y = at::empty(out.sizes, at::TensorOptions().dtype(at::kFloat));
    dst = y.data_ptr<float>();
  }
  Col2im s = shape;
  s.row_taps = row_taps.data();
  s.row_begin = row_begin.data();
  const float* bias = pk->bias.data_ptr<float>();
  // Rows of about 16K output floats or more per thread; a small output stays on this thread.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, s.OW * s.OC));
  at::parallel_for(0, N * s.OH, grain, [&](int64_t r0, int64_t r1) {
    std::unique_ptr<float[]> scratch(s.nchw ? new float[s.OW * s.OC] : nullptr);
    kernels->col2im(columns, bias, dst, scratch.get(), s, r0, r1);
  });
  if (!out.blocked) c.slots[out.slot] = std::move(y);
}

void PoolStep::run(Ctx& c) const {
  if (fallback && fallback->triggered(c, nullptr)) {
    c.slots[out.slot] = fallback->run(c);
    return;
  }
  const auto& m = c.ms->mems;
  at::Tensor tmp_src;
  void* x = src.get(c, tmp_src);
  at::Tensor y = at::empty(out.sizes, at::TensorOptions().dtype(at::kFloat));
  void* dst = out.direct ? y.data_ptr() : c.ms->buffer_ptrs[out.buffer];
  ExecArgs args;
  args.bind(DNNL_ARG_SRC, m[m_src], x);
  args.bind(DNNL_ARG_DST, m[m_dst], dst);
  if (has_scratch) {
    args.bind(DNNL_ARG_SCRATCHPAD, m[m_scratch], c.ms->buffer_ptrs[0]);
  }
  execute(prim, c, args);
  if (!out.direct) out.to_plain->run(c, dst, y.data_ptr());
  c.slots[out.slot] = std::move(y);
}

void PlainPrimitiveStep::run(Ctx& c) const {
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

}  // namespace torchcompile::backends::onednn::detail
