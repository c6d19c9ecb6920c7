// The compiled optimizer step's loops for avx512 (compiler flags in src/CMakeLists.txt).
#define TC_OPTIMIZER_KERNELS optimizer_kernels_avx512
#define TC_OPTIMIZER_ISA "avx512"
#include "compile/optimizer_kernels_impl.h"
