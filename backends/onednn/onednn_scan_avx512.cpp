// The onednn backend's NaN / infinity scan for avx512 (compiler flags in CMakeLists.txt).
#define TC_ONEDNN_SCAN_KERNELS scan_kernels_avx512
#define TC_ONEDNN_SCAN_NAME "avx512"
#include "onednn_scan_impl.h"
