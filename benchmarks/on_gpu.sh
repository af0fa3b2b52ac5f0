#!/usr/bin/env bash
# The GPU proof, one command a part, on a machine with PyTorch and CUDA but no package index.
#
# Here, where the package index is:
#   bash benchmarks/on_gpu.sh wheels
#     downloads into .whl/ what thrifty needs beyond torch and numpy: its core at the versions
#     pinned in constraints.txt, and torchao for FP8 (Python >= 3.10, x86-64 Linux).
# There, with .whl/ beside the checkout (each part fits in 10 minutes):
#   bash benchmarks/on_gpu.sh gpt2 OUT [SECONDS]
#     benchmarks/gpt2_124m.py: the plain loop, then `thrifty tune` with no flags and
#     `thrifty train` on its winner, all within SECONDS (default 560); ARMS="plain,..." to
#     choose the arms.
#   bash benchmarks/on_gpu.sh checks OUT [NAMES]
#     benchmarks/cuda_checks.py --only NAMES (default room,peak).
# Each part installs .whl/ into a folder of its own (the machine's packages are left as they
# are) and writes into OUT the machine (GPU, driver, torch, CUDA) and its output, the raw
# results benchmarks/results/ keeps: for gpt2, each tune trial's summary.json too (its
# micro-batch search's peaks and the checkpointing room it predicted).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
part=${1:-}

if [[ $part == wheels ]]; then
  pins=()
  for name in rich tomli_w markdown-it-py mdurl Pygments; do
    pins+=("$(grep -i "^${name}==" "$root/constraints.txt")")
  done
  python -m pip download --no-deps --dest "$root/.whl" "${pins[@]}" torchao==0.17.0
  exit 0
fi

if [[ $part != gpt2 && $part != checks ]] || [[ -z ${2:-} ]]; then
  echo "usage: bash benchmarks/on_gpu.sh wheels | gpt2 OUT [SECONDS] | checks OUT [NAMES]" >&2
  exit 2
fi
out=$2
mkdir -p "$out"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
site=$scratch/site runs=$scratch/runs
shopt -s nullglob
wheels=("$root"/.whl/*.whl)
if ((${#wheels[@]})); then
  python -m pip install --quiet --no-index --no-deps --target "$site" "${wheels[@]}"
fi
export PYTHONPATH="$site:$root/src:$root/benchmarks${PYTHONPATH:+:$PYTHONPATH}"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  python -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'
} >"$out/machine.txt" 2>&1

if [[ $part == gpt2 ]]; then
  status=0
  python "$root/benchmarks/gpt2_124m.py" --out "$runs" --deadline "${3:-560}" \
    --arms "${ARMS:-plain,thrifty}" >"$out/gpt2.log" 2>&1 || status=$?
  names=(gpt2_124m.json tune.log thrifty.log tune/tune.json)
  for path in "$runs"/tune/trials/*/summary.json; do names+=("${path#"$runs"/}"); done
  for name in "${names[@]}"; do
    if [[ -f $runs/$name ]]; then cp "$runs/$name" "$out/${name//\//-}"; fi
  done
  tail -n 12 "$out/gpt2.log"
  exit "$status"
fi

python "$root/benchmarks/cuda_checks.py" --only "${3:-room,peak}" 2>&1 | tee "$out/checks.log"
exit "${PIPESTATUS[0]}"
