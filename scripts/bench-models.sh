#!/usr/bin/env bash
# The model benchmark suite (test/benchmarks/bench_models.cpp): builds bench_models, runs models
# M1-M8 in every registered mode with glibc's malloc tuned, prints the tables and
# writes test/benchmarks/RESULTS.md and test/benchmarks/speedups.png.
#
# Usage: scripts/bench-models.sh [options] [-- bench_models arguments...]
#   --min-time S          seconds per benchmark repetition (default 0.5)
#   --repetitions N       repetitions per (model, mode), randomly interleaved (default 5)
#   --first-call-reps N   fresh compiles whose first call is timed per (model, mode) (default 3)
#   --quick               smoke run: --min-time 0.05 --repetitions 2 --first-call-reps 1; the
#                         RESULTS.md it writes is marked as not for comparison
#   --out-dir DIR         where RESULTS.md and speedups.png go (default test/benchmarks)
#   --no-build            use the existing binary in BUILD_DIR
#   --no-chart            do not draw speedups.png (and do not install gnuplot)
#   -h, --help            this text
# Arguments after `--` go to bench_models, e.g. -- --benchmark_filter='M[12]/' (a filtered
# run is marked as partial in RESULTS.md).
# Environment: BUILD_DIR (default build/), JOBS (build parallelism, default nproc).
#
# The defaults take about 4-5 minutes on a quiet 2-core machine (estimate: --quick takes ~1 min;
# most of the time goes to M5 and its training step); the run notes in RESULTS.md how busy the
# machine was (CPU time of other processes during the run) and flags a busy one.
# The speedup chart is drawn by gnuplot's png terminal (Debian package gnuplot-nox; installed with
# apt-get when missing and running as root, otherwise the chart is skipped with a warning): a
# clustered bar chart is a few lines of gnuplot, while a self-contained PNG writer would need
# its own font rendering for the labels.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}
out_dir=$root/test/benchmarks
min_time=0.5
repetitions=5
first_call_reps=3
quick=0
do_build=1
do_chart=1
invocation="${BUILD_DIR:+BUILD_DIR=$BUILD_DIR }${JOBS:+JOBS=$JOBS }scripts/bench-models.sh $*"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --min-time) min_time=$2; shift 2 ;;
    --repetitions) repetitions=$2; shift 2 ;;
    --first-call-reps) first_call_reps=$2; shift 2 ;;
    --quick) quick=1; min_time=0.05; repetitions=2; first_call_reps=1; shift ;;
    --out-dir) out_dir=$(mkdir -p "$2" && cd "$2" && pwd); shift 2 ;;
    --no-build) do_build=0; shift ;;
    --no-chart) do_chart=0; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "bench-models.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
extra=("$@")

# Without these, glibc returns every freed block of >= 32 MiB (dynamic threshold) to the kernel
# and page-faults it back on the next call, which distorts eager timings.
export MALLOC_MMAP_THRESHOLD_=1073741824
export MALLOC_TRIM_THRESHOLD_=4294967296

if [[ $do_build == 1 ]]; then
  if [[ ! -f "$build/build.ninja" && ! -f "$build/Makefile" ]]; then
    cmake -S "$root" -B "$build" -G Ninja \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
      -DTORCHCOMPILE_BUILD_TESTS=ON
  fi
  cmake --build "$build" --parallel "$jobs" --target bench_models
fi
binary=$build/test/benchmarks/bench_models
[[ -x $binary ]] || { echo "bench-models.sh: $binary not found (build it, or drop --no-build)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---- the machine -------------------------------------------------------------------------------
lib=/usr/lib/x86_64-linux-gnu
resolve() { if [[ -e $1 ]]; then readlink -f "$1"; else echo "(missing)"; fi; }
cpu=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || true)
cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_tile' | sort -u | tr '\n' ' ' || true)
blas="libblas.so.3 → $(resolve $lib/libblas.so.3), liblapack.so.3 → $(resolve $lib/liblapack.so.3), libopenblas.so.0 → $(resolve $lib/libopenblas.so.0)"
revision=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [[ $revision != unknown ]] && ! git -C "$root" diff-index --quiet HEAD -- 2>/dev/null; then
  revision="$revision (with uncommitted changes)"
fi
benchmark_version=$(dpkg-query -W -f='${Version}' libbenchmark-dev 2>/dev/null || echo unknown)
date_start=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- the run -----------------------------------------------------------------------------------
cmd=("$binary"
     "--benchmark_min_time=$min_time"
     "--benchmark_repetitions=$repetitions"
     "--benchmark_enable_random_interleaving=true"
     "--benchmark_display_aggregates_only=true"
     "--first_call_reps=$first_call_reps"
     "--results_md=$tmp/results.md"
     "--results_tsv=$tmp/speedups.tsv"
     "${extra[@]}")
echo "bench-models.sh: MALLOC_MMAP_THRESHOLD_=$MALLOC_MMAP_THRESHOLD_ MALLOC_TRIM_THRESHOLD_=$MALLOC_TRIM_THRESHOLD_"
echo "bench-models.sh: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}; $blas"
echo "bench-models.sh: running $(printf '%q ' "${cmd[@]}")"
# Other processes' CPU use during the run: all busy CPU time (/proc/stat) minus this run's own.
busy_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9; exit}' /proc/stat; }
# `times` must run in this shell (a subshell has its own, zero, child times).
cpu_of_times() { awk 'NR==2{for(i=1;i<=2;i++){split($i,a,/[ms]/); t+=a[1]*60+a[2]} print t}' "$1"; }
busy0=$(busy_ticks); times > "$tmp/times0"; own0=$(cpu_of_times "$tmp/times0"); start=$(date +%s.%N)
"${cmd[@]}"
busy1=$(busy_ticks); times > "$tmp/times1"; own1=$(cpu_of_times "$tmp/times1"); end=$(date +%s.%N)
elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.0f", b-a}')
other_cores=$(awk -v b0="$busy0" -v b1="$busy1" -v o0="$own0" -v o1="$own1" -v a="$start" -v b="$end" -v hz="$(getconf CLK_TCK)" \
  'BEGIN{x=((b1-b0)/hz-(o1-o0))/(b-a); if(x<0)x=0; printf "%.2f", x}')
busy_machine=$(awk -v x="$other_cores" 'BEGIN{print (x > 0.2) ? 1 : 0}')
echo "bench-models.sh: other processes kept $other_cores cores busy on average during the run"
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- RESULTS.md ----------------------------------------------------------------------------------
shown_cmd=$(printf '%q ' "${cmd[@]}" | sed -e "s|$tmp/|<tmp>/|g" -e "s|$root/||g")
results=$out_dir/RESULTS.md
{
  echo "# Model benchmark results (issue 6)"
  echo
  if [[ $quick == 1 || ${#extra[@]} -gt 0 ]]; then
    echo "> **Not for comparison**: a $([[ $quick == 1 ]] && echo 'quick smoke run (--quick)' || echo 'run with extra arguments'); rerun \`scripts/bench-models.sh\` with its defaults on a quiet machine for the real figures."
    echo
  fi
  if [[ $busy_machine == 1 ]]; then
    echo "> **Warning**: the machine was not quiet: other processes kept $other_cores of $(nproc) cores busy on average during the run, so OpenMP threads were descheduled and the timings are unreliable."
    echo
  fi
  echo "Models M1–M8 (fp32, seed 0, 2 threads), each in every mode whose backend is"
  echo "registered; see the header of \`test/benchmarks/bench_models.cpp\` for the definitions. Absolute"
  echo "times move from run to run on shared hardware: read the speedups, which compare medians from"
  echo "the same run (repetitions randomly interleaved)."
  echo
  echo "- Date: $date_start (run took ${elapsed} s)"
  echo "- Command: \`$invocation\`"
  echo "- Benchmark command: \`MALLOC_MMAP_THRESHOLD_=$MALLOC_MMAP_THRESHOLD_ MALLOC_TRIM_THRESHOLD_=$MALLOC_TRIM_THRESHOLD_ ${shown_cmd% }\`"
  echo "- Git revision: $revision"
  echo "- CPU: ${cpu:-unknown}, $(nproc) cores visible${cpu_flags:+ (${cpu_flags% })}"
  echo "- LibTorch (libtorch-dev): $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null || echo unknown); oneDNN (libdnnl-dev): $(dpkg-query -W -f='${Version}' libdnnl-dev 2>/dev/null || echo unknown)"
  echo "- BLAS: $blas; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}"
  echo "- malloc: MALLOC_MMAP_THRESHOLD_=$MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_=$MALLOC_TRIM_THRESHOLD_"
  echo "- Threads: torch::set_num_threads(2); OMP_NUM_THREADS=${OMP_NUM_THREADS:-(unset)}"
  echo "- Google Benchmark $benchmark_version; load average at start $load_start, at end $load_end"
  echo "- Other processes' CPU use during the run: $other_cores cores on average (/proc/stat busy time minus this run's own)"
  echo
  if [[ $do_chart == 1 ]]; then
    echo "![Speedup over eager per model and mode](speedups.png)"
    echo
  fi
  cat "$tmp/results.md"
} > "$results.tmp"
mv "$results.tmp" "$results"

# ---- speedups.png ------------------------------------------------------------------------------
ensure_gnuplot() {
  command -v gnuplot >/dev/null && return 0
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "bench-models.sh: installing gnuplot-nox for the chart"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends gnuplot-nox >/dev/null ||
      { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends gnuplot-nox >/dev/null; } || true
  fi
  command -v gnuplot >/dev/null
}

png=$out_dir/speedups.png
if [[ $do_chart == 1 ]]; then
  columns=$(head -1 "$tmp/speedups.tsv" | awk -F'\t' '{print NF}')
  if [[ $columns -lt 2 ]]; then
    echo "bench-models.sh: no compiled mode has results; no chart" >&2
  elif ensure_gnuplot; then
    title="Speedup over eager LibTorch (median, same run), $(date -u +%Y-%m-%d), ${revision%% *}"
    [[ $quick == 1 ]] && title="$title — QUICK RUN, not for comparison"
    gnuplot <<EOF
set terminal png size 1200,600 font ",11" noenhanced
set output "$png.tmp"
set datafile separator "\t"
set datafile missing "?"
set title "$title"
set ylabel "speedup over eager (×)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set yrange [0:*]
set grid ytics
set key outside right top vertical
set xtics nomirror
set arrow from graph 0, first 1 to graph 1, first 1 nohead dashtype 2 linewidth 2 linecolor rgb "black"
plot for [i=2:$columns] "$tmp/speedups.tsv" using i:xtic(1) title columnheader(i)
EOF
    mv "$png.tmp" "$png"
    echo "bench-models.sh: wrote $png"
  else
    echo "bench-models.sh: gnuplot not found (apt-get install gnuplot-nox, as root); no chart" >&2
    sed -i '/^!\[Speedup over eager/{N;d}' "$results"
  fi
fi
echo "bench-models.sh: wrote $results (run took ${elapsed} s)"
