// vecmath.h built for the x86-64 baseline, SSE2 (the flags are in CMakeLists.txt).
#define TC_VEC_BYTES 16
#define TC_VECMATH_APPLY tc_vecmath_apply_sse2
#include "vecmath_ulp_impl.h"
