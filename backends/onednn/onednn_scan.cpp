// Which NaN / infinity scan the onednn backend's graphs use: that of the ISA support::selected_isa()
// picks (the best of this CPU, unless TORCHCOMPILE_ISA asks for one), the same choice as the fused
// backend's kernels.
#include "onednn_scan.h"

#include <torchcompile/support/isa.h>

namespace torchcompile::backends::onednn::detail {

const ScanKernels& selected_scan() {
  switch (support::selected_isa()) {
    case support::Isa::Avx512: return scan_kernels_avx512();
    case support::Isa::Avx2: return scan_kernels_avx2();
    case support::Isa::Sse2: return scan_kernels_sse2();
  }
  return scan_kernels_sse2();
}

}  // namespace torchcompile::backends::onednn::detail
