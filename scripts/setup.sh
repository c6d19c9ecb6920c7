#!/usr/bin/env bash
# Install what torchcompile needs to build and test, on Debian 12, as root. Idempotent: only
# missing packages are installed, and OpenBLAS's OpenMP flavour is selected for BLAS/LAPACK.
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
  echo "setup.sh: run as root (sudo $0)" >&2
  exit 1
fi

packages=(
  build-essential cmake ninja-build ccache
  libtorch-dev          # LibTorch 1.13.1
  libdnnl-dev           # oneDNN, for the onednn backend
  libtbb-dev            # TBB, runtime concurrency
  libgtest-dev libgmock-dev
  libbenchmark-dev
  libopenblas0-openmp   # BLAS/LAPACK sharing LibTorch's OpenMP runtime
  python3
  python3-torch         # PyTorch 1.13.1 for Python: scripts and saves the TorchScript test models
  libgloo-dev           # Gloo's headers, included by c10d's Gloo process group (data-parallel training)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
else
  echo "setup.sh: all packages present"
fi

# LibTorch uses OpenMP (libgomp); the pthread OpenBLAS would oversubscribe the cores under it
# and the reference BLAS is slow, so point all three alternatives at the OpenMP flavour.
arch_dir=/usr/lib/x86_64-linux-gnu
for alt in libblas.so.3 liblapack.so.3 libopenblas.so.0; do
  name="$alt-x86_64-linux-gnu"
  target="$arch_dir/openblas-openmp/$alt"
  current=$(update-alternatives --query "$name" 2>/dev/null | sed -n 's/^Value: //p')
  if [[ "$current" != "$target" ]]; then
    update-alternatives --set "$name" "$target"
  fi
done
