#!/usr/bin/env bash
# The model benchmark suite (test/benchmarks/bench_models.cpp): builds bench_models, runs models
# M1-M8 in every registered mode with glibc's malloc tuned, prints the tables and
# writes test/benchmarks/RESULTS.md and test/benchmarks/speedups.png.
#
# Usage: scripts/bench-models.sh [options] [-- bench_models arguments...]
#   --min-time S          seconds per mode in each repetition of a row (default 0.2)
#   --repetitions N       repetitions per model (all its modes), randomly interleaved (default 12)
#   --first-call-reps N   fresh compiles whose first call is timed per (model, mode) (default 3)
#   --new-sizes N         sizes never seen timed per dynamic mode on M1-M5 (default 5; 0: none)
#   --quick               smoke run: --min-time 0.05 --repetitions 2 --first-call-reps 1
#                         --new-sizes 1; the RESULTS.md it writes is marked as not for comparison
#   --out-dir DIR         where RESULTS.md and speedups.png go (default test/benchmarks)
#   --no-build            use the existing binary in BUILD_DIR
#   --no-chart            do not draw speedups.png (and do not install gnuplot)
#   --chart-from FILE     only redraw speedups.png (in --out-dir) from FILE, without building or
#                         running anything: a TSV written by bench_models --results_tsv, or a
#                         RESULTS.md written by this script (its median table is read)
#   -h, --help            this text
# Arguments after `--` go to bench_models, e.g. -- --benchmark_filter='M[12]/' (a filtered
# run is marked as partial in RESULTS.md).
# Environment: BUILD_DIR (default build/), JOBS (build parallelism, default nproc).
#
# The defaults take about 25 minutes on a quiet 2-core machine (--quick about 4; most of the time
# goes to the training rows and the first-call table); the run notes in RESULTS.md how busy the
# machine was (CPU time of other processes during the run) and flags a busy one. Many short
# repetitions rather than a few long ones: this kind of host has slow and fast phases lasting
# seconds to minutes, and 12 repetitions spread over the run give each mode more chances at a
# quiet one; bench_models times all the modes of a row in rounds of a few milliseconds each, so
# that a phase slows every mode of a round alike and the ratios are free of it (docs/testing.md,
# "Benchmarks").
# The speedup chart is drawn by gnuplot's pngcairo terminal (Debian package gnuplot-nox; installed
# with apt-get when missing and running as root, otherwise the chart is skipped with a warning): a
# bar chart is a short gnuplot script, while a self-contained PNG writer would need its own font
# rendering for the labels. The chart has a log speedup axis with bars drawn from 1x (up: faster
# than eager, down: slower), one panel for inference rows and one for training steps (rows with
# an aot_eager figure), the same colour for a mode in both, and the `default` figure on its bar.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}
out_dir=$root/test/benchmarks
min_time=0.2
repetitions=12
first_call_reps=3
new_sizes=5
quick=0
do_build=1
do_chart=1
chart_from=
invocation="${BUILD_DIR:+BUILD_DIR=$BUILD_DIR }${JOBS:+JOBS=$JOBS }scripts/bench-models.sh $*"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --min-time) min_time=$2; shift 2 ;;
    --repetitions) repetitions=$2; shift 2 ;;
    --first-call-reps) first_call_reps=$2; shift 2 ;;
    --new-sizes) new_sizes=$2; shift 2 ;;
    --quick) quick=1; min_time=0.05; repetitions=2; first_call_reps=1; new_sizes=1; shift ;;
    --out-dir) out_dir=$(mkdir -p "$2" && cd "$2" && pwd); shift 2 ;;
    --no-build) do_build=0; shift ;;
    --no-chart) do_chart=0; shift ;;
    --chart-from) chart_from=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "bench-models.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
extra=("$@")

# ---- the chart (speedups.png) ------------------------------------------------------------------
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

# tsv_from_results_md RESULTS.md: prints the TSV bench_models --results_tsv would have written
# (model id, then one column per compiled mode with a figure; "?" = none), read from the
# "Median ms per call" table's "(1.37x)" speedups. Row ids come from the "Dynamic shapes" table,
# which lists the same rows in the same order by id; without it, from the first word of each name.
tsv_from_results_md() {
  awk -F'|' '
    function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
    /^## / { section = ($0 ~ /^## Median ms per call/) ? "median" : ($0 ~ /^## Dynamic shapes/) ? "dyn" : ""; next }
    section == "" || $0 !~ /^\|/ || $0 ~ /^\|---/ { next }
    section == "median" && trim($2) == "model" { for (c = 4; c < NF; c++) mode[c] = trim($c); last = NF - 1; next }
    section == "median" { n++; name[n] = trim($2)
      for (c = 4; c <= last; c++) {
        cell = $c; v = "?"
        if (match(cell, /\(([0-9.]+)x\)/)) { v = substr(cell, RSTART + 1, RLENGTH - 3); has[c] = 1 }
        val[n, c] = v } next }
    section == "dyn" && trim($2) != "id" { ids++; id[ids] = trim($2) }
    END {
      if (n == 0) { print "bench-models.sh: no median table found" > "/dev/stderr"; exit 1 }
      line = "model"; for (c = 4; c <= last; c++) if (has[c]) line = line "\t" mode[c]; print line
      for (r = 1; r <= n; r++) {
        if (ids == n) line = id[r]; else { split(name[r], w, " "); line = w[1] }
        for (c = 4; c <= last; c++) if (has[c]) line = line "\t" val[r, c]
        print line } }' "$1"
}

# draw_chart TSV PNG TITLE: the speedup of every compiled mode (TSV columns) per model (TSV rows)
# on a log axis, bars drawn from 1x; inference rows on the left, training steps on the right.
draw_chart() {
  local tsv=$1 png=$2 title=$3 dir
  dir=$(mktemp -d)
  # awk writes one gnuplot fragment per panel (its data, x tics and plot command) and the shared
  # y axis, so that gnuplot only draws: a mode keeps its colour and key entry in both panels.
  awk -F'\t' -v dir="$dir" '
    function color(m) {
      if (m == "eager-backend") return "#8c8c8c"; if (m == "eager-backend dyn") return "#c8c8c8"
      if (m == "torchscript") return "#8172b3"; if (m == "onednn") return "#4c72b0"
      if (m == "fused") return "#55a868"; if (m == "aot_eager") return "#dd8452"
      if (m == "default") return "#c44e52"; if (m == "default dyn") return "#eea0a2"
      return "#937860" }
    # the label of a `default` bar: 53×, 5.1×, 1.79×
    function fmt(v) { return sprintf("sprintf(%s>=10?\"%%.0f×\":%s>=2?\"%%.1f×\":\"%%.2f×\",%s)", v, v, v) }
    function tics(lo, hi,   t, i, s) {
      split("0.01 0.02 0.05 0.1 0.2 0.5 1 2 5 10 20 50 100 200 500 1000 2000 5000", t, " ")
      s = ""; for (i = 1; i in t; i++) if (t[i] + 0 >= lo && t[i] + 0 <= hi) s = s (s == "" ? "" : ", ") "\"" t[i] "×\" " t[i]
      return s }
    NR == 1 { ncol = NF; for (c = 2; c <= NF; c++) { mode[c] = $c; if ($c == "aot_eager") aot = c }; next }
    NF < 2 { next }
    { p = ($1 ~ /-train$/ || (aot && $aot != "?" && $aot != "")) ? 2 : 1
      i = n[p]++; id[p, i] = $1
      for (c = 2; c <= ncol; c++) {
        v = ($c == "" ? "?" : $c); val[p, i, c] = v
        if (v != "?" && v + 0 > 0) { has[p, c] = 1; any[c] = 1; v += 0
          if (!seen || v < lo) lo = v; if (!seen || v > hi) hi = v; seen = 1 } } }
    END {
      if (!seen) { print "bench-models.sh: no speedups to plot" > "/dev/stderr"; exit 1 }
      # y range: from a round value below the slowest (at most 0.5x) to one above the fastest,
      # with room for the labels (at least 2x).
      split("0.01 0.02 0.05 0.1 0.2 0.5", lows, " "); ymin = 0.01
      for (i = 1; i in lows; i++) if (lows[i] + 0 <= lo / 1.15) ymin = lows[i] + 0
      split("2 5 10 20 50 100 200 500 1000 2000 5000", highs, " "); ymax = 5000
      for (i = 11; i >= 1; i--) if (highs[i] + 0 >= hi * 1.6) ymax = highs[i] + 0
      printf "set yrange [%g:%g]\nset ytics (%s)\n", ymin, ymax, tics(ymin, ymax) > (dir "/axis.gp")
      for (p = 1; p <= 2; p++) {
        f = dir "/panel" p ".gp"
        if (!n[p]) { print "" > f; continue }
        data = dir "/panel" p ".dat"
        for (i = 0; i < n[p]; i++) { line = i; for (c = 2; c <= ncol; c++) line = line "\t" val[p, i, c]; print line > data }
        xt = ""; for (i = 0; i < n[p]; i++) xt = xt (i ? ", " : "") "\"" id[p, i] "\" " i
        printf "set xrange [-0.5:%g]\nset xtics (%s)\n", n[p] - 0.5, xt > f
        # bars side by side within a group, as wide as the modes this panel has
        k = 0; for (c = 2; c <= ncol; c++) if (has[p, c]) k++
        w = 0.84 / k; j = 0; cmd = "plot "
        for (c = 2; c <= ncol; c++) {
          if (!has[p, c]) {  # key entry only, so that both panels list every mode
            cmd = cmd sprintf("NaN with boxes lc rgb \"%s\" title \"%s\", ", color(mode[c]), mode[c]); continue }
          off = (j - (k - 1) / 2) * w; j++
          x = sprintf("($1%+.4f)", off); v = sprintf("column(%d)", c)
          cmd = cmd sprintf("\"%s\" using %s:(%s):(%s-%.4f):(%s+%.4f):(%s<1?%s:1):(%s<1?1:%s) with boxxyerror lc rgb \"%s\" title \"%s\", ",
                            data, x, v, x, w / 2, x, w / 2, v, v, v, v, color(mode[c]), mode[c])
          if (mode[c] == "default") {  # its figure in its column, beyond the end of the bar
            lab = " with labels rotate by 90 %s font \",10\" textcolor rgb \"#7a1f22\" notitle, "
            cmd = cmd sprintf("\"%s\" using %s:(%s>=1?%s*1.06:NaN):(%s)" lab, data, x, v, v, fmt(v), "left")
            cmd = cmd sprintf("\"%s\" using %s:(%s<1?%s/1.06:NaN):(%s)" lab, data, x, v, v, fmt(v), "right") }
        }
        print substr(cmd, 1, length(cmd) - 2) >> f } }' "$tsv" || { rm -rf "$dir"; return 1; }
  local left_end=0.97 has_train=0
  if [[ -s $dir/panel2.dat ]]; then
    has_train=1
    # panel widths in proportion to their rows
    left_end=$(awk -v a="$(wc -l < "$dir/panel1.dat" 2>/dev/null || echo 0)" -v b="$(wc -l < "$dir/panel2.dat")" \
      'BEGIN { printf "%.3f", 0.07 + 0.88 * a / (a + b) }')
  fi
  gnuplot <<EOF
set terminal pngcairo size 1600,720 font ",12" noenhanced
set output "$png.tmp"
set datafile separator "\t"
set datafile missing "?"
set logscale y
load "$dir/axis.gp"
set grid ytics lc rgb "#d0d0d0"
set border 3
set xtics nomirror scale 0 font ",12"
set ytics nomirror
set style fill solid 0.9 border lc rgb "#303030"
set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead linewidth 2 linecolor rgb "black" front
set key at screen 0.5, screen 0.895 center center horizontal maxrows 1 maxcols 12 reverse Left samplen 1.5 width 2 font ",12"
set multiplot title "$title" font ",14"
set tmargin at screen 0.80
set bmargin at screen 0.08
$( [[ -s $dir/panel1.dat ]] && cat <<PANEL1
set lmargin at screen 0.07
set rmargin at screen $left_end
set ylabel "speedup over eager (log scale)"
set title "inference (NoGradGuard)" font ",12"
load "$dir/panel1.gp"
unset ylabel
unset key
PANEL1
)
$( [[ $has_train == 1 ]] && cat <<PANEL2
set lmargin at screen $(awk -v l="$left_end" 'BEGIN { printf "%.3f", l + 0.035 }')
set rmargin at screen 0.99
set title "training step (forward + backward)" font ",12"
load "$dir/panel2.gp"
PANEL2
)
unset multiplot
EOF
  local status=$?
  rm -rf "$dir"
  [[ $status == 0 ]] && mv "$png.tmp" "$png"
  return $status
}

if [[ -n $chart_from ]]; then
  [[ -f $chart_from ]] || { echo "bench-models.sh: $chart_from not found" >&2; exit 1; }
  ensure_gnuplot || { echo "bench-models.sh: gnuplot not found (apt-get install gnuplot-nox, as root)" >&2; exit 1; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  title="Speedup over eager LibTorch (median, same run)"
  if [[ $chart_from == *.md ]]; then
    tsv_from_results_md "$chart_from" > "$tmp/speedups.tsv"
    # the run's LibTorch, date and revision, as the run itself titled its chart
    run_libtorch=$(sed -n 's/^- LibTorch (libtorch-dev): \([^+;]*\).*/\1/p' "$chart_from" | head -1)
    run_date=$(sed -n 's/^- Date: \([0-9-]*\).*/\1/p' "$chart_from" | head -1)
    run_rev=$(sed -n 's/^- Git revision: \([^ ]*\).*/\1/p' "$chart_from" | head -1)
    title="Speedup over eager LibTorch${run_libtorch:+ $run_libtorch} (median, same run)${run_date:+, $run_date}${run_rev:+, $run_rev}"
    grep -q '^> \*\*Not for comparison' "$chart_from" && title="$title — QUICK RUN, not for comparison"
  else
    cp "$chart_from" "$tmp/speedups.tsv"
  fi
  draw_chart "$tmp/speedups.tsv" "$out_dir/speedups.png" "$title"
  echo "bench-models.sh: wrote $out_dir/speedups.png (from $chart_from)"
  exit 0
fi

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
     "--new_sizes=$new_sizes"
     "--results_md=$tmp/results.md"
     "--results_tsv=$tmp/speedups.tsv"
     "${extra[@]}")
echo "bench-models.sh: MALLOC_MMAP_THRESHOLD_=$MALLOC_MMAP_THRESHOLD_ MALLOC_TRIM_THRESHOLD_=$MALLOC_TRIM_THRESHOLD_"
echo "bench-models.sh: $blas"
echo "bench-models.sh: running $(printf '%q ' "${cmd[@]}")"
# Other processes' CPU use during the run: all busy CPU time (/proc/stat) minus this run's own.
busy_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9; exit}' /proc/stat; }
# `times` must run in this shell (a subshell has its own, zero, child times).
cpu_of_times() { awk 'NR==2{for(i=1;i<=2;i++){split($i,a,/[ms]/); t+=a[1]*60+a[2]} print t}' "$1"; }
busy0=$(busy_ticks); times > "$tmp/times0"; own0=$(cpu_of_times "$tmp/times0"); start=$(date +%s.%N)
"${cmd[@]}"
busy1=$(busy_ticks); times > "$tmp/times1"; own1=$(cpu_of_times "$tmp/times1"); end=$(date +%s.%N)
elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.0f", b-a}')
# Variables that choose the kernels eager LibTorch (OpenBLAS, ATen) or the compiled modes (oneDNN,
# torchcompile) run, as the benchmark recorded them (tc_bench::kernel_settings): set by a user or
# by the machine's environment, they can make eager and the compiled modes run kernels of
# different ISAs (OPENBLAS_CORETYPE=Haswell alone: AVX2 GEMMs for eager, AVX-512 oneDNN for the
# compiled modes), and the ratios then compare other kernels.
kernel_vars=$(sed -n 's/^- variables that select kernels: //p' "$tmp/results.md")
if [[ $kernel_vars == "(none)" ]]; then kernel_vars=""; fi
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
  if [[ -n $kernel_vars ]]; then
    echo "> **Kernels chosen by the environment**: \`$kernel_vars\` was set during the run. Eager LibTorch and the compiled modes may then run kernels of different ISAs (e.g. \`OPENBLAS_CORETYPE=Haswell\` alone gives eager AVX2 GEMMs while oneDNN uses AVX-512): compare only with runs made under the same settings."
    echo
  fi
  if [[ $busy_machine == 1 ]]; then
    echo "> **Warning**: the machine was not quiet: other processes kept $other_cores of $(nproc) cores busy on average during the run, so OpenMP threads were descheduled and the timings are unreliable."
    echo
  fi
  echo "Models M1–M8 (fp32, seed 0, 2 threads), each in every mode whose backend is"
  echo "registered; see the header of \`test/benchmarks/bench_models.cpp\` for the definitions. Absolute"
  echo "times move from run to run on shared hardware: read the speedups, which divide times of the"
  echo "same rounds (all the modes of a row timed together, a few milliseconds each in turn; each time"
  echo "shown is the least of the repetitions' median blocks unless the benchmark command passes"
  echo "\`--statistic=median\`)."
  echo
  echo "- Date: $date_start (run took ${elapsed} s)"
  echo "- Command: \`$invocation\`"
  echo "- Benchmark command: \`MALLOC_MMAP_THRESHOLD_=$MALLOC_MMAP_THRESHOLD_ MALLOC_TRIM_THRESHOLD_=$MALLOC_TRIM_THRESHOLD_ ${shown_cmd% }\`"
  echo "- Git revision: $revision"
  echo "- CPU: ${cpu:-unknown}, $(nproc) cores visible${cpu_flags:+ (${cpu_flags% })}"
  echo "- LibTorch (libtorch-dev): $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null || echo unknown); oneDNN (libdnnl-dev): $(dpkg-query -W -f='${Version}' libdnnl-dev 2>/dev/null || echo unknown)"
  echo "- BLAS: $blas"
  echo "- Variables that select kernels: ${kernel_vars:-(none)}"
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
  # The hand-maintained sections (from the marker comment on) are kept as they are.
  if [[ -f $results ]] && grep -q '^<!-- Everything above is written by scripts/bench-models.sh' "$results"; then
    echo
    sed -n '/^<!-- Everything above is written by scripts\/bench-models.sh/,$p' "$results"
  fi
} > "$results.tmp"
mv "$results.tmp" "$results"

# ---- speedups.png ------------------------------------------------------------------------------
png=$out_dir/speedups.png
if [[ $do_chart == 1 ]]; then
  columns=$(head -1 "$tmp/speedups.tsv" | awk -F'\t' '{print NF}')
  if [[ $columns -lt 2 ]]; then
    echo "bench-models.sh: no compiled mode has results; no chart" >&2
  elif ensure_gnuplot; then
    libtorch_version=$(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null || true)
    title="Speedup over eager LibTorch${libtorch_version:+ ${libtorch_version%%+*}} (median, same run), $(date -u +%Y-%m-%d), ${revision%% *}"
    [[ $quick == 1 ]] && title="$title — QUICK RUN, not for comparison"
    if draw_chart "$tmp/speedups.tsv" "$png" "$title"; then
      echo "bench-models.sh: wrote $png"
    else
      echo "bench-models.sh: gnuplot failed; no chart" >&2
      sed -i '/^!\[Speedup over eager/{N;d}' "$results"
    fi
  else
    echo "bench-models.sh: gnuplot not found (apt-get install gnuplot-nox, as root); no chart" >&2
    sed -i '/^!\[Speedup over eager/{N;d}' "$results"
  fi
fi
echo "bench-models.sh: wrote $results (run took ${elapsed} s)"
