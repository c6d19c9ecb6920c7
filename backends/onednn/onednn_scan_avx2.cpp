// The onednn backend's NaN / infinity scan for avx2 (compiler flags in CMakeLists.txt).
#define TC_ONEDNN_SCAN_KERNELS scan_kernels_avx2
#define TC_ONEDNN_SCAN_NAME "avx2"
#include "onednn_scan_impl.h"
