"""Run a command on a GPU that no other gpu_run command holds, so parallel jobs do not pile onto GPU 0.

    lantern-gpu-run CMD [ARGS...]        (console script; or python -m lantern.pipeline.gpu_run)

Snakemake counts GPU jobs (`--resources gpu=N`) but does not say which device a job should use. This wrapper
takes the first free device of the pool, sets CUDA_VISIBLE_DEVICES to it, and execs CMD. The device is
locked with flock on a file descriptor that CMD inherits, so the lock lasts exactly as long as CMD (and any
child still holding the descriptor) lives, and is released by the kernel even after a crash or kill -9.
When every device is taken, it waits for one.

Pool: $LANTERN_GPUS (e.g. "0,1,3"), else $CUDA_VISIBLE_DEVICES, else the GPUs `nvidia-smi -L` lists.
Inside a SLURM job the pool is the devices SLURM gave it ($CUDA_VISIBLE_DEVICES): with several (the local-gpu
profile inside `salloc --gpus=4`) each command locks one of them; with one, CMD runs on it unchanged.
With an empty pool (a CPU machine) CMD runs unchanged.
CUDA_DEVICE_ORDER=PCI_BUS_ID is set for CMD, so a device number means the GPU `nvidia-smi` shows under it (CUDA's
own default order, fastest first, may differ). LANTERN_GPU_RUN_DEVICE tells CMD that it was given exactly one
device (`device: cuda:N` then means that device: engine/models/checkpoint.parse_device).
Locks live in $LANTERN_GPU_LOCK_DIR (default /tmp/lantern-gpu-locks-<uid>, plus -slurm<job id> inside a SLURM job,
whose device numbers are its own): one machine (or allocation), one folder.
"""
import fcntl
import os
import re
import shutil
import subprocess
import sys
import time

POLL_SECONDS = 2.0


def device_pool() -> list[str]:
    if "SLURM_JOB_ID" in os.environ:  # SLURM's assignment is the pool, whatever LANTERN_GPUS says for this machine
        return [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    for var in ("LANTERN_GPUS", "CUDA_VISIBLE_DEVICES"):
        if var in os.environ:
            return [d.strip() for d in os.environ[var].split(",") if d.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return re.findall(r"^GPU (\d+):", out, flags=re.M)


def lock_dir() -> str:
    # two SLURM jobs on one node may both call their devices 0,1: their locks must not meet
    job = f"-slurm{os.environ['SLURM_JOB_ID']}" if "SLURM_JOB_ID" in os.environ else ""
    return os.environ.get("LANTERN_GPU_LOCK_DIR", f"/tmp/lantern-gpu-locks-{os.getuid()}{job}")


def try_lock(path: str) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def acquire(pool: list[str]) -> tuple[str, int]:
    """Lock the first free device of `pool`, waiting while all are held; returns (device, fd)."""
    folder = lock_dir()
    os.makedirs(folder, exist_ok=True)
    waited = False
    while True:
        for dev in pool:
            # Device ids may be UUIDs ("GPU-8f3c..."): keep the file name to safe characters.
            fd = try_lock(os.path.join(folder, "gpu-" + re.sub(r"[^\w.-]", "_", dev) + ".lock"))
            if fd is not None:
                return dev, fd
        if not waited:
            print(f"gpu_run: all of {','.join(pool)} busy, waiting", file=sys.stderr, flush=True)
            waited = True
        time.sleep(POLL_SECONDS)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        sys.exit("usage: lantern-gpu-run CMD [ARGS...]")
    pool = device_pool()
    if len(pool) > 1 or (pool and "SLURM_JOB_ID" not in os.environ):  # one device of a SLURM job is its own
        dev, fd = acquire(pool)
        os.set_inheritable(fd, True)  # CMD holds the lock from here on
        os.environ["CUDA_VISIBLE_DEVICES"] = dev
        print(f"gpu_run: CUDA_VISIBLE_DEVICES={dev}", file=sys.stderr, flush=True)
    if pool:  # CMD sees exactly one device, numbered as nvidia-smi numbers it
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        os.environ["LANTERN_GPU_RUN_DEVICE"] = os.environ["CUDA_VISIBLE_DEVICES"]
    try:
        os.execvp(argv[0], argv)
    except FileNotFoundError:
        sys.exit(f"gpu_run: command not found: {argv[0]}")


def cli() -> None:
    main(sys.argv[1:])


if __name__ == "__main__":
    cli()
