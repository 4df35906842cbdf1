"""`lantern convert`: the LANTERN authors' LlamaGen files -> ours (their layout is read by `hf.py`).

--kind target   their HF-converted LlamaGen -> the upstream LlamaGen container {"model": state_dict} that `load_gpt`
                reads with a target spec (plus its ModelArgs, which carry config.json's rms_norm_eps and RoPE base
                when they are not upstream's 1e-5 / 10000).
--kind drafter  their one-layer EAGLE drafter for LlamaGen -> a drafter checkpoint for --target, with the drafter's
                own token embedding and the options (`DrafterOptions`) under which our forward computes theirs.
`lantern.load_llamagen` reads the same folders in memory through the same readers.
"""

from __future__ import annotations

import argparse
import json

from lantern.errors import UserError


def printable_spec(args) -> dict:
    """The --target-spec that loads the converted file (named size where it is one)."""
    from lantern.engine.models.model import GPT_SIZES

    size = next((name for name, v in GPT_SIZES.items() if v == {"n_layer": args.n_layer, "n_head": args.n_head,
                                                                  "dim": args.dim}), None)
    spec = {"model_type": args.model_type, "gpt_size": size or {"dim": args.dim, "n_layer": args.n_layer,
                                                                 "n_head": args.n_head},
            "image_tokens": args.image_tokens, "cls_token_num": args.cls_token_num}
    if args.model_type == "c2i":
        spec["num_classes"] = args.num_classes
    return spec


# -- CLI --------------------------------------------------------------------------------------------------------------
def main(argv: list[str]) -> None:
    from lantern.engine.models.model import ModelArgs
    from lantern.io import read_structured, save_torch
    from lantern.worlds.llamagen.hf import read_authors_drafter, read_authors_target

    ap = argparse.ArgumentParser(prog="lantern convert", description=__doc__.split("\n")[0])
    ap.add_argument("--kind", required=True, choices=("target", "drafter"))
    ap.add_argument("--src", required=True, help="the authors' model folder or weights file")
    ap.add_argument("--out", required=True, help="converted checkpoint")
    ap.add_argument("--target", default=None, help="GPT checkpoint the drafter serves (--kind drafter)")
    ap.add_argument("--target-spec", default=None,
                    help="llamagen target config (JSON/YAML or file): of --target (drafter), or of --src (target)")
    a = ap.parse_args(argv)
    if a.kind == "drafter" and not a.target:
        raise UserError("--kind drafter needs --target (the GPT checkpoint the drafter serves, with --target-spec)")
    if a.kind == "target":
        args, sd = read_authors_target(a.src, read_structured(a.target_spec, "--target-spec"))
        # Upstream LlamaGen computes with eps 1e-5 and RoPE base 10000; other values stated in config.json travel
        # inside the converted file, never silently replaced. The args travel always (as our checkpoints carry
        # theirs): the weights do not show the token grid, and a file without it loaded under another spec (a
        # stage-II target as stage I) decoded with logits silently off; with it, load_gpt refuses that spec.
        upstream = ModelArgs()
        differs = {k: getattr(args, k) for k in ("norm_eps", "rope_base") if getattr(args, k) != getattr(upstream, k)}
        save_torch({"model": sd, "args": args.to_dict()}, a.out)
        spec = json.dumps(printable_spec(args))
        note = f"; carries {', '.join(f'{k} {v:g}' for k, v in differs.items())} from config.json" if differs else ""
        print(f"target {a.src} -> {a.out} ({len(sd)} tensors{note}); load it with --target-spec '{spec}'")
        return
    from lantern.engine.models.drafter import build_drafter, save_drafter
    from lantern.worlds.llamagen.upstream import load_gpt

    spec = {"spec": read_structured(a.target_spec, "--target-spec")} if a.target_spec else {}
    target = load_gpt(a.target, **spec)
    drafter = build_drafter(target.args, *read_authors_drafter(a.src, target.args), target, a.src)
    save_drafter(a.out, drafter, converted_from=str(a.src), target=str(a.target))
    print(f"drafter {a.src} -> {a.out} (own embedding, norm eps {drafter.options.norm_eps}, code-0 condition inputs)")
