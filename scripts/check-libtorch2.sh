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
# Packages the project needs beyond the chroot's base set (data-parallel training: Gloo's headers).
"$tool" run sh -c 'dpkg -s libgloo-dev >/dev/null 2>&1 || apt-get install -y -q --no-install-recommends libgloo-dev >/dev/null'

"$tool" run sh -c 'cmake -S . -B build-lt2 -G Ninja -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DTORCHCOMPILE_BUILD_BENCHMARKS=OFF \
    -DTORCHCOMPILE_TORCHSCRIPT_MODELS="$PWD/build-lt2-models" &&
  cmake --build build-lt2 --parallel "$(nproc)" && ctest --test-dir build-lt2 --output-on-failure --label-exclude "tsan|asan|bench"'
# Packages written by the host's LibTorch 1.13 build (test_package, Package.SecondProcess*, into
# build/packages) load and run with LibTorch 2.6: the loader built against it runs their calls.
if [ -x build/test/test_package ]; then
  TORCHCOMPILE_TEST_BINARY_DIR="$root/build" build/test/test_package \
      --gtest_filter=Package.SecondProcessLoadsWithoutTheModelsCode >/dev/null
  "$tool" run sh -c 'build-lt2/test/package_loader --across-versions build/packages default eager onednn'
else
  echo "check-libtorch2: build/test/test_package not built on the host: packages written by LibTorch 1.13 not checked" >&2
  exit 1
fi
