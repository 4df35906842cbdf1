"""Every `lantern figure` renders a non-empty PNG from a synthetic sweep's tables; bad input is a one-line error."""

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from lantern.metrics.ambiguity import long_rows
from lantern.errors import UserError
from lantern.figures import FIGURES, main
from lantern.figures.common import select_points
from lantern.figures.samples import class_labels, column_title
from lantern.figures.tradeoff import pareto
from lantern.pipeline.tables import main as tables_main
from test_tables import POINTS, make_sweep


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("figsweep")
    shards, metrics = make_sweep(root)
    tables_main(["--shards", *map(str, shards), "--metrics", *map(str, metrics), "--out", str(root / "tables")])
    # per-world step files in the format `lantern ambiguity --steps-out` writes (no world column)
    gen = torch.Generator().manual_seed(0)
    for world, a in (("default", 1.0), ("clean", 4.0)):
        steps = [long_rows(source, cfg, torch.distributions.Beta(a * cfg, 5.0).sample((20, 16)),
                           torch.rand(20, 16, generator=gen) * 4 / (a * cfg), torch.arange(20) % 4)
                 for cfg in (1.0, 2.0) for source in ("samples", "heldout")]
        pd.concat(steps).to_csv(root / f"ambiguity_{world}.csv", index=False)
    # a `lantern proximity` table: the shift grows with the fraction replaced, faster for farther codes
    pd.DataFrame([{"world": "toy-default", "fraction": f, "m": m, "fd": f * s, "fd_noise_halves": 0.02,
                   "feature_cosine": 1 - f * s, "psnr": 40 - 20 * f * s if f else float("inf"), "n_images": 100,
                   "extractor": "toyclip", "strip_fraction": 0.25}
                  for f in (0.0, 0.25, 1.0) for m, s in (("1", 0.01), ("50", 0.2), ("random", 0.5))]
                 ).to_csv(root / "proximity.csv", index=False)
    return root


def args_for(name, root):
    extra = {"samples": ["--gen", str(root / "gen"), "--mode", "sampling"],
             "ambiguity": ["--ambiguity", f"default={root / 'ambiguity_default.csv'}",
                           f"clean={root / 'ambiguity_clean.csv'}"],
             "proximity": ["--proximity", str(root / "proximity.csv")]}
    return ["--tables", str(root / "tables"), *extra.get(name, [])]


@pytest.mark.parametrize("name", FIGURES)
def test_every_figure_renders_a_png(sweep, name):
    out = sweep / "figs" / f"{name}.png"
    main([name, *args_for(name, sweep), "--out", str(out)])
    image = Image.open(out)
    assert image.format == "PNG" and image.width > 400 and image.height > 250
    pixels = np.asarray(image.convert("L"))
    assert pixels.std() > 10  # something was drawn, not a blank canvas
    assert not list(out.parent.glob(".*.tmp"))  # written atomically


def test_ambiguity_world_column_and_one_source(sweep, tmp_path):
    both = pd.concat(pd.read_csv(sweep / f"ambiguity_{w}.csv").assign(world=w) for w in ("default", "clean"))
    both.to_csv(tmp_path / "both.csv", index=False)
    out = tmp_path / "ambiguity.pdf"
    main(["ambiguity", "--ambiguity", str(tmp_path / "both.csv"), "--params", '{"sources": ["heldout"]}',
          "--out", str(out)])
    assert out.read_bytes().startswith(b"%PDF")
    with pytest.raises(UserError, match="lacks column.s. world; .*name its world as --ambiguity WORLD=FILE"):
        main(["ambiguity", "--ambiguity", str(sweep / "ambiguity_clean.csv"), "--out", str(out)])
    with pytest.raises(UserError, match="source 'teacher' is not in the dump"):
        main(["ambiguity", *args_for("ambiguity", sweep), "--params", '{"sources": ["teacher"]}', "--out", str(out)])


def test_figure_options(sweep):
    out = sweep / "figs" / "heat_lanternpp.png"
    main(["heatmap", *args_for("heatmap", sweep), "--params", '{"method": "lanternpp", "x": "lam"}', "--out", str(out)])
    with pytest.raises(UserError, match="no sjd points with both delta and k"):
        main(["heatmap", *args_for("heatmap", sweep), "--params", '{"method": "sjd"}', "--out", str(out)])
    main(["tau_vs_delta", *args_for("tau_vs_delta", sweep), "--mode", "greedy", "--out", str(out)])
    assert out.stat().st_size > 0
    main(["samples", *args_for("samples", sweep), "--params", '{"indices": [1, 4], "points": ["vanilla", "exact-dynamic"]}',
          "--out", str(out)])


def test_sample_columns_name_their_class(sweep):
    labels = class_labels(sweep / "gen", "sampling", "vanilla")
    assert labels[5] == 1  # the fixture's labels cycle i mod 4
    assert column_title(5, labels[5], toy_names=False) == "image 5\nclass 1"
    assert column_title(5, labels[5], toy_names=True) == "image 5\ntriangle"
    assert column_title(5, None, toy_names=True) == "image 5"


def test_bad_figure_inputs(sweep, tmp_path):
    out = str(tmp_path / "x.png")
    with pytest.raises(UserError, match="unknown key 'colour'"):
        main(["tradeoff", *args_for("tradeoff", sweep), "--params", '{"colour": 1}', "--out", out])
    with pytest.raises(UserError, match="must end in"):
        main(["tradeoff", *args_for("tradeoff", sweep), "--out", str(tmp_path / "x.jpeg")])
    with pytest.raises(UserError, match="run `lantern tables` first"):
        main(["heatmap", "--tables", str(tmp_path), "--out", out])
    with pytest.raises(UserError, match="not in the tables"):
        main(["tradeoff", *args_for("tradeoff", sweep), "--mode", "beam", "--out", out])
    with pytest.raises(UserError, match="no image 000099.png"):
        main(["samples", *args_for("samples", sweep), "--params", '{"indices": [99]}', "--out", out])
    with pytest.raises(UserError, match="lacks column"):
        main(["ambiguity", "--ambiguity", f"default={sweep / 'tables' / 'sweep.csv'}", "--out", out])
    # a sweep without tree methods: the tree figure refuses with a clear message instead of drawing nothing
    depths = pd.read_csv(sweep / "tables" / "depths.csv")
    chain_only = tmp_path / "tables"
    chain_only.mkdir()
    pd.read_csv(sweep / "tables" / "sweep.csv").to_csv(chain_only / "sweep.csv", index=False)
    depths[depths["drafting"] == "chain"].to_csv(chain_only / "depths.csv", index=False)
    with pytest.raises(UserError, match="no tree methods in this sweep"):
        main(["tree_depth", "--tables", str(chain_only), "--out", out])
    assert not (tmp_path / "x.png").exists()


def test_pareto_front():
    fid = np.array([10.0, 12.0, 11.0, 20.0, 15.0])
    speed = np.array([1.0, 1.8, 1.5, 2.5, 1.7])
    assert pareto(fid, speed, higher_better=False).tolist() == [0, 2, 1, 3]  # point 4 is beaten by point 1
    assert pareto(-fid, speed, higher_better=True).tolist() == [3, 1, 2, 0]


def test_representative_points(sweep):
    table = pd.read_csv(sweep / "tables" / "sweep.csv")
    picked = select_points(table[table["mode"] == "greedy"])
    assert picked == ["vanilla", "vanilla-control", "exact-chain-g4", "exact-dynamic", "lantern-chain-g4-d0.1-k50",
                      "lantern-chain-g4-d0.4-k50", "lanternpp-static-naive_extend_57-l2-k10"]
    assert set(picked) <= set(POINTS)


def test_representative_relaxed_points_come_from_the_k_with_the_curve(sweep):
    """A delta curve at k 10 with single points at k 5 and 20 (the toy default): the curve's ends, not k 20's lone
    point; a full grid: its largest k, as before."""
    table = pd.read_csv(sweep / "tables" / "sweep.csv")
    lantern = table[(table["mode"] == "greedy") & (table["name"] == "lantern")].iloc[0]
    row = lambda d, k: lantern.to_dict() | {"point": f"l-d{d}-k{k}", "delta": d, "k": k}  # noqa: E731
    curve = pd.DataFrame([row(0.1, 10), row(0.2, 10), row(0.4, 10), row(0.2, 5), row(0.2, 20)])
    assert select_points(curve) == ["l-d0.1-k10", "l-d0.4-k10"]
    grid = pd.DataFrame([row(d, k) for k in (10, 50) for d in (0.1, 0.4)])
    assert select_points(grid) == ["l-d0.1-k50", "l-d0.4-k50"]


def test_tradeoff_draws_class_accuracy_where_the_sweep_has_it(sweep, tmp_path):
    """A sweep with class accuracy (the toy world) gets a third panel per mode; one without it (llamagen: no
    classifier) keeps FID and CLIP score."""
    from lantern.figures import Inputs
    from lantern.figures.tradeoff import Params, plot

    table = pd.read_csv(sweep / "tables" / "sweep.csv")
    (tmp_path / "tables").mkdir()
    table.assign(class_accuracy=0.9, class_accuracy_se=0.02).to_csv(tmp_path / "tables" / "sweep.csv", index=False)
    with_classifier = plot(Inputs(tables=tmp_path / "tables"), Params())
    without = plot(Inputs(tables=sweep / "tables"), Params())
    assert [ax.get_xlabel() for ax in with_classifier.axes[:3]][-1] == "class accuracy (higher is better)"
    assert len(with_classifier.axes) == 3 * 2 and len(without.axes) == 2 * 2


def test_round_anatomy_from_a_small_rounds_table(sweep, tmp_path):
    """Per point and batch size a round's sections beside the same job's plain-AR token, the round's cost at the
    bar's end; a compiled round is drawn whole, a point not timed at a batch size or without plain AR says so."""
    import matplotlib.pyplot as plt

    from lantern.figures import Inputs
    from lantern.figures.round_anatomy import Params, plot
    from lantern.pipeline.tables import ROUND_COLUMNS

    folder = tmp_path / "tables"
    folder.mkdir()
    pd.read_csv(sweep / "tables" / "sweep.csv").to_csv(folder / "sweep.csv", index=False)
    row = lambda point, name, drafting, b, ms, cost, split="sections", ar=1.0: {  # noqa: E731
        "mode": "sampling", "point": point, "name": name, "drafting": drafting, "batch_size": b, "images": 4,
        "rounds_per_image": 9.0, "draft_ms": ms[0], "verify_ms": ms[1], "other_ms": ms[2], "round_ms": sum(ms),
        "ar_token_ms": ar, "round_cost_ar": cost, "round_cost_ar_se": 0.04 if cost == cost else float("nan"),
        "split": split}
    pd.DataFrame([row("vanilla", "vanilla", "none", 1, (0.0, 0.9, 0.1), 1.0),
                  row("exact-chain-g4", "exact", "chain", 1, (0.3, 0.9, 0.03), 1.23),
                  row("exact-chain-g4", "exact", "chain", 8, (0.0, 1.5, 0.0), 1.5, "one call"),
                  row("exact-dynamic", "exact", "dynamic", 1, (0.4, 1.0, 0.1), float("nan"), ar=float("nan"))],
                 columns=ROUND_COLUMNS).to_csv(folder / "rounds.csv", index=False)
    fig = plot(Inputs(tables=folder), Params())
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    titles = [ax.get_title() for ax in fig.axes]
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    plt.close(fig)
    assert titles == ["batch 1 (images decoded alone)", "batch 8 (a batch's time / 8: per image row)"]
    assert labels == ["AR", "Exact SD γ=4", "Exact SD (dynamic)"]  # from the top, in the paper's order
    # bars in each job's plain-AR tokens (the default), the cost and the milliseconds behind it at the bar's end
    assert "1.23 ± 0.04 AR tokens\n1.23 ms / 1 ms" in texts and "1.50 ± 0.04 AR tokens\n1.5 ms / 1 ms" in texts
    assert "1: a round is a token\n1 ms" in texts and texts.count("  not timed at this batch size") == 2
    assert "  no plain-AR token timed in this job" in texts  # no token to measure its round in
    assert "the whole round: one compiled call, not split" in legend
    widths = sorted(round(patch.get_width(), 6) for patch in fig.axes[0].patches)
    assert widths == sorted([0.0, 0.9, 0.1, 0.3, 0.9, 0.03, 1.0])  # AR's sections, the chain's, its token
    fig = plot(Inputs(tables=folder), Params(unit="ms"))
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    plt.close(fig)
    assert "no plain-AR token timed in this job\n1.5 ms" in texts  # in milliseconds its round is drawn
    with pytest.raises(UserError, match="unit 'tokens' is not one of ar, ms"):
        Params(unit="tokens")
    out = tmp_path / "round_anatomy.png"
    main(["round_anatomy", "--tables", str(folder), "--params", '{"points": ["exact-chain-g4"]}', "--out", str(out)])
    assert Image.open(out).format == "PNG"
    with pytest.raises(UserError, match="not in the sampling rounds"):
        main(["round_anatomy", "--tables", str(folder), "--params", '{"points": ["lantern"]}', "--out", str(out)])
    with pytest.raises(UserError, match="mode 'greedy' is not in rounds.csv"):
        main(["round_anatomy", "--tables", str(folder), "--mode", "greedy", "--out", str(out)])
    (folder / "rounds.csv").unlink()
    with pytest.raises(UserError, match="run `lantern tables` first"):
        main(["round_anatomy", "--tables", str(folder), "--out", str(out)])


def test_a_vvs_point_is_labelled_apart_from_its_decoder():
    """VVS on LANTERN's point shares its rule, drafts and relaxation: without the schedule in the label the two
    series of a legend read the same."""
    import pandas as pd
    from lantern.figures.common import short_label

    base = {"name": "lantern", "point": "lantern-chain-g4-d0.1-k3", "drafting": "chain", "gamma": 4, "delta": 0.1, "k": 3}
    every = pd.Series({**base, "point": "lantern-chain-g4-every-i5-d0.1-k3", "skip": "every", "skip_every": 5})
    similar = pd.Series({**base, "drafting": "dynamic", "point": "s", "skip": "similarity", "similarity": 0.7})
    assert short_label(pd.Series(base)) == "LANTERN δ=0.1 k=3"
    assert short_label(every) == "LANTERN δ=0.1 k=3 +VVS 1/5"
    assert short_label(similar).endswith("+VVS s=0.7")
