// Accuracy of backends/fused/vecmath.h in ULP, per function and per ISA the CPU has (the others are skipped), against
// double-precision references rounded nowhere: the error of a result r for the input x is
// |r - ref(x)| / ulp(ref(x)), ulp being the spacing of floats at ref(x) (2^-149 in the denormal range), so a correctly
// rounded result is within 0.5. Special inputs (+-0, +-inf, NaN) and results that overflow must match exactly (signed
// zeros included, any NaN for NaN).
//
// Inputs: every 409th float bit pattern (10.5 million values over both signs, denormals, infinities and NaNs; the
// stride can be set with TORCHCOMPILE_VECMATH_STRIDE, 1 for all 2^32 floats), plus special values, the neighbourhoods
// of each function's thresholds and split points, and for sin and cos the floats nearest to k pi/2 for every k up to
// 1e5 (and sparser up to 5e7) and a dense sweep of [1e4, 1e5].
//
// Running the whole binary prints the table of maximum errors as Markdown (to stdout, and to the file named by
// TORCHCOMPILE_VECMATH_TABLE if set), and the speed of each function next to std:: (information, not an assertion).
#include "vecmath_ulp_impl.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace {

using namespace tc_vecmath_test;

// ---- ISAs -----------------------------------------------------------------------------------------------------------
enum Isa : int { kAvx512, kAvx2, kSse2, kIsaCount };
const char* isa_name(int isa) {
  static const char* const names[kIsaCount] = {"avx512", "avx2", "sse2"};
  return names[isa];
}
bool isa_supported(int isa) {
  __builtin_cpu_init();
  switch (isa) {
    case kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case kAvx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    default: return true;
  }
}
using ApplyFn = void (*)(int, const float*, float*, int64_t);
ApplyFn apply_of(int isa) {
  static const ApplyFn fns[kIsaCount] = {tc_vecmath_apply_avx512, tc_vecmath_apply_avx2, tc_vecmath_apply_sse2};
  return fns[isa];
}

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// ---- references (double) and the bounds asserted --------------------------------------------------------------------
double sigmoid_ref(double x) { return 1 / (1 + std::exp(-x)); }
double silu_ref(double x) { return x / (1 + std::exp(-x)); }                   // NaN at -inf (-inf / inf), as ATen's
double gelu_erf_ref(double x) { return 0.5 * x * std::erfc(-x * M_SQRT1_2); }  // erfc: no cancellation for x < 0
double gelu_tanh_ref(double x) {  // x/2 (1 + tanh(u)) = x sigmoid(2u), without cancellation for x < 0
  const double u = std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x);
  return x / (1 + std::exp(-2 * u));
}

// gelu and silu go to 0 as x -> -inf, where a relative error can blow up: their ULP error is reported where the
// implementation keeps relative accuracy (for gelu-erf, computed by ATen's formula x/2 (1 + erf(x / sqrt 2)) whose
// 1 + erf cancels for x < 0, over x >= 0; for gelu-tanh and silu everywhere), and their absolute error over x < 0.
constexpr double kInf = std::numeric_limits<double>::infinity();

struct FnSpec {
  double (*ref)(double);
  double bound_ulp;  // asserted maximum error in ULP, over the inputs x >= ulp_from
  double ulp_from;
  double abs_below;  // the absolute error is measured for x < abs_below (-inf: not measured)
  double bound_abs;  // asserted maximum absolute error there
};
// The ULP bounds are the exhaustive maxima (over all 2^32 floats, AVX-512 and SSE2 builds, measured while writing
// vecmath.h) rounded up to the next half ULP with at least 0.1 ULP to spare. The absolute bounds for x < 0 of
// gelu-tanh and silu follow from them (|silu(x)| < 0.28 for x < 0: 3.5 ULP < 1.1e-7); gelu-erf's is its exhaustive
// maximum (9.61e-7, SSE2) rounded up.
const FnSpec& spec(int fn) {
  static const FnSpec specs[kFnCount] = {
      /* exp */ {[](double x) { return std::exp(x); }, 1.5, -kInf, -kInf, 0},
      /* expm1 */ {[](double x) { return std::expm1(x); }, 2, -kInf, -kInf, 0},
      /* log */ {[](double x) { return std::log(x); }, 1, -kInf, -kInf, 0},
      /* log1p */ {[](double x) { return std::log1p(x); }, 1.5, -kInf, -kInf, 0},
      /* tanh */ {[](double x) { return std::tanh(x); }, 7, -kInf, -kInf, 0},
      /* sigmoid */ {sigmoid_ref, 2.5, -kInf, -kInf, 0},
      /* erf */ {[](double x) { return std::erf(x); }, 7.5, -kInf, -kInf, 0},
      /* sin */ {[](double x) { return std::sin(x); }, 2, -kInf, -kInf, 0},
      /* cos */ {[](double x) { return std::cos(x); }, 2, -kInf, -kInf, 0},
      /* gelu_erf */ {gelu_erf_ref, 4, 0, 0, 1.1e-6},
      /* gelu_tanh */ {gelu_tanh_ref, 4, -kInf, 0, 1.1e-7},
      /* silu */ {silu_ref, 3.5, -kInf, 0, 1.1e-7},
  };
  return specs[fn];
}

// ---- inputs ---------------------------------------------------------------------------------------------------------
// Every stride-th float bit pattern: 409 (a prime, so that all exponents and mantissa bits move) unless
// TORCHCOMPILE_VECMATH_STRIDE says otherwise; 1 checks all 2^32 floats (about a minute per function and ISA).
uint64_t stride() {
  static const uint64_t s = [] {
    const char* e = std::getenv("TORCHCOMPILE_VECMATH_STRIDE");
    const long long v = e ? std::atoll(e) : 0;
    return v > 0 ? static_cast<uint64_t>(v) : uint64_t{409};
  }();
  return s;
}
constexpr float kTrigVectorMax = 5.0e7f;  // vecmath's kTrigMax: sin and cos go to std:: beyond

void add_neighbours(std::vector<float>& v, float x, int k) {  // x and k floats on each side, both signs
  for (float s : {x, -x}) {
    const uint32_t b = bits_of(s);
    for (int d = -k; d <= k; ++d) v.push_back(from_bits(b + static_cast<uint32_t>(d)));
  }
}

// The inputs besides the strided bit patterns.
const std::vector<float>& extra_inputs() {
  static const std::vector<float> v = [] {
    std::vector<float> v;
    // Special values.
    for (float x :
         {0.f, INFINITY, NAN, FLT_MIN, FLT_MAX, FLT_TRUE_MIN, 1.f, 0.5f, 2.f, 3.f, 10.f, 100.f, 1e10f, 1e30f}) {
      v.push_back(x);
      v.push_back(-x);
    }
    v.push_back(from_bits(0x7f800001));  // signalling NaN
    v.push_back(from_bits(0xffc00001));  // negative quiet NaN with a payload
    // Thresholds and split points, with 16 floats on each side: exp overflow (ln FLT_MAX), n = 128, exp reaching the
    // normal range and 0, the clamps, expm1 reaching -1, tanh reaching 1, erf's clamp and saturation, gelu's clamp
    // (5.8), ln2 / 2 (reduction), log's mantissa interval ends, the denormal edge, 2^-25 (expm1's identity).
    for (float x :
         {88.7228394f,  88.3762589f,  87.3365479f,  103.972076f,  104.f,       89.f,        132.5f, 17.3286800f,
          18.f,         9.01f,        9.02f,        0.875f,       3.93f,       3.91920590f, 4.f,    5.8f,
          0.346573591f, 0.414213568f, 0.292893219f, 0.707106769f, 1.41421354f, 0.375f,      1.f,    0.5f,
          2.f,          FLT_MIN,      0x1p-25f,     0x1p-24f,     1e-10f,      FLT_MAX}) {
      add_neighbours(v, x, 16);
    }
    // sin / cos: the floats nearest k pi/2 (and 2 on each side) for every k up to 1e5 and every 997th up to 5e7.
    for (int64_t k = 1; k * M_PI_2 < kTrigVectorMax; k += (k * M_PI_2 < 1e5 ? 1 : 997)) {
      add_neighbours(v, static_cast<float>(static_cast<double>(k) * M_PI_2), 2);
    }
    // ... and every 37th float of [1e4, 1e5], both signs.
    for (uint32_t b = bits_of(1e4f); b <= bits_of(1e5f); b += 37) {
      v.push_back(from_bits(b));
      v.push_back(-from_bits(b));
    }
    return v;
  }();
  return v;
}

int64_t input_count() {
  return static_cast<int64_t>(((uint64_t{1} << 32) + stride() - 1) / stride() + extra_inputs().size());
}

// Calls f(inputs) chunk by chunk: the strided bit patterns, then the extra inputs.
template <class F>
void for_each_chunk(F f) {
  constexpr size_t kChunk = size_t{1} << 22;
  std::vector<float> chunk;
  chunk.reserve(kChunk);
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += stride()) {
    chunk.push_back(from_bits(static_cast<uint32_t>(b)));
    if (chunk.size() == kChunk) {
      f(chunk);
      chunk.clear();
    }
  }
  if (!chunk.empty()) f(chunk);
  f(extra_inputs());
}

// ---- error measure --------------------------------------------------------------------------------------------------
// Spacing of floats at |y| (y in double, not rounded): 2^(e - 23) for |y| in [2^e, 2^(e+1)), 2^-149 below 2^-126.
double float_ulp(double y) {
  const double a = std::fabs(y);
  if (a < 0x1p-126) return 0x1p-149;
  int e;
  std::frexp(std::min(a, static_cast<double>(FLT_MAX)), &e);  // a = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 24);
}

struct Stats {
  bool measured = false, skipped = false;
  double max_ulp = 0;  // over x >= spec.ulp_from
  float worst_x = 0, worst_r = 0;
  double worst_ref = 0;
  double max_abs = 0;  // over x < spec.abs_below
  float worst_abs_x = 0;
  int64_t ulp_count = 0, mismatches = 0;
  std::vector<std::string> mismatch_examples;
};

std::string fmt_float(double x) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.9g (%a)", x, x);
  return buf;
}

// Adds the errors of out = f(in) to st.
void accumulate(int fn, const std::vector<float>& in, const std::vector<float>& out, Stats& st) {
  const FnSpec& sp = spec(fn);
  st.measured = true;
  auto mismatch = [&](size_t i) {
    ++st.mismatches;
    if (st.mismatch_examples.size() < 12) {
      st.mismatch_examples.push_back("x = " + fmt_float(in[i]) + ": got " + fmt_float(out[i]) + ", expected " +
                                     fmt_float(static_cast<float>(sp.ref(in[i]))));
    }
  };
  for (size_t i = 0; i < in.size(); ++i) {
    const float x = in[i], r = out[i];
    const double y = sp.ref(static_cast<double>(x));
    const float yf = static_cast<float>(y);
    if (std::isnan(y)) {
      if (!std::isnan(r)) mismatch(i);
      continue;
    }
    const bool special = x == 0 || std::isinf(x) || std::isnan(x);
    if (special || std::isinf(yf)) {  // exact, with the sign of zero
      if (!(r == yf && std::signbit(r) == std::signbit(yf))) mismatch(i);
      continue;
    }
    if (!std::isfinite(r)) {
      mismatch(i);
      continue;
    }
    const double diff = std::fabs(static_cast<double>(r) - y);
    if (x < sp.abs_below && diff > st.max_abs) {
      st.max_abs = diff;
      st.worst_abs_x = x;
    }
    if (x >= sp.ulp_from) {
      ++st.ulp_count;
      const double ulps = diff / float_ulp(y);
      if (ulps > st.max_ulp) {
        st.max_ulp = ulps;
        st.worst_x = x;
        st.worst_r = r;
        st.worst_ref = y;
      }
    }
  }
}

// ---- the table ------------------------------------------------------------------------------------------------------
Stats g_stats[kFnCount][kIsaCount];

std::string range_note(int fn, bool abs_row) {
  if (abs_row) return "x < 0";
  const std::string floats =
      stride() == 1 ? "all floats + specials" : "every " + std::to_string(stride()) + "th float + specials";
  switch (fn) {
    case kSin:
    case kCos: return floats + ", near k pi/2, [1e4, 1e5]; std:: beyond 5e7";
    case kGeluErf: return floats + ", x >= 0";
    default: return floats;
  }
}

std::string markdown_table() {
  std::string s;
  char buf[512];
  s += "| function | max ULP (avx512) | max ULP (avx2) | max ULP (sse2) | worst input | range tested |\n";
  s += "| --- | --- | --- | --- | --- | --- |\n";
  for (int fn = 0; fn < kFnCount; ++fn) {
    bool ran = false;  // a partial run (--gtest_filter, ctest) shows its functions only
    for (int isa = 0; isa < kIsaCount; ++isa) ran |= g_stats[fn][isa].measured;
    if (!ran) continue;
    const bool has_abs = spec(fn).abs_below > -kInf;
    for (int row = 0; row < (has_abs ? 2 : 1); ++row) {
      const bool abs_row = row == 1;
      std::string name = fn_name(fn);
      if (has_abs) name += abs_row ? " (abs. error)" : " (ULP)";
      s += "| " + name + " |";
      int worst_isa = -1;
      for (int isa = 0; isa < kIsaCount; ++isa) {
        const Stats& st = g_stats[fn][isa];
        if (!st.measured) {
          s += st.skipped ? " (no CPU support) |" : " (not run) |";
          continue;
        }
        if (abs_row) {
          std::snprintf(buf, sizeof buf, " %.3g |", st.max_abs);
        } else {
          std::snprintf(buf, sizeof buf, " %.3f%s |", st.max_ulp, st.mismatches ? " (special values wrong)" : "");
        }
        s += buf;
        const double e = abs_row ? st.max_abs : st.max_ulp;
        if (worst_isa < 0 || e > (abs_row ? g_stats[fn][worst_isa].max_abs : g_stats[fn][worst_isa].max_ulp)) {
          worst_isa = isa;
        }
      }
      std::string worst = "-";
      if (worst_isa >= 0) {
        const Stats& st = g_stats[fn][worst_isa];
        std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(abs_row ? st.worst_abs_x : st.worst_x));
        worst = buf;
      }
      s += " " + worst + " | " + range_note(fn, abs_row) + " |\n";
    }
  }
  return s;
}

class TableWriter : public ::testing::Environment {
 public:
  void TearDown() override {
    bool any = false, complete = true;
    for (int fn = 0; fn < kFnCount; ++fn) {
      for (int isa = 0; isa < kIsaCount; ++isa) {
        any |= g_stats[fn][isa].measured;
        complete &= g_stats[fn][isa].measured || g_stats[fn][isa].skipped;
      }
    }
    if (!any) return;
    const std::string table = markdown_table();
    std::printf("\nvecmath: maximum error in ULP against double references (%lld inputs per function)\n\n%s\n",
                static_cast<long long>(input_count()), table.c_str());
    const char* path = std::getenv("TORCHCOMPILE_VECMATH_TABLE");
    if (path && *path && complete) std::ofstream(path) << table;  // only a table with every function and ISA
  }
};
const auto* const g_table_writer = ::testing::AddGlobalTestEnvironment(new TableWriter);

// ---- the accuracy tests ---------------------------------------------------------------------------------------------
class VecMathAccuracy : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(VecMathAccuracy, WithinBound) {
  const int fn = std::get<0>(GetParam()), isa = std::get<1>(GetParam());
  if (!isa_supported(isa)) {
    g_stats[fn][isa].skipped = true;
    GTEST_SKIP() << "the CPU lacks " << isa_name(isa);
  }
  Stats st;
  std::vector<float> out;
  for_each_chunk([&](const std::vector<float>& in) {
    out.resize(in.size());
    apply_of(isa)(fn, in.data(), out.data(), static_cast<int64_t>(in.size()));
    accumulate(fn, in, out, st);
  });
  g_stats[fn][isa] = st;

  const FnSpec& sp = spec(fn);
  std::printf("%s/%s: max %.3f ULP at x = %s (got %s, exact %.12g) over %lld inputs", fn_name(fn), isa_name(isa),
              st.max_ulp, fmt_float(st.worst_x).c_str(), fmt_float(st.worst_r).c_str(), st.worst_ref,
              static_cast<long long>(st.ulp_count));
  if (sp.abs_below > -kInf) {
    std::printf("; max abs. error %.3g at x = %s", st.max_abs, fmt_float(st.worst_abs_x).c_str());
  }
  std::printf("\n");
  std::string examples;
  for (const std::string& m : st.mismatch_examples) examples += "  " + m + "\n";
  EXPECT_EQ(st.mismatches, 0) << "special values or overflow wrong, e.g.:\n" << examples;
  EXPECT_LE(st.max_ulp, sp.bound_ulp) << "at x = " << fmt_float(st.worst_x);
  if (sp.abs_below > -kInf) {
    EXPECT_LE(st.max_abs, sp.bound_abs) << "at x = " << fmt_float(st.worst_abs_x);
  }
}

INSTANTIATE_TEST_SUITE_P(VecMath, VecMathAccuracy,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(kFnCount)),
                                            ::testing::Range(0, static_cast<int>(kIsaCount))),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
                           return std::string(fn_name(std::get<0>(info.param))) + "_" +
                                  isa_name(std::get<1>(info.param));
                         });

// ---- speed (printed, not asserted) ----------------------------------------------------------------------------------
float scalar_std(int fn, float x) {
  switch (fn) {
    case kExp: return std::exp(x);
    case kExpm1: return std::expm1(x);
    case kLog: return std::log(x);
    case kLog1p: return std::log1p(x);
    case kTanh: return std::tanh(x);
    case kSigmoid: return 1.f / (1.f + std::exp(-x));
    case kErf: return std::erf(x);
    case kSin: return std::sin(x);
    case kCos: return std::cos(x);
    case kGeluErf: return 0.5f * x * (1.f + std::erf(x * 0.707106781f));
    case kGeluTanh: return 0.5f * x * (1.f + std::tanh(0.797884561f * (x + 0.044715f * x * x * x)));
    case kSilu: return x / (1.f + std::exp(-x));
    default: return x;
  }
}

// Input range for timing each function: where it is typically used.
std::pair<float, float> timing_range(int fn) {
  switch (fn) {
    case kLog: return {1e-3f, 1e3f};
    case kLog1p: return {-0.9f, 1e3f};
    case kSin:
    case kCos: return {-100.f, 100.f};
    case kErf: return {-3.f, 3.f};
    default: return {-10.f, 10.f};
  }
}

template <class F>
double best_ns_per_element(F f, int64_t n) {
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(n));
  }
  return best;
}

TEST(VecMathSpeed, NsPerElement) {
  constexpr int64_t n = 1 << 20;
  std::vector<float> in(n), out(n);
  std::mt19937 rng(12345);
  std::string table = "| function | inputs | avx512 | avx2 | sse2 | std:: (scalar) |\n";
  table += "| --- | --- | --- | --- | --- | --- |\n";
  char buf[256];
  for (int fn = 0; fn < kFnCount; ++fn) {
    const auto [lo, hi] = timing_range(fn);
    std::uniform_real_distribution<float> dist(lo, hi);
    for (float& x : in) x = dist(rng);
    std::snprintf(buf, sizeof buf, "| %s | U[%g, %g] |", fn_name(fn), lo, hi);
    table += buf;
    for (int isa = 0; isa < kIsaCount; ++isa) {
      if (!isa_supported(isa)) {
        table += " - |";
        continue;
      }
      const double ns = best_ns_per_element(
          [&] {
            apply_of(isa)(fn, in.data(), out.data(), n);
            asm volatile("" : : "r"(out.data()) : "memory");
          },
          n);
      std::snprintf(buf, sizeof buf, " %.2f |", ns);
      table += buf;
    }
    const double ns = best_ns_per_element(
        [&] {
          for (int64_t i = 0; i < n; ++i) out[i] = scalar_std(fn, in[i]);
          asm volatile("" : : "r"(out.data()) : "memory");
        },
        n);
    std::snprintf(buf, sizeof buf, " %.2f |\n", ns);
    table += buf;
  }
  std::printf("\nvecmath: ns per element over %lld floats (best of 5)\n\n%s\n", static_cast<long long>(n),
              table.c_str());
}

}  // namespace
