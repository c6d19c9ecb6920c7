// Reduced precision (docs/precision.md): the precisions a compiled graph's Linears may use, and
// whether this build and CPU have them. CompileOptions (runtime/compile_options.h) carries the
// choice; the compile stage's pass (src/compile/precision.cpp) applies it.
#pragma once

#include <string>
#include <vector>

namespace torchcompile {

/// The arithmetic the GEMMs of a compiled graph use (docs/precision.md). Every other op stays
/// float32.
///  - Float32: as written (the default).
///  - Int8Dynamic: each Linear whose weight is a module parameter or buffer is computed in int8:
///    the weight quantized once per output channel (symmetric, int8), the input quantized at
///    each call (per tensor, asymmetric, uint8), int32 accumulation, float32 result. Inference
///    only.
///  - BFloat16: those Linears with bfloat16 inputs and weights and float32 accumulation and
///    result, on CPUs with AVX512-BF16 or AMX; on other CPUs compiling is an error unless
///    `emulate_precision` is set. Inference only.
enum class Precision { Float32, Int8Dynamic, BFloat16 };

/// "float32", "int8-dynamic", "bfloat16".
const char* to_string(Precision p);

/// Why `p` cannot be compiled natively on this machine, or "" if it can: this build has no
/// int8 / bfloat16 kernels (built without oneDNN), the CPU lacks AVX2 (Int8Dynamic), or, for
/// BFloat16, the CPU has neither AVX512-BF16 nor AMX-BF16 (CompileOptions::emulate_precision
/// still allows it, slower).
std::string precision_unavailable(Precision p);

/// What the compile stage's precision pass takes of CompileOptions.
struct PrecisionOptions {
  Precision precision = Precision::Float32;
  std::vector<std::string> keep_float32;  ///< module paths whose Linears stay float32
  bool emulate = false;                   ///< BFloat16 emulated where the CPU lacks it
};

}  // namespace torchcompile
