#!/usr/bin/env bash
# The model benchmark (scripts/bench-models.sh) against LibTorch 2.x: Debian 13's LibTorch 2.6 and
# oneDNN 3.7, in the chroot scripts/check-libtorch2.sh uses (../shared/tools/libtorch2-chroot.sh;
# run its `setup` once per machine, as root). Builds bench_models in build-lt2 and writes
# test/benchmarks/libtorch2/RESULTS.md. Arguments go to bench-models.sh (e.g. --quick).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tool=${LIBTORCH2_CHROOT_TOOL:-$root/../shared/tools/libtorch2-chroot.sh}
cd "$root"
"$tool" run sh -c 'cmake -S . -B build-lt2 -G Ninja -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DTORCHCOMPILE_BUILD_BENCHMARKS=ON >/dev/null &&
  cmake --build build-lt2 --parallel "$(nproc)" --target bench_models &&
  BUILD_DIR=build-lt2 scripts/bench-models.sh --no-build --no-chart --out-dir test/benchmarks/libtorch2 "$@"' sh "$@"
