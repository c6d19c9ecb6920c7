// The tile kernels for sse2 (compiler flags in CMakeLists.txt).
#define TC_VEC_BYTES 16
#define TC_ISA_KERNELS isa_kernels_sse2
#include "kernels_impl.h"
