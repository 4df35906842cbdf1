"""What the figure modules share: reading the tidy tables, point labels and picking representative points."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lantern.errors import UserError
from lantern.io import read_csv
from lantern.engine import methods
from lantern.pipeline.tables import order_key


FID_FEATURES = {"toyclip": "toy-CLIP features", "clip": "CLIP features", "inception-v3-compat": "Inception-v3"}


def fid_label(df: pd.DataFrame, short: bool = False) -> str:
    """The FID axis names its feature extractor: a toy-CLIP Frechet distance is not the Inception FID."""
    found = sorted(df["fid_extractor"].dropna().astype(str).unique()) if "fid_extractor" in df else []
    features = ", ".join(FID_FEATURES.get(e, e) for e in found)
    if short:
        return f"FID ({features})" if features else "FID"
    return f"FID, {features} (lower is better)" if features else "FID (lower is better)"


def speed_label(df: pd.DataFrame) -> str:
    """The speed axis names its ratio: in-job (plain AR timed in the method's own job) or across jobs, and the
    batch size when images were decoded in batches (a throughput ratio, not a latency one)."""
    kinds = sorted(df["speedup_kind"].dropna().unique()) if "speedup_kind" in df else []
    batches = sorted(int(b) for b in df["batch_size"].dropna().unique()) if "batch_size" in df else []
    if batches and batches != [1] and not any("batch 1" in k for k in kinds):
        kinds.append("batch " + "/".join(map(str, batches)))
    return f"speed-up over AR (×, {', '.join(kinds)})" if kinds else "speed-up over AR (×)"


def draw_absent(ax, what: str) -> None:
    """A panel whose column the run left empty (a legal run can: no speed-up when no image was timed against plain
    AR, no precision / recall below 4 images) says so instead of stopping the whole figure."""
    ax.text(0.5, 0.5, f"{what}: not measured in this run", transform=ax.transAxes, ha="center", va="center",
            fontsize=9, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def note_dropped(fig, names: list[str]) -> None:
    """A figure that leaves out a panel column the run left empty says which, under its panels."""
    if names:
        fig.supxlabel(f"not measured in this run, so not drawn: {', '.join(names)}", fontsize=8.5, color="0.4")


def legend_entries(axes) -> tuple[list, list[str]]:
    """Every panel's labelled artists, once each (a panel drawn as absent holds none)."""
    found = {}
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            found.setdefault(text, handle)
    return list(found.values()), list(found)


def read_table(tables: Path | None, name: str, columns: list[str]) -> pd.DataFrame:
    if tables is None:
        raise UserError(f"this figure reads {name}; pass --tables <outdir>/tables (written by `lantern tables`)")
    path = Path(tables) / name
    if not path.is_file():
        raise UserError(f"{path} does not exist; run `lantern tables` first")
    df = read_csv(path, "table", "rebuild it with `lantern tables`")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise UserError(f"{path} lacks column(s) {', '.join(missing)}; rebuild it with this version of `lantern tables`")
    return df


def read_sweep(tables: Path | None, columns: list[str] = ()) -> pd.DataFrame:
    base = ["mode", "point"] + methods.spec_columns()[:-1]
    return read_table(tables, "sweep.csv", base + [c for c in columns if c not in base])


def modes(df: pd.DataFrame, mode: str | None) -> list[str]:
    """The modes to draw, greedy before sampling; --mode restricts to one."""
    found = list(dict.fromkeys(df["mode"]))
    if mode is None:
        return sorted(found, key=lambda m: (m != "greedy", m))
    if mode not in found:
        raise UserError(f"--mode {mode} is not in the tables (found: {', '.join(found)})")
    return [mode]


def _num(v) -> str:
    return f"{int(v)}" if float(v).is_integer() else f"{v:g}"


def short_label(row) -> str:
    """Compact point label for legends and panel titles, e.g. 'LANTERN δ=0.2 k=50' or 'Exact SD (dynamic)'."""
    name = row["name"]
    if name == "vanilla":
        return "AR" if row["point"] == "vanilla" else "AR (control seed)"
    spec = methods.from_row(row)
    parts = [methods.label(name)]
    if row["drafting"] != "chain":  # the shape names the tree: two static trees must not share a label
        parts.append(f"({methods.shape_label(spec).replace(' tree', '')})")
    elif pd.notna(row.get("gamma")) and not methods.relaxation_axes(name):
        parts.append(f"γ={_num(row['gamma'])}")
    for key in methods.relaxation_axes(name):
        if key in spec:
            parts.append(f"{methods.symbol(key)}={_num(spec[key])}")
    if spec.get("residual", "bounded") != "bounded":
        parts.append(f"[{spec['residual']}]")
    if spec.get("skip", "none") != "none":  # VVS: the same rule and drafts with some verifies skipped
        parts.append(f"+VVS 1/{_num(spec['skip_every'])}" if spec["skip"] == "every"
                     else f"+VVS s={_num(spec['similarity'])}")
    return " ".join(parts)


def shape_key(row) -> tuple:
    """Points that differ only in their relaxation grid (delta / lam, k) share a shape key."""
    return methods.shape_key(methods.from_row(row))


def with_shape(df: pd.DataFrame) -> pd.DataFrame:
    """df plus a 'shape' column: the draft shape label that groups points of one relaxation grid."""
    return df.assign(shape=[methods.shape_label(methods.from_row(r)) for _, r in df.iterrows()])


def select_points(df: pd.DataFrame, with_vanilla: bool = True) -> list[str]:
    """Representative points of one mode: AR (+ control), every exact SD, and for each relaxed family the
    weakest and strongest relaxation at the k that carries its relaxation curve (the k with the most points, the
    largest on a tie: a full grid gives its largest k, a curve at one k with single points at others that k)."""
    rows = sorted((r for _, r in df.iterrows()), key=order_key)
    relaxed = lambda r: bool(methods.relaxation_axes(r["name"]))  # noqa: E731
    picked = [r["point"] for r in rows if not relaxed(r) and (with_vanilla or methods.speculative(r))]
    groups: dict[tuple, list] = {}
    for r in rows:
        if relaxed(r):
            groups.setdefault(shape_key(r), []).append(r)
    for group in groups.values():
        ks = [r["k"] for r in group if pd.notna(r.get("k"))]
        curve_k = max(set(ks), key=lambda k: (ks.count(k), k), default=None)
        members = [r for r in group if curve_k is None or r["k"] == curve_k]
        strength = next(a for a in methods.relaxation_axes(members[0]["name"]) if a != "k")
        members.sort(key=lambda r: r[strength] if pd.notna(r[strength]) else -1)
        picked += list(dict.fromkeys([members[0]["point"], members[-1]["point"]]))
    return picked


def pick(df: pd.DataFrame, points: list[str] | None, mode: str, with_vanilla: bool = True) -> pd.DataFrame:
    """Rows of `mode` for the requested points (in that order) or the representative ones."""
    part = df[df["mode"] == mode]
    names = points or select_points(part, with_vanilla)
    unknown = [p for p in names if p not in set(part["point"])]
    if unknown:
        raise UserError(f"point {unknown[0]!r} is not in the {mode} sweep; choose from {', '.join(part['point'])}")
    return part.set_index("point").loc[names].reset_index()
