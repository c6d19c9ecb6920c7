// The compiled optimizer step's loops for sse2 (compiler flags in src/CMakeLists.txt).
#define TC_OPTIMIZER_KERNELS optimizer_kernels_sse2
#define TC_OPTIMIZER_ISA "scalar (sse2)"
#include "compile/optimizer_kernels_impl.h"
