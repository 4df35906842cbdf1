#!/usr/bin/env bash
# A short GPU lease's checks, most important first, each under its own time limit so that one hang costs only its
# share; each part is one lease command (at most 580 s). Part 1: compiled == eager for the decoders whose rounds
# run as one graph and have no GPU check yet (toy shape), then round costs on GPT-XL at batch 1: trees and the
# LANTERN chain, then Jacobi (SJD, GSD), LANTERN-TV and Cool-SD. PART=2: LANTERN at the paper's k = 1000 beside
# k = 50, batch 8, GPT-L. Rows go to OUTDIR/gpu_rounds.csv: append them to benchmarks/records/gpu_rounds.csv.
# Needs python3 with torch and CUDA; the repository's src/ is put on PYTHONPATH. Compilation dominates; what a step
# has not finished in its limit is left for the next lease, as is the toy sweep (config/gpu-toy.yaml).
#
#     COMMIT=$(git rev-parse --short HEAD) [PART=2] bash benchmarks/gpu_lease.sh OUTDIR
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
if [ "${PART:-1}" = 1 ]; then
    step 180 gpu_check $py benchmarks/gpu_check.py --specs static-lanternpp dynamic-exact jacobi-sjd jacobi-gsd \
        chain-lanterntv chain-coolsd --sizes --out "$out/gpu_check.csv"
    step 200 rounds_xl_b1 $py benchmarks/gpu_rounds.py --size GPT-XL --specs static-lanternpp chain-lantern \
        dynamic-exact --batch 1 "${rec[@]}"
    step 200 rounds_xl_b1_peers $py benchmarks/gpu_rounds.py --size GPT-XL --specs jacobi-sjd chain-lanterntv \
        chain-coolsd jacobi-gsd --batch 1 "${rec[@]}"
else
    step 240 rounds_xl_k1000 $py benchmarks/gpu_rounds.py --size GPT-XL --specs chain-lantern-k1000 chain-lantern \
        static-lanternpp-k1000 --table-k 1001 --batch 1 "${rec[@]}"
    step 200 rounds_xl_b8 $py benchmarks/gpu_rounds.py --size GPT-XL --specs chain-exact static-lanternpp --batch 8 \
        "${rec[@]}"
    step 120 rounds_l_b1 $py benchmarks/gpu_rounds.py --size GPT-L --specs chain-exact chain-lantern --batch 1 \
        "${rec[@]}"
fi
