"""Write the docs' generated tables from committed records, so a page never quotes a number its source lost.

    python workflow/scripts/doc_tables.py           # rewrite every generated table in place
    python workflow/scripts/doc_tables.py --check   # exit 1, naming the table, where a page differs

A page marks each table it takes from here with `<!-- generated: NAME ... -->` and `<!-- end generated -->`;
what lies between is this script's output. `tests/test_docs.py` fails when a page and this script disagree: after
`make ship-toy` (or `ship_toy.py --only ...`) rerun this script and commit the page with the models.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models" / "toy"


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _drafter(path: Path) -> dict:
    """The drafter file's record: parameters counted from its weights, the last epoch's held-out metrics."""
    import torch  # only the drafter's record lives inside a torch file

    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    last = ckpt["metrics"]["history"]
    last = last[-1] if isinstance(last, list) else last
    return {"params": sum(t.numel() for t in ckpt["drafter"].values()), "epochs": ckpt["params"]["epochs"],
            "n_train": ckpt["metrics"]["n_train"], "layers": list(ckpt["options"].get("feature_layers") or []),
            "unroll": ckpt["params"].get("unroll", 1), "accept": last["val_accept"],
            "accept_2": last.get("val_accept_2")}


def models_table(models: Path = MODELS) -> str:
    """The shipped toy models: size, training and held-out result, from their .json records and the drafter file."""
    rows = ["| world | model | parameters | training (2 CPU threads) | held-out result |", "|---|---|---|---|---|"]
    for world in ("default", "clean"):
        folder = models / world
        vq = _json(folder / "vq.json")["metrics"]
        rows.append(f"| {world} | VQ, {vq['codes_used']} codes used | {vq['params'] / 1e6:.2f}M | {vq['steps']} steps, "
                    f"{_minutes(vq['train_seconds'])} | reconstruction PSNR {vq['psnr']:.1f} dB |")
        gpt = _json(folder / "target.json")
        m, a = gpt["metrics"], gpt["model_args"]
        steps = gpt["params"]["steps"]
        rows.append(f"| {world} | target GPT, {a['n_layer']} x {a['dim']} | {m['params'] / 1e6:.2f}M | {steps} steps, "
                    f"{_minutes(m['train_seconds'])} | loss {m['val_loss']:.2f} (train {m['train_loss']:.2f}), "
                    f"perplexity {m['val_perplexity']:.1f} of {a['vocab_size']} codes |")
        if (folder / "drafter.pt").is_file():
            d = _drafter(folder / "drafter.pt")
            reads = f"h_t + layers {', '.join(map(str, d['layers']))}" if d["layers"] else "h_t"
            second = f", second step {d['accept_2']:.3f}" if d["accept_2"] is not None and d["unroll"] > 1 else ""
            rows.append(f"| {world} | drafter, reads {reads}, unroll {d['unroll']} | {d['params'] / 1e6:.3f}M | "
                        f"{d['epochs']} epochs over {d['n_train']} own samples | "
                        f"acceptance {d['accept']:.3f}{second} |")
        if (folder / "classifier.json").is_file():
            c = _json(folder / "classifier.json")["metrics"]
            rows.append(f"| {world} | classifier | {c['num_params'] / 1e6:.3f}M | {c['n_train']} images, "
                        f"{_minutes(c['train_seconds'])} | accuracy {c['val_accuracy']:.3f} (originals), "
                        f"{c['val_accuracy_recon']:.4f} (VQ reconstructions); chance {c['chance']:.3f} |")
        if (folder / "clip.metrics.json").is_file():
            c = _json(folder / "clip.metrics.json")
            rows.append(f"| {world} | CLIP ({c['params']['image_tower']} image tower) | {c['params_millions']:.2f}M | "
                        f"{c['params']['steps']} steps, {_minutes(c['train_seconds'])} | image-caption top-1 "
                        f"{c['val_top1_originals']:.3f} (originals), {c['val_top1_recon']:.3f} (reconstructions) |")
    return "\n".join(rows)


RECORD = ROOT / "benchmarks" / "records" / "gpu_rounds.csv"
# what issue 51 asks of a round on GPT-XL at batch 1 / 8, in plain-AR tokens (chain: exact and LANTERN)
ROUND_TARGETS = {("chain", 1): 1.4, ("chain", 8): 1.8, ("static", 1): 1.8, ("static", 8): 2.5, ("dynamic", 1): 2.2}


def gpu_rounds_table(record: Path = RECORD) -> str:
    """The newest row of the GPU round record per (size, decoder, batch): a round's cost against plain AR."""
    import csv

    with open(record, newline="") as f:
        rows = list(csv.DictReader(f))
    newest, latest = {}, rows[-1]["commit"] if rows else ""
    for r in rows:  # appended in time order: a later row replaces an earlier one of the same key
        newest[(r["size"], r["spec"], int(r["batch"]))] = r
    out = ["| target | decoder | batch | round | plain AR per token | round in AR tokens | target | syncs / round | "
           "host ops / round | device, torch | date |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (size, spec, batch), r in sorted(newest.items()):
        goal = ROUND_TARGETS.get((spec.split("-")[0], batch)) if size == "GPT-XL" else None
        mark = "" if r["commit"] == latest else " *"
        out.append(f"| {size} | {spec}{mark} | {batch} | {float(r['round_ms']):.2f} ms | {float(r['ar_ms_per_token']):.2f} ms "
                   f"| {float(r['round_in_ar_tokens']):.2f} | {'<= %.1f' % goal if goal else ''} | "
                   f"{r['syncs_per_round']} | {r['host_ops_per_round']} | {r['device']}, {r['torch']} | {r['date']} |")
    return "\n".join(out)


# page (under docs/) -> table name -> generator
TABLES = {"toy-world.md": {"shipped-models": models_table}, "gpu-costs.md": {"gpu-rounds": gpu_rounds_table}}
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+)[^>]*-->\n)(?P<body>.*?)\n?<!-- end generated -->", re.S)
END = "\n<!-- end generated -->"


def render(text: str, tables: dict) -> str:
    """`text` with every generated block's body replaced by its table; a block this script does not know stays."""
    return BLOCK.sub(lambda m: m.group(1) + tables[m.group("name")]() + END if m.group("name") in tables
                     else m.group(0), text)


def blocks(text: str) -> dict[str, str]:
    return {m.group("name"): m.group("body") for m in BLOCK.finditer(text)}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for page, tables in TABLES.items():
        path = ROOT / "docs" / page
        text = path.read_text()
        missing = sorted(set(tables) - set(blocks(text)))
        if missing:
            print(f"{path}: no <!-- generated: {missing[0]} --> block", file=sys.stderr)
            return 1
        new = render(text, tables)
        if new != text:
            stale.append(page)
            if not check:
                path.write_text(new)
    verb = "differ from the records" if check else "rewritten"
    print(f"{', '.join(stale)}: {verb}" if stale else "every generated table is up to date")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
