// The tile kernels for avx512 (compiler flags in CMakeLists.txt).
#define TC_VEC_BYTES 64
#define TC_ISA_KERNELS isa_kernels_avx512
#include "kernels_impl.h"
