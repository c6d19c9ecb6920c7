// vecmath.h built for AVX-512 (F, DQ, BW, VL) with FMA (the flags are in CMakeLists.txt).
#define TC_VEC_BYTES 64
#define TC_VECMATH_APPLY tc_vecmath_apply_avx512
#include "vecmath_ulp_impl.h"
