// The instruction set a backend's own kernels run with: the best this CPU has, or the one
// TORCHCOMPILE_ISA asks for. One setting for every backend that compiles its kernels once per ISA
// (the `fused` tile kernels, the `onednn` backend's NaN/infinity scan); a plugin may follow it too.
#pragma once

namespace torchcompile::support {

/// The instruction sets kernels are compiled for.
enum class Isa { Avx512, Avx2, Sse2 };

/// "avx512", "avx2" or "scalar (sse2)".
const char* to_string(Isa isa);

/// Whether this CPU runs `isa` (AVX-512: F, DQ, BW, VL and FMA; AVX2: AVX2 and FMA).
bool cpu_has(Isa isa);

/// The best ISA this CPU runs (cpuid), unless TORCHCOMPILE_ISA (`avx512`, `avx2`, `scalar` or
/// `sse2`) asks for another; asking for one the CPU lacks, or an unknown name, is an error
/// (c10::Error). Read at each call: callers keep the ISA of what they built with it.
Isa selected_isa();

/// Whether bfloat16 GEMMs run natively: the CPU has AVX512-BF16 or AMX-BF16 (cpuid) and the
/// selected ISA is avx512 (so TORCHCOMPILE_ISA=avx2 makes a BF16 CPU answer false).
bool cpu_has_bf16();

}  // namespace torchcompile::support
