"""Count the host<->device sync points of a decoder on a CPU run, by call site (benchmarks/bench_syncs.py, tests).

On a GPU every one of these blocks the host until the device catches up (or copies host data in the hot loop):
reading a device tensor into Python (`.item()`, `.tolist()`, `bool` / `int` / `float` / `index` / `format`, `.cpu()`,
`torch.equal`), data-dependent shapes (`nonzero`, `masked_select`, `unique`, `repeat_interleave` by a tensor), and
host data sent to the device (`torch.tensor(list, device=...)`, `.to(device)` of a host tensor, indexing a device
tensor with a Python list or a host tensor). On a CPU all tensors live on one device, so `SyncCounter` tells host
tensors from device tensors by where they were made, as they would be on a GPU: a tensor created without a
`device=` argument (the uniforms drawn from an image's CPU generator, `torch.tensor(list)`) is a host tensor, and so
is every result computed from host tensors only; everything else (parameters, inputs, tensors created with
`device=`) is a device tensor. Reading a host tensor costs no sync and is not counted. StepTimer synchronisations are
counted too where the timer calls `StepTimer._sync` (on CUDA: torch.cuda.synchronize).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from lantern.engine.decoding.stats import GpuPath

READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__format__", "cpu", "equal", "allclose"}
SHAPES = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive"}
CREATE = {"tensor", "as_tensor", "rand", "randn", "randint", "randperm", "empty", "zeros", "ones", "full", "arange",
          "linspace", "eye", "rand_like", "randn_like", "zeros_like", "ones_like", "empty_like", "full_like"}
_ROOT = str(Path(__file__).resolve().parent)  # src/lantern: call sites are reported relative to it
_SELF = str(Path(__file__).resolve())
_HOST = "_lantern_host"  # attribute marking a host tensor


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)


def is_host(t: torch.Tensor) -> bool:
    return getattr(t, _HOST, False)


def _mark(out) -> None:
    for t in _tensors(out):
        try:
            setattr(t, _HOST, True)
        except (AttributeError, RuntimeError):  # a tensor subclass without a __dict__
            pass


def _has_list(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, list) or (isinstance(i, torch.Tensor) and is_host(i)) for i in items)


class SyncCounter(TorchFunctionMode):
    """`with SyncCounter() as c: decode(...)`: c.sites counts sync points by (file:line of the first frame in
    src/lantern, else the caller's, kind); c.total is their sum."""

    def __init__(self):
        super().__init__()
        self.sites: Counter = Counter()

    def __enter__(self):
        GpuPath.counting += 1  # the code under count takes its GPU path (stats.free_read)
        return super().__enter__()

    def __exit__(self, *exc):
        GpuPath.counting -= 1
        return super().__exit__(*exc)

    @property
    def total(self) -> int:
        return sum(self.sites.values())

    def by_kind(self) -> Counter:
        out = Counter()
        for (_, kind), n in self.sites.items():
            out[kind] += n
        return out

    def _site(self) -> str:
        frame, fallback = sys._getframe(2), None
        while frame is not None:
            name = frame.f_code.co_filename
            if name == _SELF:
                pass
            elif name.startswith(_ROOT):
                return f"{Path(name).relative_to(_ROOT)}:{frame.f_lineno}"
            elif fallback is None and "/torch/" not in name:
                fallback = f"{Path(name).name}:{frame.f_lineno}"
            frame = frame.f_back
        return fallback or "?"

    def count(self, kind: str) -> None:
        self.sites[(self._site(), kind)] += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        ins = list(_tensors(args)) + list(_tensors(kwargs))
        host_in = bool(ins) and all(is_host(t) for t in ins)
        gen = kwargs.get("generator")
        # a draw from a CPU generator is a host tensor, whatever `device=` says on a CPU run
        on_device = kwargs.get("device") is not None and not (gen is not None and gen.device.type == "cpu")
        if name in READS and ins and not is_host(ins[0]):
            self.count(name.strip("_"))
        elif name in SHAPES and not host_in:
            self.count(name)
        elif name == "repeat_interleave" and len(ins) > 1 and "output_size" not in kwargs:
            self.count(name)
        elif name in ("tensor", "as_tensor") and on_device and not (args and isinstance(args[0], torch.Tensor)):
            self.count("tensor(host data)")
        elif name in ("to", "cuda") and ins and is_host(ins[0]) and (name == "cuda" or _moves(args, kwargs)):
            self.count("host->device")
        elif name == "copy_" and len(ins) > 1 and not is_host(ins[0]) and is_host(ins[1]):
            self.count("host->device")
        elif name in ("__getitem__", "__setitem__") and ins and not is_host(ins[0]) and _has_list(args[1]):
            self.count("index by host data")
        out = func(*args, **kwargs)
        if name in ("to", "cuda") and ins and out is ins[0] and is_host(out):  # a no-op move on a CPU: a fresh alias
            out = out.view_as(out)                                              # stands for the device copy
        if name in CREATE and not on_device and not (args and isinstance(args[0], torch.Tensor)):
            _mark(out)
        elif host_in and not on_device and not (name in ("to", "cuda") and (name == "cuda" or _moves(args, kwargs))):
            _mark(out)
        elif name == "cpu":
            _mark(out)
        return out


def _moves(args, kwargs) -> bool:
    """Whether a .to / copy_ call names a device (a device, a device string or a tensor on some device)."""
    for a in list(args[1:]) + list(kwargs.values()):
        if isinstance(a, (torch.device, str)) or (isinstance(a, torch.Tensor) and not is_host(a)):
            return True
    return False
