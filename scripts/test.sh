#!/usr/bin/env bash
# Set up (scripts/setup.sh), configure, build with all cores, and run the tests.
# Usage, as root on a fresh Debian 12: sudo scripts/test.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
start=$(date +%s)

"$root/scripts/setup.sh"

cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
cmake --build "$build" --parallel "$(nproc)"

status=0
(cd "$build" && ctest --output-on-failure --parallel "$(nproc)" --label-exclude 'tsan|asan|bench') || status=$?

end=$(date +%s)
echo "test.sh: elapsed $((end - start)) s (setup + build + tests)"
exit "$status"
