// The compiled optimizer step's loops for avx2 (compiler flags in src/CMakeLists.txt).
#define TC_OPTIMIZER_KERNELS optimizer_kernels_avx2
#define TC_OPTIMIZER_ISA "avx2"
#include "compile/optimizer_kernels_impl.h"
