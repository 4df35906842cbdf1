#!/usr/bin/env bash
# A short GPU lease's checks, most important first, each under its own time limit so that one hang costs only its
# share: compiled == eager for the decoders whose rounds run as one graph (toy shape), then their round costs on
# GPT-XL at batch 1 and 8. Rows go to OUTDIR/gpu_rounds.csv: append them to benchmarks/records/gpu_rounds.csv.
# Needs python3 with torch and CUDA; the repository's src/ is put on PYTHONPATH. About 9 minutes on an H200
# (compilation dominates); a 15-minute lease leaves room for one rerun.
#
#     COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_lease.sh OUTDIR
set -u
out=${1:?usage: COMMIT=<sha> bash benchmarks/gpu_lease.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
rec=(--commit "${COMMIT:-unknown}" --record "$out/gpu_rounds.csv")

step() {  # step LIMIT_S NAME COMMAND...: run it under timeout, its output to the screen and OUTDIR/NAME.log
    local limit=$1 name=$2 t0=$SECONDS
    shift 2
    echo "== $name (limit ${limit} s)"
    timeout "$limit" "$@" > >(tee "$out/$name.log") 2>&1
    echo "== $name: rc $?, $((SECONDS - t0)) s"
}

nvidia-smi -L
$py -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'
step 150 gpu_check $py benchmarks/gpu_check.py --specs static-lanternpp dynamic-exact --sizes --out "$out/gpu_check.csv"
step 200 rounds_xl_b1 $py benchmarks/gpu_rounds.py --size GPT-XL --specs static-lanternpp chain-lantern dynamic-exact \
    --batch 1 "${rec[@]}"
step 150 rounds_xl_b8 $py benchmarks/gpu_rounds.py --size GPT-XL --specs chain-exact static-lanternpp --batch 8 "${rec[@]}"
