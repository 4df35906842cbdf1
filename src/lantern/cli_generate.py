r"""`lantern generate`: a few images with one method, written as a grid, with tau and the speed-up over plain AR.

    lantern generate --classes ring star -n 8 --method lantern --delta 0.1 --k 3 --out grid.png

The shipped toy world by default; LlamaGen files with the config's llamagen keys as flags (--gpt-ckpt, --vq-ckpt,
--drafter-ckpt or --authors-drafter, --neighbours, --gpt-size, ...); a Chameleon-family world (Anole, Lumina-mGPT)
with --family and the chameleon keys as flags, prompts as text, through lantern.load_chameleon:

    lantern generate --family lumina-mgpt --target DIR --vqgan-ckpt FILE --tokenizer FILE --drafter DIR \
        --prompts "a red apple" "a cat" -n 4 --method lantern --delta 0.1 --k 1000 --drafting static \
        --tree mc_sim_7b_63 --out grid.png

Its sampling defaults are the authors' (CFG 3, top-k 2000), its method default their LANTERN point (delta 0.1,
k 1000, the family's drafting and residual as in config/<family>.yaml), its dtype bf16.

Plain AR decodes the same seeds in the same process right after the method (both after one untimed warm-up image), so
the speed-up compares like with like; --no-baseline skips it. Method parameters are flags named as in the config
(--delta, --k, --lam, --gamma, --drafting, --tree, --window, ...; the dynamic tree's top_k is --tree-top-k, as
--top-k is the sampling filter).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from lantern.errors import UserError

SAMPLING = ("cfg_scale", "cfg_interval", "temperature", "top_k", "top_p")
LLAMAGEN = ("gpt_ckpt", "vq_ckpt", "drafter_ckpt", "authors_drafter", "neighbours", "t5")
DEFAULT_POINT = {"delta": 0.1, "k": 3}  # config/config.yaml's default LANTERN point
# a Chameleon family's: the authors' CLI defaults (delta 0.1, lantern_k 1000) with the recipes' drafting and residual
FAMILY_POINT = {"anole": {"delta": 0.1, "k": 1000, "drafting": "dynamic", "residual": "reference"},
                "lumina-mgpt": {"delta": 0.1, "k": 1000, "drafting": "static", "tree": "mc_sim_7b_63",
                                "residual": "lumina"}}
CHAMELEON = {"target": str, "vqgan_ckpt": str, "vqgan_yaml": str, "tokenizer": str, "drafter": str, "pixels": int,
             "prompt_tokens": int}  # the config's chameleon keys (load_chameleon's arguments)
SPEC = {"gpt_size": str, "model_type": str, "num_classes": int, "image_size": int, "downsample": int,
        "cls_token_num": int}


def method_params() -> dict:
    """Every registered method parameter by name (the first family or drafting kind declaring it)."""
    from lantern.engine.methods import DRAFTINGS, FAMILIES

    params: dict = {}
    for p in [p for f in FAMILIES.values() for p in f.params] + [p for d in DRAFTINGS.values() for p in d.params]:
        params.setdefault(p.name, p)
    return params


def method_flags() -> dict[str, str]:
    """Every registered method parameter -> its flag (`top_k` of the dynamic tree: --tree-top-k)."""
    return {name: "--tree-top-k" if name == "top_k" else "--" + name.replace("_", "-") for name in method_params()}


def parse_value(text: str):
    """A flag's value typed as in a YAML config: 0.1 a float, 3 an int, [[0], [1]] a list, chain a string."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_args(argv: list[str]):
    ap = argparse.ArgumentParser(prog="lantern generate", description=__doc__.split("\n")[0])
    ap.add_argument("--classes", nargs="+", default=None, help="class names (toy world) or ids, cycled over the "
                    "images (default: every class in turn)")
    ap.add_argument("--prompts", nargs="+", default=None, help="t2i: prompts, cycled over the images (LlamaGen t2i: "
                    "needs --t5; a Chameleon family: as text through its template)")
    ap.add_argument("-n", "--images", type=int, default=8, help="number of images (default 8)")
    ap.add_argument("--method", default=None, help="method family (`lantern methods`); default: lantern at the "
                    "default run's point, --delta 0.1 --k 3 (with --family the authors': --delta 0.1 --k 1000, the "
                    "recipe's drafting and residual)")
    for (name, flag), param in zip(method_flags().items(), method_params().values()):
        ap.add_argument(flag, dest=f"m_{name}", default=None, metavar="VALUE", help=f"method {name}: {param.doc}")
    ap.add_argument("--drafting", default=None, help="drafting kind: chain, static, dynamic, jacobi")
    for name in SAMPLING:
        ap.add_argument("--" + name.replace("_", "-"), dest=f"s_{name}", type=float if name in ("cfg_scale",
                        "temperature", "top_p") else int, default=None, metavar="VALUE",
                        help=f"sampling.{name} (default: the default run's, CFG 2; a Chameleon "
                        "family's: the authors', CFG 3, top-k 2000)")
    ap.add_argument("--mode", choices=("sampling", "greedy"), default="sampling")
    ap.add_argument("--seed", type=int, default=0, help="global seed; image i draws from a seed of (seed, i)")
    ap.add_argument("--batch-size", type=int, default=1, help="images decoded together; 1 (default) is the paper's "
                    "per-image latency, which its speed-ups report")
    ap.add_argument("--out", default="grid.png", help="the image grid (PNG or JPEG; written atomically)")
    ap.add_argument("--columns", type=int, default=8, help="images per grid row")
    ap.add_argument("--no-baseline", action="store_true", help="skip plain AR on the same seeds (no speed-up)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default=None, choices=("fp32", "bf16", "fp16"), help="default fp32; with --family "
                    "bf16 (load_chameleon's)")
    ap.add_argument("--compile", default="auto", choices=("auto", "true", "false"))
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0: one for the toy world (its small "
                    "kernels run slower on two threads of a busy 2-core machine), torch's default for LlamaGen and "
                    "Chameleon files")
    for name in LLAMAGEN:
        ap.add_argument("--" + name.replace("_", "-"), dest=name, default=None, help=f"llamagen.{name}")
    for name, kind in SPEC.items():
        ap.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None, help=f"llamagen.{name}")
    ap.add_argument("--neighbours-k", type=int, default=None, help="columns of a neighbour table built on the fly "
                    "(default 200; with --family at least the method's k + 1)")
    ap.add_argument("--family", default=None, help="a Chameleon-family world from its released files: anole or "
                    "lumina-mgpt (with --target, --vqgan-ckpt, --tokenizer, and --drafter for drafted methods)")
    for name, kind in CHAMELEON.items():
        ap.add_argument(flag_of(name), dest=name, type=kind, default=None, help=f"with --family: chameleon.{name}")
    return ap.parse_args(argv)


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_world_flags(a) -> None:
    """The flags name one world: toy, LlamaGen (--gpt-ckpt ...) or a Chameleon family (--family ...); one line for
    a mix, before anything loads."""
    llamagen = [flag_of(k) for k in (*LLAMAGEN, *SPEC) if getattr(a, k) is not None]
    chameleon = [flag_of(k) for k in CHAMELEON if getattr(a, k) is not None]
    if a.family is None:
        if chameleon:
            raise UserError(f"{', '.join(chameleon)} describe a Chameleon world: also give --family anole or "
                            "--family lumina-mgpt")
        return
    from lantern.worlds.chameleon.prompts import FAMILIES

    if a.family not in FAMILIES:
        raise UserError(f"--family {a.family}: not a Chameleon family; use one of {', '.join(FAMILIES)}")
    if llamagen:
        raise UserError(f"{', '.join(llamagen)} describe a LlamaGen world, not a {a.family} one; drop them (its "
                        "files are --target, --vqgan-ckpt, --tokenizer, --drafter)")
    if missing := [flag_of(k) for k in ("target", "vqgan_ckpt", "tokenizer") if getattr(a, k) is None]:
        raise UserError(f"--family {a.family} needs {', '.join(missing)} (the released HF folder, tokenizer/"
                        "vqgan.ckpt and tokenizer.json)")
    if a.classes:
        raise UserError(f"--classes are for class-conditional worlds; a {a.family} world takes --prompts as text")
    if not a.prompts:
        raise UserError(f"a {a.family} world draws each image for a prompt: give --prompts \"a red apple\" ...")


def check_family_method(a, spec: dict) -> int | None:
    """Before a Chameleon world loads: a method it cannot run is one line. Returns the neighbour table's width."""
    from lantern.api import NEIGHBOURS_MAX_K
    from lantern.engine.decoding.kinds import layout_refusal
    from lantern.engine.methods import drafting, needs_drafter, rule, speculative
    from lantern.worlds.chameleon.world import DEFAULT_PIXELS, family_layout

    if needs_drafter(spec) and a.drafter is None:
        raise UserError(f"method {spec['name']} with {spec['drafting']} drafting needs the authors' drafter folder: "
                        "give --drafter (or --drafting jacobi, which needs none)")
    layout, _, _ = family_layout(a.family, DEFAULT_PIXELS[a.family] if a.pixels is None else a.pixels)
    if layout is not None and speculative(spec):  # Lumina-mGPT's: forced eol / eoi tokens
        refused = layout_refusal(drafting(spec), a.compile == "true", rule(spec), layout.codebook)
        if refused:
            raise UserError(f"--family {a.family} (forced structural tokens): {refused}")
    width = rule(spec).table_width if speculative(spec) else 0
    if a.neighbours_k is not None and a.neighbours_k < width:
        raise UserError(f"--neighbours-k {a.neighbours_k}: the method reads the {width} nearest codes of each code; "
                        f"give --neighbours-k >= {width} or a lower --k")
    return a.neighbours_k if a.neighbours_k is not None or width <= NEIGHBOURS_MAX_K else width


def image_format(path: Path) -> str:
    from PIL import Image

    fmt = Image.registered_extensions().get(path.suffix.lower())
    if fmt is None:
        raise UserError(f"--out {path}: unknown image type {path.suffix or '(no suffix)'}; end it in .png or .jpg")
    return fmt


def check_out(out: Path) -> None:
    """The grid's target, before anything is decoded: a writable file path in an existing folder."""
    import os

    if out.is_dir():
        raise UserError(f"--out {out} is a folder; give the grid's file name (e.g. --out {out / 'grid.png'})")
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: folder {out.parent} does not exist; create it or write elsewhere")
    # the grid is written beside its name and renamed onto it: the folder must take new files
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise UserError(f"--out {out}: folder {out.parent} is not writable for this user; make it writable "
                        "(chmod / chown) or give --out a path in a writable folder")


def load(a, neighbours_k: int | None = None):
    """The world the flags name: toy unless --gpt-ckpt / --vq-ckpt or --family are given."""
    from lantern.api import load_llamagen, load_world

    if a.family is not None:
        from lantern.api_chameleon import load_chameleon

        given = {k: getattr(a, k) for k in ("vqgan_yaml", "pixels", "prompt_tokens", "dtype")
                 if getattr(a, k) is not None}
        return load_chameleon(a.family, target=a.target, vqgan_ckpt=a.vqgan_ckpt, tokenizer=a.tokenizer,
                              drafter=a.drafter, neighbours_k=neighbours_k, device=a.device, **given)
    a.dtype = a.dtype or "fp32"
    if a.gpt_ckpt or a.vq_ckpt:
        if not (a.gpt_ckpt and a.vq_ckpt):
            raise UserError("a LlamaGen world needs both --gpt-ckpt and --vq-ckpt")
        spec = {k: getattr(a, k) for k in SPEC if getattr(a, k) is not None}
        if "gpt_size" in spec and spec["gpt_size"].startswith("{"):
            spec["gpt_size"] = parse_value(spec["gpt_size"])
        return load_llamagen(**{k: getattr(a, k) for k in LLAMAGEN}, **spec, neighbours_k=a.neighbours_k,
                             device=a.device, dtype=a.dtype)
    given = [f"--{k.replace('_', '-')}" for k in (*LLAMAGEN, *SPEC) if getattr(a, k) is not None]
    if given:
        raise UserError(f"{', '.join(given)} describe a LlamaGen world: also give --gpt-ckpt and --vq-ckpt, or "
                        "drop them for the toy world")
    return load_world("toy", device=a.device, dtype=a.dtype, neighbours_k=a.neighbours_k)


def conditions(world, a) -> list:
    """One condition per image: the given classes or prompts cycled, else every class in turn."""
    if a.images < 1:
        raise UserError(f"-n {a.images}: give at least one image")
    if world._prompts is not None:  # a Chameleon family (check_world_flags: --prompts given, no --classes)
        given = a.prompts
    elif world.model_type == "t2i":
        if not a.prompts:
            raise UserError("a text-to-image world needs --prompts (and --t5, a local flan-t5 folder)")
        given = a.prompts
    else:
        if a.prompts:
            raise UserError("--prompts are for text-to-image targets; this one is class-conditional: use --classes")
        given = [int(c) if c.isdigit() else c for c in a.classes] if a.classes else \
            list(range(world.target.args.num_classes))
    return [given[i % len(given)] for i in range(a.images)]


def main(argv: list[str]) -> None:
    a = parse_args(argv)
    out = Path(a.out)
    fmt = image_format(out)
    check_out(out)
    if a.columns < 1:
        raise UserError(f"--columns {a.columns} must be >= 1")
    from lantern.api import generate, method_spec
    from lantern.io import atomic_path

    given = {name: getattr(a, f"m_{name}") for name in method_flags()}
    params = {name: parse_value(value) for name, value in given.items() if value is not None}
    if a.drafting is not None:
        params["drafting"] = a.drafting
    check_world_flags(a)
    if a.method is None:
        a.method, params = "lantern", {**FAMILY_POINT.get(a.family, DEFAULT_POINT), **params}
    spec = method_spec(a.method, **params)  # a bad method is one line before any model loads (k is checked again below)
    neighbours_k = check_family_method(a, spec) if a.family else a.neighbours_k
    sampling = {name: getattr(a, f"s_{name}") for name in SAMPLING if getattr(a, f"s_{name}") is not None}
    import torch

    if a.threads > 0 or not (a.gpt_ckpt or a.vq_ckpt or a.family):
        torch.set_num_threads(a.threads or 1)
    world = load(a, neighbours_k)
    conds = conditions(world, a)
    common = dict(seed=a.seed, mode=a.mode, sampling=sampling, batch_size=a.batch_size, compile=a.compile,
                  warmup=True, progress=not a.quiet)
    images = generate(world, conds, a.method, **common, **params)
    with atomic_path(out, elsewhere="give --out") as tmp:
        images.grid(a.columns).save(tmp, format=fmt)
    authors = ""
    if world.layout is not None and images.method["name"] != "vanilla":  # Lumina-mGPT: their count beside ours
        from lantern.engine.models.layout import tau_authors

        forwards = sum(s["target_forwards"] for s in images.stats) / len(images.stats)
        authors = f" (the authors' count, forced tokens included: {tau_authors(world.layout, forwards):.2f})"
    print(f"{images.point} ({a.mode}): {len(conds)} images, tau {images.tau:.2f}{authors}, {images.seconds:.2f} s "
          "decoding")
    if not a.no_baseline and images.method["name"] != "vanilla":
        plain = generate(world, conds, "vanilla", **common)
        print(f"plain AR on the same seeds: {plain.seconds:.2f} s; speed-up {plain.seconds / images.seconds:.2f}x "
              "(one process, one machine load: quote it beside a benchmark)")
    print(f"wrote {out}")
