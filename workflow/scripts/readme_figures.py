"""Copy the default run's trade-off figure and sample grid into docs/img/ for the README (`make readme-figures`).

    python workflow/scripts/readme_figures.py [results] [docs/img]

Each figure is shrunk until its PNG is under MAX_BYTES (width capped at MAX_WIDTH, then a 256-colour palette,
then smaller widths), so the repository keeps small files. SOURCE.json beside them records the git commit(s) that
made the results (from `tables/sweep.csv`), the commit checked out when they were copied, and the source files'
SHA-256, so a README figure can be traced to its run. Every file is written atomically.
"""

from __future__ import annotations

import io
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
from PIL import Image

from lantern.errors import UserError
from lantern.figures.style import FAMILY_COLORS, OTHER_COLORS
from lantern.io import atomic_path, sha256_file, write_json

# README name -> figure under <results>/figures/
FIGURES = {"tradeoff.png": "tradeoff.png", "samples.png": "samples_sampling.png"}
MAX_BYTES = 250_000
MAX_WIDTH = 1400
MIN_WIDTH = 200  # narrower than this, a README figure is unreadable: refuse instead


# Colours the palette keeps exactly: a median cut alone merged LANTERN's and Cool-SD's (and moved the rest), so
# the README's trade-off figure could not tell families apart
KEEP = ["#ffffff", "#000000", *FAMILY_COLORS.values(), *OTHER_COLORS]


def palette_of(im: Image.Image) -> Image.Image:
    """A 256-colour palette: the figures' colours exactly, the median cut of the image for the rest."""
    keep = [int(c[i:i + 2], 16) for c in dict.fromkeys(c.lower() for c in KEEP) for i in (1, 3, 5)]
    n = 256 - len(keep) // 3
    rest = im.quantize(colors=n, method=Image.Quantize.MEDIANCUT).getpalette()[:3 * n]
    pal = Image.new("P", (1, 1))
    pal.putpalette(keep + rest + [0] * (768 - len(keep) - len(rest)))
    return pal


def png_bytes(im: Image.Image, palette: bool) -> bytes:
    if palette:
        rgb = im.convert("RGB")
        im = rgb.quantize(palette=palette_of(rgb), dither=Image.Dither.NONE)
    buf = io.BytesIO()
    im.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def shrink(path: Path) -> tuple[bytes, tuple[int, int]]:
    """The largest PNG of `path` under MAX_BYTES: full colour first, then a palette, then narrower."""
    with Image.open(path) as src:
        im = src.convert("RGBA") if src.mode in ("RGBA", "LA", "P") else src.convert("RGB")
    width = min(im.width, MAX_WIDTH)
    while width >= MIN_WIDTH:
        scaled = im if width == im.width else im.resize((width, round(im.height * width / im.width)), Image.LANCZOS)
        for palette in (False, True):
            data = png_bytes(scaled, palette)
            if len(data) <= MAX_BYTES:
                return data, scaled.size
        width = int(width * 0.8)
    raise UserError(f"{path}: no PNG of it {MIN_WIDTH} px or wider is under {MAX_BYTES} bytes; raise MAX_BYTES in {__file__}")


def git(*args: str) -> str:
    out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10)
    return out.stdout.strip() if out.returncode == 0 else ""


def main(argv: list[str]) -> None:
    results = Path(argv[0] if argv else "results")
    out = Path(argv[1] if len(argv) > 1 else "docs/img")
    sources = {name: results / "figures" / fig for name, fig in FIGURES.items()}
    sweep = results / "tables" / "sweep.csv"
    missing = [str(p) for p in [*sources.values(), sweep] if not p.is_file()]
    if missing:  # checked before anything is written, so a half-finished run never replaces the figures
        raise UserError(f"{', '.join(missing)} missing; run `make run` first (outdir {results})")
    table = pd.read_csv(sweep)
    if "git_commit" not in table:
        raise UserError(f"{sweep} has no git_commit column; rerun `make run` with this version")
    commits = sorted({str(c) for c in table["git_commit"].dropna()})
    entry = {"results": str(results), "results_git_commits": commits, "copied_at_git_commit": git("rev-parse", "HEAD"),
             "copied_with_uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no")),
             "copied_at_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "files": {}}
    shrunk = {name: shrink(src) for name, src in sources.items()}  # all of them before any is written
    for name, src in sources.items():
        data, size = shrunk[name]
        with atomic_path(out / name) as tmp:
            tmp.write_bytes(data)
        entry["files"][name] = {"from": str(src), "source_sha256": sha256_file(src), "bytes": len(data),
                                "width": size[0], "height": size[1]}
        print(f"{out / name}: {len(data) // 1000} kB, {size[0]} x {size[1]} px, from {src}")
    write_json(out / "SOURCE.json", entry)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
