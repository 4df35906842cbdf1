#!/usr/bin/env bash
# A short GPU lease's checks, most important first, each under its own time limit so that one hang costs only its
# share: compiled == eager and host syncs for plain AR, the chain decoders (compiled drafting) and the static tree
# on the toy shape (gpu_check.py), then a speculative round's cost on GPT-XL for the exact chain and LANTERN++'s
# static tree (profile_round.py). Needs python3 with torch and CUDA; the repository's src/ is put on PYTHONPATH.
#
#     bash benchmarks/gpu_lease.sh OUTDIR        (writes OUTDIR/*.log and OUTDIR/gpu_check.csv)
set -u
out=${1:?usage: bash benchmarks/gpu_lease.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

step() {  # step LIMIT_S NAME COMMAND...: run it under timeout, its output to the screen and OUTDIR/NAME.log
    local limit=$1 name=$2 t0=$SECONDS
    shift 2
    echo "== $name (limit ${limit} s)"
    timeout "$limit" "$@" > >(tee "$out/$name.log") 2>&1
    echo "== $name: rc $?, $((SECONDS - t0)) s"
}

nvidia-smi -L
$py -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'
step 230 gpu_check $py benchmarks/gpu_check.py --specs vanilla chain-exact chain-lantern chain-lanterntv chain-coolsd \
    static-lanternpp --sizes --out "$out/gpu_check.csv"
step 150 round_chain_exact_xl $py benchmarks/profile_round.py --size GPT-XL --spec chain-exact
step 120 round_static_xl $py benchmarks/profile_round.py --size GPT-XL --spec static-lanternpp
