#!/usr/bin/env bash
# Set up (scripts/setup.sh), build the demo (examples/demo.cpp) and run it.
# Usage, as root on a fresh Debian 12: sudo scripts/demo.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}

"$root/scripts/setup.sh"

cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
cmake --build "$build" --parallel "$(nproc)" --target demo

exec "$build/examples/demo" "$@"
