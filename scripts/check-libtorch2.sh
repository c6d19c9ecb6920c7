#!/usr/bin/env bash
# Build and test against LibTorch 2.x (Debian 13's 2.6) in a chroot made by
# ../shared/tools/libtorch2-chroot.sh (run its `setup` once per machine, as root).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tool=${LIBTORCH2_CHROOT_TOOL:-$root/../shared/tools/libtorch2-chroot.sh}
cd "$root"
"$tool" run sh -c 'cmake -S . -B build-lt2 -G Ninja -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DTORCHCOMPILE_BUILD_BENCHMARKS=OFF &&
  cmake --build build-lt2 --parallel "$(nproc)" && ctest --test-dir build-lt2 --output-on-failure --label-exclude "tsan|asan|bench"'
