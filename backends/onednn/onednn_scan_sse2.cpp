// The onednn backend's NaN / infinity scan for sse2 (compiler flags in CMakeLists.txt).
#define TC_ONEDNN_SCAN_KERNELS scan_kernels_sse2
#define TC_ONEDNN_SCAN_NAME "scalar (sse2)"
#include "onednn_scan_impl.h"
