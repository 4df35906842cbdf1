"""torch.compile'd decode steps, as gpt-fast does it: one static-shape step function (generate.decode_step), compiled
once per process with fullgraph=True and dynamic=False, so every (model shape, cache rows) gets one graph, built on
its first call and reused for every position (the position is a tensor input, the causal mask is built from it).

CUDA: mode "reduce-overhead" (CUDA graphs; a decode step of a small batch is launch-bound). CUDA graphs replay on
fixed addresses, so the compiled path keeps one KV cache per (model, rows, dtype) alive between calls
(`setup_static_cache`) instead of allocating a fresh one per batch as GPT.setup_cache does; a new address would
re-record the graph on every batch. CPU: inductor's default mode (C++/OpenMP kernels, no graphs to replay).

Sampling stays outside the compiled region: it draws from per-image CPU torch.Generators.
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch

from lantern.engine.models.drafter import Drafter
from lantern.engine.models.model import GPT
from lantern.errors import UserError

# Distinct static shapes one step function may compile to before dynamo falls back to eager: model shapes x batch
# sizes (a shard's last batch is smaller) x CFG on / off; dynamo's default (8) is easily reached by a test session.
RECOMPILE_LIMIT = 64

_compiled: dict[tuple[Callable, str], Callable] = {}
_caches: "weakref.WeakKeyDictionary[GPT, dict]" = weakref.WeakKeyDictionary()


def compile_mode(device) -> str | None:
    """torch.compile mode for a device: CUDA graphs on CUDA, inductor's default elsewhere."""
    return "reduce-overhead" if torch.device(device).type == "cuda" else None


def resolve(option, device) -> bool:
    """A `compile` option (true / false / "auto" / None) -> whether to compile: "auto" and None mean on CUDA only."""
    if option is None or option == "auto":
        return torch.device(device).type == "cuda"
    if isinstance(option, bool):
        return option
    raise UserError(f"compile must be true, false or auto, got {option!r}")


def compiled_step(fn: Callable, device) -> Callable:
    """torch.compile(fn) for `device`'s mode, built once per process (dynamo then keys its graphs by shape)."""
    mode = compile_mode(device)
    key = (fn, mode or "default")
    if key not in _compiled:
        cfg = torch._dynamo.config
        if cfg.recompile_limit < RECOMPILE_LIMIT:
            cfg.recompile_limit = RECOMPILE_LIMIT
        _compiled[key] = torch.compile(fn, mode=mode, fullgraph=True, dynamic=False)
    return _compiled[key]


def static_buffer(owner, name: str, shape, dtype: torch.dtype, device) -> torch.Tensor:
    """A zeroed tensor kept between calls for `owner` (a model), one per (name, shape, dtype, device), at a static
    address: a CUDA graph that updates it in place (chain_graph.chain_round's state) is recorded once and replayed
    for every later batch of that shape."""
    store = _caches.setdefault(owner, {})
    key = (name, tuple(shape), dtype, torch.device(device))
    if key not in store:
        store[key] = torch.zeros(shape, dtype=dtype, device=device)
        torch._dynamo.mark_static_address(store[key])
        return store[key]
    return store[key].zero_()


def setup_static_cache(model, batch: int, dtype: torch.dtype | None = None, extra: int = 0,
                       cond_mask: torch.Tensor | None = None) -> None:
    """model.setup_cache on buffers kept between calls, for a target (GPT.setup_cache(batch, dtype, extra)) or a
    drafter (Drafter.setup_cache(batch, extra, cond_mask), in its weights' dtype): the same KV tensors (zeroed) and
    key-valid mask every time for a given (model, batch, dtype, extra), so a compiled / CUDA-graphed step sees fixed
    input addresses. Same state as a fresh setup_cache; model.clear_cache() detaches it as usual."""
    drafter = isinstance(model, Drafter)
    p = model.output.weight
    dtype = p.dtype if drafter or dtype is None else dtype
    store = _caches.setdefault(model, {})
    key = (batch, dtype, p.device, model.args.max_seq_len + extra)
    if key not in store:
        if drafter:
            model.setup_cache(batch, extra, cond_mask)
        else:
            model.setup_cache(batch, dtype, extra)
        store[key] = ([layer.attention.kv_cache for layer in model.layers], model.cache_key_valid)
        return
    caches, key_valid = store[key]
    for layer, cache in zip(model.layers, caches):
        cache.k.zero_()
        cache.v.zero_()
        layer.attention.kv_cache = cache
    key_valid.fill_(True)
    model.cache_key_valid = key_valid
    if drafter:
        model.set_cond_mask(cond_mask)
