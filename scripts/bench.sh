#!/usr/bin/env bash
# Build the overhead benchmark (test/benchmarks/bench_overhead.cpp) and run it with glibc's
# malloc tuned (large freed tensors stay in the process; see docs/testing.md, "Benchmarks"). Extra arguments go to the benchmark, e.g.
#   scripts/bench.sh --benchmark_filter=M1 --benchmark_repetitions=5
# Environment: BUILD_DIR (default build/), JOBS (build parallelism, default nproc).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}

# Without these, glibc returns every freed block of >= 32 MiB (dynamic threshold) to the kernel
# and page-faults it back on the next call, which distorts eager timings.
export MALLOC_MMAP_THRESHOLD_=1073741824
export MALLOC_TRIM_THRESHOLD_=4294967296

if [[ ! -f "$build/build.ninja" && ! -f "$build/Makefile" ]]; then
  cmake -S "$root" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
fi
cmake --build "$build" --parallel "$jobs" --target bench_overhead

echo "bench.sh: MALLOC_MMAP_THRESHOLD_=$MALLOC_MMAP_THRESHOLD_ MALLOC_TRIM_THRESHOLD_=$MALLOC_TRIM_THRESHOLD_"
# The variables that select kernels are printed by the benchmark itself (its context's
# kernel_settings line).
echo "bench.sh: libblas.so.3 -> $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo '?')"
exec "$build/test/benchmarks/bench_overhead" "$@"
