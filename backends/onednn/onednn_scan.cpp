// Which NaN / infinity scan the onednn backend's graphs use: the best ISA of this CPU, unless
// TORCHCOMPILE_ISA asks for one. The names, the CPU checks and the errors are the fused
// backend's (backends/fused/fused_program.cpp, selected_isa), so that one setting means the
// same to both backends. (Not GCC's target_clones: its ifunc resolver runs before
// ThreadSanitizer's runtime is up and crashes the process.)
#include "onednn_scan.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <string>

namespace torchcompile::backends::onednn::detail {

namespace {

enum class Isa { Avx512, Avx2, Sse2 };

bool cpu_has(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
    case Isa::Avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::Sse2: return true;
  }
  return false;
}

const ScanKernels& kernels_of(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return scan_kernels_avx512();
    case Isa::Avx2: return scan_kernels_avx2();
    case Isa::Sse2: return scan_kernels_sse2();
  }
  return scan_kernels_sse2();
}

Isa selected_isa() {
  const char* env = std::getenv("TORCHCOMPILE_ISA");
  if (!env || !*env) {
    for (Isa isa : {Isa::Avx512, Isa::Avx2})
      if (cpu_has(isa)) return isa;
    return Isa::Sse2;
  }
  const std::string name = env;
  Isa isa;
  if (name == "avx512") {
    isa = Isa::Avx512;
  } else if (name == "avx2") {
    isa = Isa::Avx2;
  } else if (name == "scalar" || name == "sse2") {
    isa = Isa::Sse2;
  } else {
    TORCH_CHECK(false, "TORCHCOMPILE_ISA: expected one of avx512, avx2, scalar (or sse2), got '", name, "'");
  }
  TORCH_CHECK(cpu_has(isa), "TORCHCOMPILE_ISA=", name, ": this CPU does not support it");
  return isa;
}

}  // namespace

const ScanKernels& selected_scan() { return kernels_of(selected_isa()); }

}  // namespace torchcompile::backends::onednn::detail
