#!/usr/bin/env bash
# Build and test against LibTorch 2.x (Debian 13's 2.6) in a chroot made by
# ../shared/tools/libtorch2-chroot.sh (run its `setup` once per machine, as root).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tool=${LIBTORCH2_CHROOT_TOOL:-$root/../shared/tools/libtorch2-chroot.sh}
cd "$root"
# The TorchScript test archives are made on the host, by its Python's torch (1.13): archives saved
# by an older PyTorch are what deployed programs load with a newer LibTorch.
/usr/bin/python3 scripts/make_torchscript_models.py build-lt2-models >/dev/null
"$tool" run sh -c 'cmake -S . -B build-lt2 -G Ninja -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DTORCHCOMPILE_BUILD_BENCHMARKS=OFF \
    -DTORCHCOMPILE_TORCHSCRIPT_MODELS="$PWD/build-lt2-models" &&
  cmake --build build-lt2 --parallel "$(nproc)" && ctest --test-dir build-lt2 --output-on-failure --label-exclude "tsan|asan|bench"'
