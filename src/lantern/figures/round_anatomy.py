"""Where a round's time goes: per method, a round's milliseconds split into drafting, verify and the rest, beside
one plain-AR token timed in the same job, at each batch size the sweep timed (batch 1 for the images decoded alone,
and the job's batch size).

Read from rounds.csv (`lantern tables`: the generation jobs' own timer sections, engine/decoding/stats.py). A round
is one target forward (the prefill counted, as tau counts it), so a round's bar over its plain-AR token is the
point's round cost in plain-AR tokens (round_cost_ar, printed at the bar's end with its bootstrap SE and the two
times in milliseconds). At batch B both are per image row: the batch's time / B. The bars are drawn in each job's
own plain-AR tokens by default (`unit: ar`): a CPU sweep's jobs run side by side under different loads, so a
round's milliseconds compare with its own job's token, not with another job's round (`unit: ms` draws them). A section is wall time on a CPU and device time between CUDA events
on a GPU. A round run as one compiled call (`compile`, CUDA graphs) cannot be split from the host: the jobs time
the call as a whole, and the figure draws it whole (hatched).
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from lantern.errors import UserError
from lantern.figures.common import read_sweep, read_table, short_label
from lantern.figures.style import color
from lantern.pipeline.tables import ROUND_COLUMNS, order_key

# timer section -> (legend label, colour)
SECTIONS = {"draft": ("drafting (drafter forwards, tree or window build)", "#E69F00"),
            "verify": ("verify (the target's forward)", "#0072B2"),
            "other": ("the rest (acceptance, cache, sampling)", "#999999")}
AR_COLOR = "#333333"
ROUND_Y, ROUND_H, AR_Y, AR_H = 0.10, 0.42, -0.24, 0.2  # a round's bar and, under it, the plain-AR token's


UNITS = {"ar": "a round (one target forward) in its own job's plain-AR tokens",
         "ms": "milliseconds per round (one target forward)"}


@dataclass
class Params:
    points: list[str] | None = None  # default: every point of the mode but the control AR run
    # ar: each point's bars over its own job's plain-AR token, the milliseconds printed beside them; ms: milliseconds.
    # The jobs of a CPU sweep run side by side under different loads: a round compares with its own job's token
    unit: str = "ar"

    def __post_init__(self):
        if self.unit not in UNITS:
            raise UserError(f"round_anatomy: unit {self.unit!r} is not one of {', '.join(UNITS)}")


def pick_mode(rounds: pd.DataFrame, mode: str | None) -> str:
    """--mode, else sampling when swept, else the first mode: a round's cost hardly depends on the mode."""
    found = list(dict.fromkeys(rounds["mode"]))
    if mode is None:
        return "sampling" if "sampling" in found else found[0]
    if mode not in found:
        raise UserError(f"round_anatomy: mode {mode!r} is not in rounds.csv (found: {', '.join(found)})")
    return mode


def plot(inputs, p: Params):
    sweep = read_sweep(inputs.tables)
    rounds = read_table(inputs.tables, "rounds.csv", ROUND_COLUMNS)
    if rounds.empty:
        raise UserError("round_anatomy: rounds.csv has no rows; rebuild the tables with `lantern tables`")
    mode = pick_mode(rounds, inputs.mode)
    part = rounds[rounds["mode"] == mode].merge(sweep[sweep["mode"] == mode], on=["mode", "point", "name", "drafting"],
                                                suffixes=("", "_sweep"))
    points = p.points or [r["point"] for r in sorted((r for _, r in part.iterrows()), key=order_key)
                          if r["point"] != "vanilla-control"]
    unknown = [q for q in points if q not in set(part["point"])]
    if unknown:
        raise UserError(f"round_anatomy: point {unknown[0]!r} is not in the {mode} rounds; choose from "
                        f"{', '.join(dict.fromkeys(part['point']))}")
    points = list(dict.fromkeys(points))
    batches = sorted(int(b) for b in part["batch_size"].unique())
    labels = {r["point"]: short_label(r) for _, r in part.iterrows()}
    fig, axes = plt.subplots(1, len(batches), figsize=(6.0 * len(batches) + 3.0, 1.6 + 0.6 * len(points)),
                             squeeze=False, layout="constrained")
    for ax, batch in zip(axes[0], batches):
        at = part[part["batch_size"] == batch].drop_duplicates("point").set_index("point")
        draw_batch(ax, at, points, labels, p.unit)
        ax.set_title(f"batch {batch}" + (" (images decoded alone)" if batch == 1 and len(batches) > 1 else
                                         f" (a batch's time / {batch}: per image row)" if batch > 1 else ""))
        ax.set_xlabel(UNITS[p.unit])
    handles = [plt.Rectangle((0, 0), 1, 1, color=c, label=text) for text, c in SECTIONS.values()]
    if (part["split"] == "one call").any():
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="0.3", hatch="///",
                                     label="the whole round: one compiled call, not split"))
    handles.append(plt.Rectangle((0, 0), 1, 1, color=AR_COLOR, label="one plain-AR token, timed in the same job"))
    fig.legend(handles=handles, loc="outside lower center", ncol=2)
    fig.suptitle(f"{mode}: where a round's time goes, beside one plain-AR token timed in the same job\n"
                 "at each bar's end: the round's cost in plain-AR tokens ± bootstrap SE, then round ms / token ms\n"
                 "(each job ran under its own load: read a round against its own job's token)")
    return fig


def draw_batch(ax, at: pd.DataFrame, points: list[str], labels: dict[str, str], unit: str) -> None:
    """One panel: per point (top to bottom) the round's stacked sections and, under it, the same job's plain-AR
    token; a point not timed at this batch size, or (unit ar) without a plain-AR token, is said so on its row."""
    y = np.arange(len(points))[::-1].astype(float)
    scale = 1 / at["ar_token_ms"] if unit == "ar" else pd.Series(1.0, index=at.index)
    longest = np.nanmax([(at[c] * scale).max() for c in ("round_ms", "ar_token_ms")] + [0.0])
    for yi, point in zip(y, points):
        if point not in at.index or pd.isna(scale.get(point)):
            ax.text(0.0, yi, "  not timed at this batch size" if point not in at.index else
                    "  no plain-AR token timed in this job", va="center", fontsize=8, color="0.4")
            continue
        raw = at.loc[point]
        r = raw.copy()
        r[["draft_ms", "verify_ms", "other_ms", "round_ms", "ar_token_ms"]] *= scale[point]
        plain = r["name"] == "vanilla"
        if r["split"] == "sections":
            left = 0.0
            for section, (_, c) in SECTIONS.items():
                width = float(r[f"{section}_ms"]) if pd.notna(r[f"{section}_ms"]) else 0.0
                ax.barh(yi + ROUND_Y, width, height=ROUND_H, left=left, color=c, edgecolor="white", linewidth=0.4)
                left += width
        else:  # one compiled call, or a job that recorded no sections: the round whole
            ax.barh(yi + ROUND_Y, r["round_ms"], height=ROUND_H, facecolor="white", edgecolor=color(r["name"]),
                    hatch="///" if r["split"] == "one call" else None)
        if not plain and pd.notna(r["ar_token_ms"]):
            ax.barh(yi + AR_Y, r["ar_token_ms"], height=AR_H, color=AR_COLOR)
        ax.text(max(r["round_ms"], r["ar_token_ms"] if pd.notna(r["ar_token_ms"]) else 0) + 0.01 * longest, yi,
                cost_text(raw, plain), va="center", fontsize=8, linespacing=1.1)
    ax.set_yticks(y)
    ax.set_yticklabels([labels[point] for point in points])
    ax.set_xlim(0, longest * 1.7 if longest > 0 else 1)
    ax.grid(axis="y", visible=False)


def cost_text(r, plain: bool) -> str:
    """The round's cost in plain-AR tokens and, from its own job, the milliseconds behind it."""
    ms = lambda v: f"{v:.3g} ms"  # noqa: E731
    if plain:
        return f"1: a round is a token\n{ms(r['round_ms'])}"
    if pd.isna(r["round_cost_ar"]):
        return f"no plain-AR token timed in this job\n{ms(r['round_ms'])}"
    se = f" ± {r['round_cost_ar_se']:.2f}" if pd.notna(r["round_cost_ar_se"]) else ""
    return f"{r['round_cost_ar']:.2f}{se} AR tokens\n{ms(r['round_ms'])} / {ms(r['ar_token_ms'])}"
