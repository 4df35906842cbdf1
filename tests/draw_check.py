"""A CPU-side check for the CUDA-only crash of a random draw made off its generator's device.

On CUDA, `torch.randint(..., generator=<CPU generator>, device=<a CUDA tensor's device>)` raises "Expected a 'cuda'
device type for generator but found 'cpu'". On a CPU both devices are "cpu", so the crash cannot happen there and
tests never saw it. `generator_device_check()` makes the mistake visible on a CPU:
- while it is active, `torch.Generator` builds a `CheckedGenerator`, whose `.device` is one fixed `torch.device`
  object, so code that draws with `device=generator.device` passes that very object;
- a TorchFunctionMode inspects every torch call that gets a generator: a factory draw (torch.rand / randint /
  randperm ...) may omit `device=` (it draws on the default device, the CPU, as CPU generators need) or pass the
  generator's own device object; any other `device=` (a tensor's device, a string) is the CUDA crash and fails;
- a draw into or from a tensor with a generator (`uniform_`, `multinomial` ...) fails too: its device is the
  tensor's, which a CPU run cannot tell apart from the generator's (draw uniforms on generator.device instead);
- a generator made before the check started is refused, so nothing drawn escapes the check unseen.
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

_Generator = torch.Generator


class CheckedGenerator(_Generator):
    """A torch.Generator whose `.device` is one object for its whole life (the check compares by identity)."""

    @property
    def device(self) -> torch.device:
        if "_device" not in self.__dict__:
            self.__dict__["_device"] = _Generator.device.__get__(self)
        return self.__dict__["_device"]


class DrawOffGenerator(AssertionError):
    pass


def _where(func) -> str:
    return getattr(func, "__name__", repr(func))


class GeneratorDeviceMode(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.draws = 0  # generator draws checked (a test asserts the check saw something)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        gens = [a for a in (*args, *kwargs.values()) if isinstance(a, _Generator)]
        if gens:
            self.draws += 1
            g = gens[0]
            if not isinstance(g, CheckedGenerator):
                raise DrawOffGenerator(f"{_where(func)}: a generator made before generator_device_check() began; "
                                       "make the generators inside the check")
            if any(isinstance(a, torch.Tensor) for a in (*args, *kwargs.values())):
                raise DrawOffGenerator(
                    f"{_where(func)} draws with a generator into or from a tensor, on the tensor's device, which a "
                    "CPU run cannot tell from the generator's; draw on generator.device (torch.rand(..., "
                    "device=generator.device)) and move the result")
            device = kwargs.get("device")
            if device is not None and device is not g.device:
                raise DrawOffGenerator(
                    f"{_where(func)}(device={device!r}) draws with a generator on {g.device}: on CUDA this raises "
                    "\"Expected a 'cuda' device type for generator\"; pass device=generator.device and move the "
                    "result with .to()")
        return func(*args, **kwargs)


@contextlib.contextmanager
def generator_device_check():
    """Within: generators are CheckedGenerators and every draw with one is checked; yields the mode (`.draws`)."""
    torch.Generator = CheckedGenerator
    try:
        with GeneratorDeviceMode() as mode:
            yield mode
    finally:
        torch.Generator = _Generator
