// EmbeddingBag groups of the onednn backend: `embedding_bag` (what torch::embedding_bag and
// nn::EmbeddingBag call; `_embedding_bag` and `_embedding_bag_forward_only` too) of mode sum or mean, without per-sample
// weights, whose other results (offset2bag, bag sizes, max indices: for the backward) nothing
// reads. The backend's own loop (ScanKernels::bag_reduce) sums each bag's rows straight into the
// result: ATen's operator first builds the offset2bag and bag-size tensors and a few more, which
// costs several times the sums on a serving request of a few dozen bags (a following Linear's
// GEMM reads the result as any other source). The loop reads every size at run time, so a graph
// whose symbols size the indices and the bags keeps one program for every size.
#include "onednn_internal.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <atomic>

#ifndef _OPENMP
#error "at::parallel_for is an OpenMP region only when this file is compiled with OpenMP (CMakeLists.txt)"
#endif

namespace torchcompile::backends::onednn::detail {

namespace {

bool is_1d_long(const TensorMeta& m) { return m.defined && m.dtype == at::kLong && m.sizes.size() == 1; }

// Bags per parallel task: about 32k floats summed each (a serving request stays on one thread).
int64_t bags_per_task(int64_t indices, int64_t bags, int64_t dim) {
  const int64_t floats_per_bag = std::max<int64_t>(1, indices / std::max<int64_t>(1, bags)) * dim;
  return std::max<int64_t>(1, (int64_t{1} << 15) / floats_per_bag);
}

}  // namespace

// embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
// include_last_offset[, padding_idx: int?]) as the tracer records torch::embedding_bag, and
// _embedding_bag / _embedding_bag_forward_only (the same arguments, padding_idx an int, -1 for
// none), which it calls. scale_grad_by_freq and sparse change only the backward.
bool Compiler::match_embedding_bag(Node* n, Group& g) {
  const bool composite = is_call(n, {"aten::embedding_bag", "aten::embedding_bag.padding_idx"});
  if (!composite && !is_call(n, {"aten::_embedding_bag", "aten::_embedding_bag_forward_only"})) return false;
  if (n->args().size() < 8) return false;
  for (size_t i = 1; i < n->num_outputs(); ++i)
    if (!n->uses(i).empty()) return false;
  auto w = value_arg(n, 0), indices = value_arg(n, 1), offsets = value_arg(n, 2);
  if (!w || !indices || !offsets) return false;
  const TensorMeta& wm = meta(*w);
  if (!is_f32(wm) || wm.sizes.size() != 2 || !is_1d_long(meta(*indices)) || !is_1d_long(meta(*offsets))) return false;
  const bool has_padding = n->args().size() > 8;
  for (size_t i : {4, 7, 8})
    if ((i < 8 || has_padding) && !arg(n, i).is_constant()) return false;
  auto mode = scalar_arg(n, 4), include_last = scalar_arg(n, 7);
  if (!mode || (*mode != 0.0 && *mode != 1.0) || !include_last || !none_arg(n, 6)) return false;
  int64_t padding_idx = -1;
  if (has_padding && !none_arg(n, 8)) {
    auto p = scalar_arg(n, 8);
    if (!p) return false;
    padding_idx = static_cast<int64_t>(*p);
    // torch::embedding_bag counts a negative padding_idx from the end (ATen checks the range).
    if (composite && padding_idx < 0) padding_idx += wm.sizes[0];
    if (composite && (padding_idx < 0 || padding_idx >= wm.sizes[0])) return false;
  }
  if (!is_f32(meta(n->output(0)))) return false;
  g.kind = GroupKind::EmbeddingBag;
  g.anchor = n;
  g.src = *w;
  g.bag_mean = *mode == 1.0;
  g.include_last_offset = *include_last != 0.0;
  g.padding_idx = padding_idx;
  g.head.push_back(n);
  g.base = n->output(0);
  return true;
}

bool Compiler::emit_embedding_bag(Group& g) {
  Node* n = g.anchor;
  auto s = std::make_unique<EmbeddingBagStep>();
  s->weight = plain(g.src);
  s->indices = plain(*value_arg(n, 1));
  s->offsets = plain(*value_arg(n, 2));
  s->aten.emplace(op_step(n));
  s->out = s->aten->out_slots().at(0);
  s->mean = g.bag_mean;
  s->include_last_offset = g.include_last_offset;
  s->padding_idx = g.padding_idx;
  s->kernels = scan_;
  std::vector<uint32_t> reads = s->aten->reads();
  push(std::move(s), std::move(reads));
  return true;
}

void EmbeddingBagStep::run(Ctx& c) const {
  const at::Tensor& w = c.slots[weight];
  const at::Tensor& idx = c.slots[indices];
  const at::Tensor& off = c.slots[offsets];
  BagReduce s;
  bool ours = w.scalar_type() == at::kFloat && w.dim() == 2 && w.stride(1) == 1 && !w.is_mkldnn() &&
              idx.scalar_type() == at::kLong && idx.dim() == 1 && idx.is_contiguous() &&
              off.scalar_type() == at::kLong && off.dim() == 1 && off.is_contiguous() &&
              off.size(0) >= (include_last_offset ? 1 : 0);
  if (ours) {
    s.weight = w.data_ptr<float>();
    s.rows = w.size(0);
    s.dim = w.size(1);
    s.row_stride = w.stride(0);
    s.indices = idx.data_ptr<int64_t>();
    s.offsets = off.data_ptr<int64_t>();
    s.bags = off.size(0) - (include_last_offset ? 1 : 0);
    s.last_end = include_last_offset ? s.offsets[s.bags] : idx.size(0);
    s.padding_idx = padding_idx;
    s.mean = mean;
    // Bags within the indices, in order (ATen's offset2bag assumes it; other offsets stay with it).
    int64_t prev = 0;
    for (int64_t b = 0; ours && b < s.bags; ++b) {
      ours = s.offsets[b] >= prev;
      prev = s.offsets[b];
    }
    ours = ours && prev <= s.last_end && s.last_end <= idx.size(0);
  }
  if (ours) {
    at::Tensor y = at::empty({s.bags, s.dim}, w.options().memory_format(at::MemoryFormat::Contiguous));
    float* dst = y.data_ptr<float>();
    std::atomic<int64_t> bad{-1};
    const int64_t grain = bags_per_task(idx.size(0), s.bags, s.dim);
    if (s.bags <= grain) {
      bad = kernels->bag_reduce(s, dst, 0, s.bags);
    } else {
      at::parallel_for(0, s.bags, grain, [&](int64_t b0, int64_t b1) {
        const int64_t at = kernels->bag_reduce(s, dst, b0, b1);
        if (at >= 0) bad = at;
      });
    }
    if (bad < 0) {
      c.slots[out] = std::move(y);
      return;
    }
  }
  // ATen's operator: what eager computes for these inputs, or its error for an index out of range.
  aten->run(c.slots, *c.stack, c.below_autograd);
}

}  // namespace torchcompile::backends::onednn::detail
