// The reduced-precision Linear kernels behind CompileOptions::precision, as operators every
// backend can run (the precision pass, src/compile/precision.cpp, puts them into graphs):
//
//   torchcompile::linear_int8_dynamic(input, weight, bias?)   int8 GEMM, int32 accumulation
//   torchcompile::linear_bf16(input, weight, bias?, emulate)   bfloat16 GEMM, float32 accumulation
//
// Both take the float32 weight of the module. Its packed form (int8 with one scale per output
// channel, or bfloat16, in the layout oneDNN's matmul wants) is made at the first call and kept
// per weight (its storage, offset, sizes and strides) while the weight's version is unchanged;
// a weight whose parameter has a gradient is compared with a copy at each call, since LibTorch's
// optimizers write through `p.data()`, which does not bump the version. One matmul primitive per
// (K, N, bias) serves every number of rows (oneDNN's run-time dimensions).
//
// A number of rows seen before runs another kernel: oneDNN 2.6 gives a matmul with run-time rows
// (or, int8, run-time scales) only its `gemm:jit` with the weight in the plain layout, while a
// primitive made for a fixed number of rows gets the blocked kernels: for bfloat16 a matmul
// (`brg:avx512_core_bf16`), for int8 a 1x1 convolution over the rows as pixels (`brgconv_1x1`
// with VNNI, `jit_uni_int8_1x1:avx2` on AVX2; a fixed-rows int8 matmul would still need run-time
// scales), writing int32 sums that one pass turns into scale * sum + bias (the same arithmetic in
// oneDNN 2 and 3). Measured (2 threads, run-time rows / fixed rows): int8 with a source zero
// point, GOP/s, with VNNI 64x784x512 573 / 1416, 64x512x512 643 / 1323, 4096x512x2048 1426 /
// 1578; the same CPU limited to AVX2 (`vpmaddubsw`) 261 / 418, 267 / 420, 386 / 424, 8x256x1024
// 146 / 298; bfloat16, GFLOP/s, 64x784x512 491 / 711, 64x512x512 479 / 703, 1024x256x768 600 /
// 728. So the first call at a number of rows runs the run-time-rows matmul; the next ones the
// primitive made for that number (its creation costs 0.15-0.4 ms, not paid for sizes seen once).
//
// int8: the input is quantized at each call, per tensor and asymmetric (uint8 with a zero point,
// from its minimum and maximum); weights symmetric per output channel. A call whose input holds
// a NaN or an infinity (int8 has neither) computes in float32, as eager does; so does a weight
// holding one (for as long as it does).
// bfloat16: the input is rounded to bfloat16 at each call, the weight once; on a CPU without
// AVX512-BF16 (or `emulate`), both are rounded and the GEMM runs in float32: the same numbers.
#include "dnnl_compat.h"
#include "onednn_internal.h"

#include <torchcompile/support/isa.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

// at::parallel_for is an `omp parallel` region inline in LibTorch's headers: without OpenMP this
// file's parallel loops would silently run on one thread (CMakeLists.txt adds the flag).
#ifndef _OPENMP
#error "compile this file with OpenMP (at::parallel_for)"
#endif

namespace torchcompile::backends::onednn::detail {
namespace {

enum class Kind { Int8, Bf16, Bf16Emulated };

// ---- quantizing the input: q = clamp(round(x * (1 / scale) + zero_point), 0, 255) ---------------
// A product, then a sum, each rounded to float32 (no fused multiply-add: this file is compiled with
// -ffp-contract=off), as ATen computes `x * (1 / scale) + zero_point`: tests compare with that.

void quantize_scalar(const float* x, uint8_t* q, int64_t n, float inv, float zp) {
  for (int64_t i = 0; i < n; ++i)
    q[i] = static_cast<uint8_t>(std::min(std::max(std::nearbyint(x[i] * inv + zp), 0.f), 255.f));
}

// GCC 12 warns about the `_mm512_undefined` inside its own AVX-512 intrinsics when they are
// enabled by a target attribute rather than by flags.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) void quantize_avx512(const float* x, uint8_t* q,
                                                                                    int64_t n, float inv, float zp) {
  const __m512 vinv = _mm512_set1_ps(inv), vzp = _mm512_set1_ps(zp), lo = _mm512_setzero_ps(),
               hi = _mm512_set1_ps(255.f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vinv), vzp);
    v = _mm512_min_ps(_mm512_max_ps(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
  }
  quantize_scalar(x + i, q + i, n - i, inv, zp);  // the tail
}
#pragma GCC diagnostic pop

__attribute__((target("avx2,fma"))) inline __m256i quantize8_avx2(const float* p, __m256 inv, __m256 zp) {
  __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(p), inv), zp);
  v = _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                  _mm256_setzero_ps()),
                    _mm256_set1_ps(255.f));
  return _mm256_cvtps_epi32(v);
}

__attribute__((target("avx2,fma"))) void quantize_avx2(const float* x, uint8_t* q, int64_t n, float inv, float zp) {
  const __m256 vinv = _mm256_set1_ps(inv), vzp = _mm256_set1_ps(zp);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i ab = _mm256_packus_epi32(quantize8_avx2(x + i, vinv, vzp), quantize8_avx2(x + i + 8, vinv, vzp));
    const __m256i cd =
        _mm256_packus_epi32(quantize8_avx2(x + i + 16, vinv, vzp), quantize8_avx2(x + i + 24, vinv, vzp));
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), bytes);
  }
  quantize_scalar(x + i, q + i, n - i, inv, zp);  // the tail
}

void quantize(const float* x, uint8_t* q, int64_t n, float inv, float zp) {
  const support::Isa isa = support::selected_isa();
  auto kernel = isa == support::Isa::Avx512 ? &quantize_avx512 : isa == support::Isa::Avx2 ? &quantize_avx2 : &quantize_scalar;
  // Inline below ~64 Ki elements: an OpenMP region costs more than the work.
  at::parallel_for(0, n, 65536, [&](int64_t b, int64_t e) { kernel(x + b, q + b, e - b, inv, zp); });
}

// ---- the input's range: one pass for its minimum, maximum and whether every value is finite -----
// (ATen's aminmax took 10 us on M1's 64 x 784 input, two item() calls included; this pass ~2.)

struct Range {
  float mn = INFINITY, mx = -INFINITY;
  bool finite = true;
  void merge(const Range& o) {
    mn = std::min(mn, o.mn);
    mx = std::max(mx, o.mx);
    finite = finite && o.finite;
  }
};

void range_scalar(const float* x, int64_t n, Range& r) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) r.finite = false;
    r.mn = std::min(r.mn, x[i]);
    r.mx = std::max(r.mx, x[i]);
  }
}

void merge_lanes(const float* mn, const float* mx, const float* bad, int lanes, Range& r) {
  for (int k = 0; k < lanes; ++k) {
    r.mn = std::min(r.mn, mn[k]);
    r.mx = std::max(r.mx, mx[k]);
    r.finite = r.finite && bad[k] == 0.f;
  }
}

// `v - v` is 0 for a finite value and NaN for a NaN or an infinity; their sum keeps the NaN.
#pragma GCC diagnostic push  // as quantize_avx512
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) void range_avx512(const float* x, int64_t n, Range& r) {
  __m512 mn = _mm512_set1_ps(INFINITY), mx = _mm512_set1_ps(-INFINITY), bad = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    mn = _mm512_min_ps(mn, v);
    mx = _mm512_max_ps(mx, v);
    bad = _mm512_add_ps(bad, _mm512_sub_ps(v, v));
  }
  float lanes[3][16];
  _mm512_storeu_ps(lanes[0], mn);
  _mm512_storeu_ps(lanes[1], mx);
  _mm512_storeu_ps(lanes[2], bad);
  merge_lanes(lanes[0], lanes[1], lanes[2], 16, r);
  range_scalar(x + i, n - i, r);  // the tail
}
#pragma GCC diagnostic pop

__attribute__((target("avx2"))) void range_avx2(const float* x, int64_t n, Range& r) {
  __m256 mn = _mm256_set1_ps(INFINITY), mx = _mm256_set1_ps(-INFINITY), bad = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    mn = _mm256_min_ps(mn, v);
    mx = _mm256_max_ps(mx, v);
    bad = _mm256_add_ps(bad, _mm256_sub_ps(v, v));
  }
  float lanes[3][8];
  _mm256_storeu_ps(lanes[0], mn);
  _mm256_storeu_ps(lanes[1], mx);
  _mm256_storeu_ps(lanes[2], bad);
  merge_lanes(lanes[0], lanes[1], lanes[2], 8, r);
  range_scalar(x + i, n - i, r);  // the tail
}

Range input_range(const float* x, int64_t n) {
  const support::Isa isa = support::selected_isa();
  auto kernel = isa == support::Isa::Avx512 ? &range_avx512 : isa == support::Isa::Avx2 ? &range_avx2 : &range_scalar;
  Range all;
  if (n < 65536) {  // inline, as quantize
    kernel(x, n, all);
    return all;
  }
  std::vector<Range> per_thread(at::get_num_threads());
  at::parallel_for(0, n, 65536, [&](int64_t b, int64_t e) {
    Range r;
    kernel(x + b, e - b, r);
    per_thread.at(at::get_thread_num()).merge(r);
  });
  for (const Range& r : per_thread) all.merge(r);
  return all;
}

struct QParams {
  float scale = 1.f;
  int32_t zero_point = 0;
  bool finite = true;
};

// Per-tensor asymmetric parameters of the contiguous `x` (the range always includes 0, so 0 is
// exact).
QParams input_qparams(const float* x, int64_t n) {
  QParams p;
  const Range r = input_range(x, n);
  if (!r.finite) {
    p.finite = false;
    return p;
  }
  const float mn = std::min(r.mn, 0.f), mx = std::max(r.mx, 0.f);
  if (mx - mn > 0.f) {
    p.scale = (mx - mn) / 255.f;
    p.zero_point = static_cast<int32_t>(std::min(std::max(std::nearbyint(-mn / p.scale), 0.f), 255.f));
  }
  return p;
}

// The largest weight magnitude. Without VNNI, oneDNN's int8 GEMM multiplies with vpmaddubsw,
// which adds two uint8 x int8 products into an int16 with saturation: 2 x 255 x 127 overflows it
// (a Linear of M1 then errs by 9% instead of 1%). Weights in [-63, 63] cannot (2 x 255 x 63 =
// 32130), at less cost in accuracy than 7-bit inputs (measured on M1: 1.35% against 1.9%; 8-bit
// weights with VNNI: 1.1%), which is PyTorch's `reduce_range` for the same reason.
float int8_weight_max() {
  static const float max = [] {
    const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    const bool avx512_vnni = (isa & 0x67u) == 0x67u, avx2_vnni = (isa & 0x407u) == 0x407u;
    return avx512_vnni || avx2_vnni ? 127.f : 63.f;
  }();
  return max;
}

// Whether bfloat16 GEMMs run natively: the CPU has the instructions (support::cpu_has_bf16,
// which follows TORCHCOMPILE_ISA) and oneDNN uses them (ONEDNN_MAX_CPU_ISA may forbid it).
bool bf16_native() {
  static const bool onednn_bf16 = (static_cast<unsigned>(dnnl_get_effective_cpu_isa()) & 0xe7u) == 0xe7u;
  return onednn_bf16 && support::cpu_has_bf16();
}

// ---- primitives: one per (kind, K, N, bias), any number of rows ----------------------------------

struct Prim {
  dnnl::primitive prim;  // a matmul, or (int8 at fixed rows, oneDNN 2) a convolution
  md_t wei_md;           // the packed weight's layout
  md_t scratch_md;
  md_t src_md, dst_md, user_wei_md;  // fixed rows: the operands as it takes them, the weight (N, K) as plain
};

std::shared_ptr<const Prim> primitive(Kind kind, int64_t K, int64_t N, bool has_bias) {
  static std::mutex mutex;
  // oneDNN fixes a primitive's number of threads when it is created: one per intra-op count.
  static std::map<std::tuple<int, int64_t, int64_t, bool, int>, std::shared_ptr<const Prim>> cache;
  const auto key = std::make_tuple(static_cast<int>(kind), K, N, has_bias, at::get_num_threads());
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const dt in = kind == Kind::Int8 ? dt::u8 : dt::bf16, wt = kind == Kind::Int8 ? dt::s8 : dt::bf16;
  dnnl::primitive_attr attr = user_scratchpad_attr();
  if (kind == Kind::Int8) compat::set_int8_dynamic_scales(attr);
  const md_t src({DNNL_RUNTIME_DIM_VAL, K}, in, tag::ab), wei({K, N}, wt, tag::any),
      dst({DNNL_RUNTIME_DIM_VAL, N}, dt::f32, tag::ab);
  const md_t bias = has_bias ? md_t({1, N}, dt::f32, tag::ab) : md_t();
  auto pd = compat::matmul_pd(cpu_engine(), src, wei, bias, dst, attr);
  TORCH_CHECK(!is_ref_impl(pd.impl_info_str()), "oneDNN has only its reference implementation of a ",
              kind == Kind::Int8 ? "uint8 x int8" : "bfloat16", " matmul on this CPU (", pd.impl_info_str(), ")");
  auto p = std::make_shared<Prim>();
  p->prim = dnnl::matmul(pd);
  p->wei_md = pd.weights_desc();
  p->scratch_md = pd.scratchpad_desc();
  cache.emplace(key, p);
  return p;
}

// ---- at a fixed number of rows: int8 as a 1x1 convolution, bfloat16 as a matmul -----------------

// At most this many numbers of rows get a primitive of their own per weight shape (each holds
// generated code): a server whose batches take every size up to 64 gets one for each, while
// sizes that vary without bound (tokens of variable-length batches) leave the later ones on the
// run-time-rows matmul.
constexpr size_t kMaxRowCounts = 64;

// One per (kind, K, N, rows, bias, thread count); null where oneDNN has only a reference kernel or
// the shape has kMaxRowCounts already (the run-time-rows matmul then serves these rows too).
std::shared_ptr<const Prim> rows_primitive(Kind kind, int64_t K, int64_t N, int64_t M, bool has_bias) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int64_t, int64_t, int64_t, bool, int>, std::shared_ptr<const Prim>> cache;
  static std::map<std::tuple<int, int64_t, int64_t, bool, int>, size_t> row_counts;
  const auto key = std::make_tuple(static_cast<int>(kind), K, N, M, has_bias, at::get_num_threads());
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  size_t& counts = row_counts[std::make_tuple(static_cast<int>(kind), K, N, has_bias, at::get_num_threads())];
  if (counts >= kMaxRowCounts) return nullptr;
  ++counts;
  dnnl::primitive_attr attr = user_scratchpad_attr();
  std::shared_ptr<Prim> p = std::make_shared<Prim>();
  std::string impl;
  auto keep = [&](const auto& pd, const md_t& user_wei) {
    impl = pd.impl_info_str();
    p->wei_md = pd.weights_desc();
    p->scratch_md = pd.scratchpad_desc();
    p->src_md = pd.src_desc();
    p->dst_md = pd.dst_desc();
    p->user_wei_md = user_wei;
  };
  const dt in = kind == Kind::Int8 ? dt::u8 : dt::bf16, wt = kind == Kind::Int8 ? dt::s8 : dt::bf16,
           out = kind == Kind::Int8 ? dt::s32 : dt::f32;  // int8: sums, made float32 by dequantize()
  if (kind == Kind::Int8) compat::set_runtime_src_zero_point(attr);
  if (kind == Kind::Int8 && compat::kInt8RowsAsConvolution) {
    // The (M, K) source as an NHWC image of 1 x M pixels, the (M, N) sums likewise.
    auto pd = compat::conv_forward_pd(cpu_engine(), dnnl::prop_kind::forward_inference,
                                      dnnl::algorithm::convolution_direct, md_t({1, K, 1, M}, in, tag::nhwc),
                                      md_t({N, K, 1, 1}, wt, tag::any), md_t(), md_t({1, N, 1, M}, out, tag::nhwc),
                                      {1, 1}, {0, 0}, {0, 0}, {0, 0}, attr);
    keep(pd, md_t({N, K, 1, 1}, wt, tag::oihw));
    p->prim = dnnl::convolution_forward(pd);
  } else {
    const md_t bias = has_bias && kind != Kind::Int8 ? md_t({1, N}, dt::f32, tag::ab) : md_t();
    auto pd = compat::matmul_pd(cpu_engine(), md_t({M, K}, in, tag::ab), md_t({K, N}, wt, tag::any), bias,
                                md_t({M, N}, out, tag::ab), attr);
    keep(pd, md_t({K, N}, wt, dims{1, K}));
    p->prim = dnnl::matmul(pd);
  }
  if (is_ref_impl(impl.c_str())) p.reset();
  cache.emplace(key, p);
  return p;
}

// ---- packed weights -----------------------------------------------------------------------------

struct PackedWeight {
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> storage;  // identity, held weakly
  int64_t version = -1;      // -1: an inference tensor (no version counter): compared by copy
  at::Tensor snapshot;       // a copy of the weight, compared at each call, when defined
  bool nonfinite = false;    // the weight holds a NaN or an infinity: compute in float32
  std::shared_ptr<const Prim> prim;
  at::Tensor packed;         // int8 / bf16 bytes in prim->wei_md, or (emulated) the rounded fp32 weight
  std::vector<float> scales; // int8: per output channel
  Kind kind = Kind::Int8;
  bool has_bias = false;
  at::Tensor plain;          // the int8 / bf16 weight (N, K), packed again for the fixed-rows kernels

  // The numbers of rows called so far, and the weight packed for the kernels of those called more
  // than once (one copy per layout they want).
  struct Fixed {
    std::shared_ptr<const Prim> prim;
    const void* packed = nullptr;
  };
  Fixed fixed_rows(int64_t M) const;

 private:
  mutable std::mutex fixed_mutex_;
  mutable std::set<int64_t> rows_called_;
  mutable std::vector<std::pair<md_t, at::Tensor>> layouts_;
};

PackedWeight::Fixed PackedWeight::fixed_rows(int64_t M) const {
  std::lock_guard<std::mutex> lock(fixed_mutex_);
  if (!plain.defined() || rows_called_.insert(M).second) return {};  // the first call at M: the matmul
  Fixed f;
  f.prim = rows_primitive(kind, plain.size(1), plain.size(0), M, has_bias);
  if (!f.prim) return {};
  for (const auto& [md, bytes] : layouts_)
    if (md == f.prim->wei_md) f.packed = bytes.data_ptr();
  if (!f.packed) {
    at::Tensor bytes = at::empty({static_cast<int64_t>(f.prim->wei_md.get_size()) + 64}, at::kByte);
    reorder_now(f.prim->user_wei_md, plain.data_ptr(), f.prim->wei_md, bytes.data_ptr());
    layouts_.emplace_back(f.prim->wei_md, bytes);
    f.packed = bytes.data_ptr();
  }
  return f;
}

// The weight's memory and layout, the kind of pack and the intra-op thread count (the packed
// layout is the primitive's, made per count).
using WeightKey = std::tuple<const c10::StorageImpl*, int64_t, std::vector<int64_t>, std::vector<int64_t>, int, int>;

// Whether LibTorch may write `w` without bumping its version: an optimizer's step writes a
// parameter that has a gradient through `p.data()`.
bool may_change_unversioned(const at::Tensor& w) {
  if (w.is_inference()) return true;
  if (w.grad().defined()) return true;
  if (!w.is_view()) return false;
  const at::Tensor base(w._base());
  return base.defined() && base.grad().defined();
}

std::shared_ptr<const PackedWeight> pack(const at::Tensor& w, Kind kind, bool has_bias) {
  auto p = std::make_shared<PackedWeight>();
  p->storage.emplace(w.storage().getWeakStorageImpl());
  p->version = w.is_inference() ? -1 : static_cast<int64_t>(w._version());
  if (may_change_unversioned(w)) p->snapshot = w.clone();
  const int64_t N = w.size(0), K = w.size(1);
  p->nonfinite = !at::isfinite(w).all().item<bool>();
  if (p->nonfinite) return p;
  at::NoGradGuard no_grad;
  if (kind == Kind::Bf16Emulated) {
    p->packed = w.to(at::kBFloat16).to(at::kFloat).contiguous();
    return p;
  }
  p->prim = primitive(kind, K, N, has_bias);
  at::Tensor plain;  // (N, K) contiguous, read as the (K, N) weight with strides (1, K)
  dt wt;
  if (kind == Kind::Int8) {
    const at::Tensor amax = w.abs().amax(1).clamp_min(1e-30f);
    const float qmax = int8_weight_max();
    const at::Tensor scale = amax / qmax;
    plain = at::clamp(at::round(w / scale.unsqueeze(1)), -qmax, qmax).to(at::kChar).contiguous();
    const at::Tensor s = scale.contiguous();
    p->scales.assign(s.data_ptr<float>(), s.data_ptr<float>() + N);
    wt = dt::s8;
  } else {
    plain = w.to(at::kBFloat16).contiguous();
    wt = dt::bf16;
  }
  p->kind = kind;
  p->has_bias = has_bias;
  p->plain = plain;
  const md_t user({K, N}, wt, dims{1, K});
  p->packed = at::empty({static_cast<int64_t>(p->prim->wei_md.get_size()) + 64}, at::kByte);
  reorder_now(user, plain.data_ptr(), p->prim->wei_md, p->packed.data_ptr());
  return p;
}

bool current(const PackedWeight& p, const at::Tensor& w) {
  if (p.storage->expired()) return false;
  if (p.version != (w.is_inference() ? -1 : static_cast<int64_t>(w._version()))) return false;
  if (p.snapshot.defined()) return at::equal(p.snapshot, w);
  return !may_change_unversioned(w);  // a gradient appeared since packing: compare from now on
}

std::shared_ptr<const PackedWeight> packed_weight(const at::Tensor& w, Kind kind, bool has_bias) {
  static std::mutex mutex;
  static std::map<WeightKey, std::shared_ptr<const PackedWeight>> cache;
  WeightKey key{w.storage().unsafeGetStorageImpl(), w.storage_offset(), w.sizes().vec(), w.strides().vec(),
                static_cast<int>(kind) * 2 + (has_bias ? 1 : 0), at::get_num_threads()};
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end() && current(*it->second, w)) return it->second;
  }
  auto p = pack(w, kind, has_bias);
  std::lock_guard<std::mutex> lock(mutex);
  for (auto it = cache.begin(); it != cache.end();)  // weights that no longer exist
    it = it->second->storage->expired() ? cache.erase(it) : std::next(it);
  cache[key] = p;
  return p;
}

// ---- the operators ------------------------------------------------------------------------------

void check_args(const char* op, const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, op,
              ": expected float32 input and weight, got ", x.scalar_type(), " and ", w.scalar_type());
  TORCH_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1), op,
              ": expected an input (..., K) and a weight (N, K), got ", x.sizes(), " and ", w.sizes());
  TORCH_CHECK(!b || !b->defined() || (b->dim() == 1 && b->size(0) == w.size(0) && b->scalar_type() == at::kFloat),
              op, ": expected a float32 bias of ", w.size(0), " elements, got ", b && b->defined() ? b->sizes() : at::IntArrayRef{});
}

dnnl::stream& stream() {
  thread_local dnnl::stream s(cpu_engine());
  return s;
}

struct Gemm {
  at::Tensor x2, out;  // (M, K) contiguous source, (M, N) result
  std::vector<int64_t> out_sizes;
  int64_t M = 0, K = 0, N = 0;
};

Gemm prepare(const at::Tensor& x, const at::Tensor& w) {
  Gemm g;
  g.K = w.size(1);
  g.N = w.size(0);
  g.x2 = x.contiguous().view({-1, g.K});
  g.M = g.x2.size(0);
  g.out_sizes = x.sizes().vec();
  g.out_sizes.back() = g.N;
  g.out = at::empty({g.M, g.N}, x.options());
  return g;
}

// Runs `prim` into `out`: (M, N) float32, or the int32 sums of a fixed-rows int8 primitive, which
// says so by its own destination layout (`dst_md`).
void run(const Prim& prim, const md_t& src_md, void* src, void* wei, const at::Tensor& out, const float* bias,
         ExecArgs& args, std::vector<dnnl::memory>& keep) {
  const int64_t M = out.size(0), N = out.size(1);
  keep.emplace_back(src_md, cpu_engine(), src);
  args.add(DNNL_ARG_SRC, keep.back());
  keep.emplace_back(prim.wei_md, cpu_engine(), wei);
  args.add(DNNL_ARG_WEIGHTS, keep.back());
  if (bias) {
    keep.emplace_back(md_t({1, N}, dt::f32, tag::ab), cpu_engine(), const_cast<float*>(bias));
    args.add(DNNL_ARG_BIAS, keep.back());
  }
  const bool own_dst = !compat::dims_of(prim.dst_md).empty();
  keep.emplace_back(own_dst ? prim.dst_md : md_t({M, N}, dt::f32, tag::ab), cpu_engine(), out.data_ptr());
  args.add(DNNL_ARG_DST, keep.back());
  at::Tensor scratch;
  if (prim.scratch_md.get_size()) {
    scratch = at::empty({static_cast<int64_t>(prim.scratch_md.get_size())}, at::kByte);
    keep.emplace_back(prim.scratch_md, cpu_engine(), scratch.data_ptr());
    args.add(DNNL_ARG_SCRATCHPAD, keep.back());
  }
  dnnl::error::wrap_c_api(dnnl_primitive_execute(prim.prim.get(), stream().get(), args.n, args.a),
                          "could not execute a reduced-precision GEMM");
}

// ---- int32 sums to the float32 result: y = float(sum) * scale[n] + bias[n], in place ---------------

void dequantize_scalar(float* y, int64_t rows, int64_t N, const float* scale, const float* bias) {
  for (int64_t m = 0; m < rows; ++m, y += N)
    for (int64_t n = 0; n < N; ++n) {
      int32_t sum;
      std::memcpy(&sum, y + n, sizeof sum);  // the int32 the GEMM wrote there
      y[n] = static_cast<float>(sum) * scale[n] + (bias ? bias[n] : 0.f);
    }
}

#pragma GCC diagnostic push  // as quantize_avx512
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) void dequantize_avx512(float* y, int64_t rows, int64_t N, const float* scale,
                                                          const float* bias) {
  for (int64_t m = 0; m < rows; ++m, y += N) {
    int64_t n = 0;
    for (; n + 16 <= N; n += 16) {
      __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(y + n)), _mm512_loadu_ps(scale + n));
      if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + n));
      _mm512_storeu_ps(y + n, v);
    }
    dequantize_scalar(y + n, 1, N - n, scale + n, bias ? bias + n : nullptr);  // the tail
  }
}
#pragma GCC diagnostic pop

__attribute__((target("avx2"))) void dequantize_avx2(float* y, int64_t rows, int64_t N, const float* scale,
                                                     const float* bias) {
  for (int64_t m = 0; m < rows; ++m, y += N) {
    int64_t n = 0;
    for (; n + 8 <= N; n += 8) {
      const __m256i acc = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + n));
      __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_loadu_ps(scale + n));
      if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + n));
      _mm256_storeu_ps(y + n, v);
    }
    dequantize_scalar(y + n, 1, N - n, scale + n, bias ? bias + n : nullptr);  // the tail
  }
}

void dequantize(float* y, int64_t M, int64_t N, const float* scale, const float* bias) {
  const support::Isa isa = support::selected_isa();
  auto kernel = isa == support::Isa::Avx512 ? &dequantize_avx512
                : isa == support::Isa::Avx2 ? &dequantize_avx2
                                            : &dequantize_scalar;
  // Inline below ~64 Ki elements, as quantize.
  at::parallel_for(0, M, std::max<int64_t>(1, 65536 / std::max<int64_t>(N, 1)),
                   [&](int64_t b, int64_t e) { kernel(y + b * N, e - b, N, scale, bias); });
}

// The GEMM at rows seen before: it writes int32 sums into `g.out`, made float32 here.
void run_fixed_rows(const PackedWeight::Fixed& f, const Gemm& g, const at::Tensor& q, const QParams& qp,
                    const PackedWeight& pw, const c10::optional<at::Tensor>& b) {
  ExecArgs args;
  std::vector<dnnl::memory> keep;
  keep.reserve(6);
  int32_t zero_point = qp.zero_point;
  keep.emplace_back(md_t({1}, dt::s32, tag::a), cpu_engine(), &zero_point);
  args.add(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, keep.back());
  run(*f.prim, f.prim->src_md, q.data_ptr(), const_cast<void*>(f.packed), g.out, nullptr, args, keep);
  std::vector<float> scale(pw.scales.size());
  for (size_t n = 0; n < scale.size(); ++n) scale[n] = qp.scale * pw.scales[n];
  const at::Tensor bias = b && b->defined() ? b->contiguous() : at::Tensor();
  dequantize(g.out.data_ptr<float>(), g.M, g.N, scale.data(), bias.defined() ? bias.data_ptr<float>() : nullptr);
}

at::Tensor linear_int8_dynamic(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b) {
  check_args("torchcompile::linear_int8_dynamic", x, w, b);
  const bool has_bias = b && b->defined();
  if (x.numel() == 0) return at::linear(x, w, b);
  auto pw = packed_weight(w, Kind::Int8, has_bias);
  if (pw->nonfinite) return at::linear(x, w, b);  // NaN / infinity: as eager
  Gemm g = prepare(x, w);
  const QParams qp = input_qparams(g.x2.data_ptr<float>(), g.M * g.K);
  if (!qp.finite) return at::linear(x, w, b);
  at::Tensor q = at::empty({g.M, g.K}, x.options().dtype(at::kByte));
  quantize(g.x2.data_ptr<float>(), q.data_ptr<uint8_t>(), g.M * g.K, 1.f / qp.scale, static_cast<float>(qp.zero_point));
  if (const PackedWeight::Fixed f = pw->fixed_rows(g.M); f.prim) {
    run_fixed_rows(f, g, q, qp, *pw, b);
    return g.out.view(g.out_sizes);
  }
  // Scales and zero point as oneDNN's version takes them (dnnl_compat.h).
  compat::Int8Scales sc(qp.scale, pw->scales, qp.zero_point, has_bias ? b->contiguous() : at::Tensor());
  ExecArgs args;
  std::vector<dnnl::memory> keep;
  keep.reserve(10);
  sc.add_args(args, keep, cpu_engine());
  run(*pw->prim, md_t({g.M, g.K}, dt::u8, tag::ab), q.data_ptr(), pw->packed.data_ptr(), g.out, sc.bias(), args, keep);
  return g.out.view(g.out_sizes);
}

at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b, bool emulate) {
  check_args("torchcompile::linear_bf16", x, w, b);
  const bool has_bias = b && b->defined();
  if (x.numel() == 0) return at::linear(x, w, b);
  const bool native = !emulate && bf16_native();
  auto pw = packed_weight(w, native ? Kind::Bf16 : Kind::Bf16Emulated, has_bias);
  if (pw->nonfinite) return at::linear(x.to(at::kBFloat16).to(at::kFloat), w, b);
  if (!native) return at::linear(x.to(at::kBFloat16).to(at::kFloat), pw->packed, b);
  Gemm g = prepare(x, w);
  const at::Tensor xb = g.x2.to(at::kBFloat16);
  const at::Tensor bias = has_bias ? b->contiguous() : at::Tensor();
  ExecArgs args;
  std::vector<dnnl::memory> keep;
  keep.reserve(8);
  const PackedWeight::Fixed f = pw->fixed_rows(g.M);
  run(f.prim ? *f.prim : *pw->prim, md_t({g.M, g.K}, dt::bf16, tag::ab), xb.data_ptr(),
      f.prim ? const_cast<void*>(f.packed) : pw->packed.data_ptr(), g.out, has_bias ? bias.data_ptr<float>() : nullptr,
      args, keep);
  return g.out.view(g.out_sizes);
}

// Shapes only (meta tensors: dynamic shapes and packages run graphs on them).
at::Tensor linear_meta(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b) {
  check_args("torchcompile linear", x, w, b);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  return at::empty(sizes, x.options());
}

int64_t int8_weight_max_op() { return static_cast<int64_t>(int8_weight_max()); }

at::Tensor linear_bf16_meta(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b, bool) {
  return linear_meta(x, w, b);
}

}  // namespace
}  // namespace torchcompile::backends::onednn::detail

TORCH_LIBRARY_FRAGMENT(torchcompile, m) {
  m.def("linear_int8_dynamic(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor");
  m.def("linear_bf16(Tensor input, Tensor weight, Tensor? bias=None, bool emulate=False) -> Tensor");
  // The largest int8 weight magnitude on this CPU: 127, or 63 without VNNI (int8_weight_max).
  m.def("int8_weight_max() -> int", &torchcompile::backends::onednn::detail::int8_weight_max_op);
  // Whether linear_bf16 runs natively here (else it must be asked to emulate).
  m.def("bf16_native() -> bool", &torchcompile::backends::onednn::detail::bf16_native);
}

TORCH_LIBRARY_IMPL(torchcompile, CPU, m) {
  m.impl("linear_int8_dynamic", &torchcompile::backends::onednn::detail::linear_int8_dynamic);
  m.impl("linear_bf16", &torchcompile::backends::onednn::detail::linear_bf16);
}

TORCH_LIBRARY_IMPL(torchcompile, Meta, m) {
  m.impl("linear_int8_dynamic", &torchcompile::backends::onednn::detail::linear_meta);
  m.impl("linear_bf16", &torchcompile::backends::onednn::detail::linear_bf16_meta);
}
