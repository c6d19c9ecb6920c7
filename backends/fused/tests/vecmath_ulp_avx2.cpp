// vecmath.h built for AVX2 with FMA (the flags are in CMakeLists.txt).
#define TC_VEC_BYTES 32
#define TC_VECMATH_APPLY tc_vecmath_apply_avx2
#include "vecmath_ulp_impl.h"
