// The tile kernels for avx2 (compiler flags in CMakeLists.txt).
#define TC_VEC_BYTES 32
#define TC_ISA_KERNELS isa_kernels_avx2
#include "kernels_impl.h"
