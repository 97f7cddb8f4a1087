#!/usr/bin/env bash
# One command for a machine with a GPU (under 5 minutes): the CPU half, then the GPU-marked tests and the same
# quickstart on CUDA, and a CPU/GPU time table. Without CUDA it says so and exits 0 after the CPU half.
#
#   bash scripts/gpu_check.sh            # after the README's install (.venv)
#   PY=python bash scripts/gpu_check.sh  # another interpreter
#
# Writes runs/gpu_check/{cpu,cuda}/ (the quickstart reports) and runs/gpu_check/times.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/gpu_check}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 MPLBACKEND=Agg TQDM_DISABLE=1
mkdir -p "$OUT"
declare -A T

timed() {  # timed NAME CMD...: run CMD, remember its wall time under NAME
  local name=$1; shift
  local t0; t0=$(date +%s.%N)
  "$@"
  T[$name]=$("$PY" -c "print(round($(date +%s.%N) - $t0, 1))")
  echo "== $name: ${T[$name]} s"
}

SWEEP=(memory sweep --d 48 96 --points 3 --seeds 4 --steps 800 --quiet)

echo "== CPU half"
timed quickstart_cpu "$PY" -m mechfact.cli quickstart --fast --device cpu --quiet --out "$OUT/cpu"
timed sweep_cpu "$PY" -m mechfact.cli "${SWEEP[@]}" --device cpu --out "$OUT/cpu_sweep"

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no CUDA on this machine (torch $("$PY" -c 'import torch; print(torch.__version__)')): GPU half skipped"
  "$PY" - "$OUT" quickstart_cpu="${T[quickstart_cpu]}" sweep_cpu="${T[sweep_cpu]}" <<'PYEOF'
import json, sys
times = dict(kv.split("=") for kv in sys.argv[2:])
print("| step | CPU s | GPU s |\n|---|---|---|")
for step in ("quickstart", "sweep"):
    print(f"| {step} | {times[step + '_cpu']} | no CUDA |")
json.dump({k: float(v) for k, v in times.items()}, open(f"{sys.argv[1]}/times.json", "w"), indent=2)
PYEOF
  exit 0
fi

echo "== GPU half: $("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))')"
timed gpu_tests "$PY" -m pytest -q -m gpu tests/test_gpu.py
timed quickstart_cuda "$PY" -m mechfact.cli quickstart --fast --device cuda --quiet --out "$OUT/cuda"
timed sweep_cuda "$PY" -m mechfact.cli "${SWEEP[@]}" --device cuda --out "$OUT/cuda_sweep"
"$PY" - "$OUT" $(for k in "${!T[@]}"; do echo "$k=${T[$k]}"; done) <<'PYEOF'
import json, sys
times = {k: float(v) for k, v in (kv.split("=") for kv in sys.argv[2:])}
print("| step | CPU s | GPU s | CPU / GPU |\n|---|---|---|---|")
for step in ("quickstart", "sweep"):
    c, g = times[step + "_cpu"], times[step + "_cuda"]
    print(f"| {step} | {c} | {g} | {c / g:.1f}x |")
print(f"| GPU-marked tests | | {times['gpu_tests']} | |")
json.dump(times, open(f"{sys.argv[1]}/times.json", "w"), indent=2)
PYEOF
