// support/isa.h: the ISA kernels run with (cpuid, TORCHCOMPILE_ISA). Not GCC's target_clones:
// its ifunc resolver runs before ThreadSanitizer's runtime is up and crashes the process.
#include <torchcompile/support/isa.h>

#include <cpuid.h>

#include <c10/util/Exception.h>

#include <cstdlib>
#include <string>

namespace torchcompile::support {

const char* to_string(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return "avx512";
    case Isa::Avx2: return "avx2";
    case Isa::Sse2: return "scalar (sse2)";
  }
  return "?";
}

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

bool cpu_has_bf16() {
  if (selected_isa() != Isa::Avx512) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool amx_bf16 = (d >> 22) & 1u;
  const unsigned max_sub = a;
  bool avx512_bf16 = false;
  if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) avx512_bf16 = (a >> 5) & 1u;
  return avx512_bf16 || amx_bf16;
}

}  // namespace torchcompile::support
