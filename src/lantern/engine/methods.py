"""The method registry: the one owner of what a decoding method is.

A sweep point is a method spec, {name: <family>, drafting: <kind>, <parameters>, seed}. The family names the
acceptance rule (`vanilla` is plain AR: no drafter, no drafting); the drafting kind names how drafts are made
(chain, static tree, dynamic tree). Families and drafting kinds declare their parameters once, as `Param`s (type,
range, default, tag in the point name, symbol in labels); everything else asks this module:
- the config validator and `lantern sample`: `normalize` (types, ranges, which parameters apply, defaults);
- the sweep: `expand` (grid values -> points) and `point_name` (every parameter that changes the output is in the
  name, nothing that does not apply, defaults left out only where they were always left out);
- tables and figures: `spec_columns`, `order`, `label`, `setting`, `shape_key`, `relaxation_axes`;
- the workflow: `needs_drafter`, `needs_neighbours`;
- decoding: `rule`, `drafting` and `build_decoder`.

Adding a relaxed acceptance rule = one `Family` whose `bound(spec, p_x)` says how much neighbour mass a draft x may
claim (LANTERN's delta, LANTERN++'s (lam - 1) p(x)), passed to `register`; its tests are those of acceptance.py.
This module imports torch only when a decoder is built, so config validation stays light.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from lantern.errors import UserError

MODES = ("sampling", "greedy")  # decoding modes; a sweep entry may name some of them (`modes`), else it runs in all
REQUIRED = object()  # a Param default: the spec must set it


@dataclass(frozen=True)
class Param:
    """One method parameter. A list value in a config entry expands into one sweep point per value (`grid`)."""

    name: str
    doc: str
    kind: str = "float"  # int | float | choice | tree
    default: Any = REQUIRED
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself is excluded (lam > 1)
    choices: tuple = ()
    tag: str = ""  # point-name prefix: d -> d0.1
    symbol: str = ""  # label symbol: δ
    grid: bool = True
    named: str = "always"  # always | custom (in the name only when it differs from the default)
    relaxation: bool = False  # a relaxation-strength axis (figures group points that differ only in these)
    limit: str = ""  # a config bound: max_k -> value <= neighbours.max_k
    applies: Callable[[dict], bool] | None = None  # only for some specs (gamma of a static `chain` tree)
    hint: str = ""  # what to write instead, for a low_open / bound violation
    fill: bool = True  # False: the default is left out of specs (a later option whose absence keeps old specs)

    def check(self, value, where: str, context: dict):
        """The value, validated: a one-line UserError naming `where` otherwise."""
        if self.kind == "choice":
            if value not in self.choices:
                raise UserError(f"{where} = {value!r} is not allowed; use one of {', '.join(map(str, self.choices))}")
            return value
        if self.kind == "tree":
            return _check_tree(value, where)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{where} = {value!r} must be a number" + (" (or a list of numbers)" if self.grid else ""))
        if not math.isfinite(value):
            raise UserError(f"{where} = {value} must be a finite number")
        if self.kind == "int" and not isinstance(value, int):
            raise UserError(f"{where} = {value!r} must be an integer; write {round(value)}")
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            bound = f"> {self.low:g}" if self.low_open else f">= {self.low:g}"
            raise UserError(f"{where} = {value} must be {bound}{'; ' + self.hint if self.hint else ''}")
        if self.high is not None and value > self.high:
            raise UserError(f"{where} = {value} exceeds {self.high:g}{'; ' + self.hint if self.hint else ''}")
        if self.limit and self.limit in context and value > context[self.limit]:
            raise UserError(f"{where} = {value} is larger than neighbours.{self.limit} = {context[self.limit]}; "
                            f"lower {self.name} or raise neighbours.{self.limit}")
        return value

    def in_name(self, spec: dict) -> bool:
        return self.named == "always" or spec[self.name] != self.default

    def format(self, value) -> str:
        return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Family:
    """An acceptance rule family. `make_rule(spec)` builds its AcceptRule; a family given only a `bound` gets the
    generic relaxed rule: draft x may claim its k nearest neighbours' mass up to bound(spec, p(x))."""

    name: str
    label: str
    doc: str
    params: tuple[Param, ...] = ()
    speculative: bool = True
    make_rule: Callable[[dict], Any] | None = None
    bound: Callable[[dict, Any], Any] | None = None

    def rule(self, spec: dict):
        if self.make_rule is not None:
            return self.make_rule(spec)
        from lantern.engine.rules.acceptance import AcceptRule

        return AcceptRule(self.name, k=spec["k"], residual=spec["residual"], bound_fn=partial(self.bound, spec))


@dataclass(frozen=True)
class Drafting:
    """A drafting kind: its parameters and the round object its decoder drives (chain or tree rounds of the
    speculative loop; Jacobi windows of jacobi.py, where the target drafts for itself: `drafter` False)."""

    name: str
    label: str
    doc: str
    params: tuple[Param, ...]
    build: Callable[[dict], Any]
    drafter: bool = True
    check: Callable[[dict, str], None] | None = None  # what ties its parameters together, on a normalized spec


# -- the parameters ---------------------------------------------------------------------------------------------
K = Param("k", "neighbours of a draft that may lend it their mass (<= neighbours.max_k)", kind="int", low=0,
          tag="k", symbol="k", relaxation=True, limit="max_k")
RESIDUAL = Param("residual", "residual after a relaxed rejection: bounded (keeps the TV bound), reference "
                 "(the authors' code, also their greedy tie-break on dynamic trees) or lumina (their Lumina-mGPT "
                 "code: the neighbours leave p, not q', on static trees)", kind="choice", default="bounded",
                 choices=("bounded", "reference", "lumina"), named="custom")
DELTA = Param("delta", "LANTERN total-variation budget per step", low=0.0, high=1.0, tag="d", symbol="δ",
              relaxation=True, hint="delta is a total variation, in [0, 1]; for a relative bound use name: lanternpp with lam")
LAM = Param("lam", "LANTERN++ relative bound: p~(x) <= lam p(x)", low=1.0, low_open=True, tag="l", symbol="λ",
            relaxation=True, hint="lam = 1 is exact decoding: use name: exact")
GAMMA = Param("gamma", "drafted tokens per round (a chain's length)", kind="int", default=4, low=1, tag="g", symbol="γ")
TREE = Param("tree", "static shape: naive_extend_57 (the authors' 57 nodes), mc_sim_7b_63 (their Lumina-mGPT 25), "
             "twin_chain_8, chain (gamma nodes) or "
             "a list of rank paths such as [[0], [1], [0, 0]]", kind="tree", default="naive_extend_57", grid=False)
TREE_GAMMA = Param("gamma", GAMMA.doc + " of the static `chain` tree", kind="int", default=4, low=1, tag="g",
                   symbol="γ", applies=lambda spec: spec.get("tree") == "chain")
TOTAL_TOKENS = Param("total_tokens", "dynamic tree: nodes kept, the root included", kind="int", default=59, low=2,
                     tag="n", named="custom")
DEPTH = Param("depth", "dynamic tree: expansions after the root's children", kind="int", default=4, low=1,
              tag="depth", named="custom")
WINDOW = Param("window", "Jacobi: window tokens verified per target forward (SJD's L)", kind="int", default=16, low=1,
               tag="w", symbol="L")
COUPLING = Param("coupling", "Jacobi: how the window after the accepted prefix is re-drafted: independent (SJD), "
                 "maximal (SCD's maximal coupling, the same iteration as SJD-PAC's adaptive continuation) or gumbel "
                 "(SCD's Gumbel coupling); all exact", kind="choice", default="independent",
                 choices=("independent", "maximal", "gumbel"), named="custom")  # coupling.COUPLINGS (no torch here)
PROACTIVE = Param("proactive", "Jacobi: SJD-PAC's proactive drafting, K candidates (the window's token and K - 1 more "
                  "drawn without replacement from its draft distribution) at each of the first proactive_depth window "
                  "positions, verified as a tree in the same forward (jacobi_tree.py; exact); 1: none",
                  kind="int", default=1, low=1, high=64, tag="pk", symbol="K", grid=False, named="custom", fill=False)
PROACTIVE_DEPTH = Param("proactive_depth", "Jacobi: window positions with proactive candidates (the authors' "
                        "tree_depth counts y: their 3 is 2 here)", kind="int", default=2, low=1, high=8, tag="pd",
                        symbol="D", applies=lambda spec: spec.get("proactive", 1) > 1)
TOP_K = Param("top_k", "dynamic tree: children offered per expanded node", kind="int", default=10, low=1, tag="top",
              named="custom")
SCALE = Param("scale", "Cool-SD acceptance weight of a round's first draft: w_i = scale exp(-nu i - mu)", low=0.0,
              low_open=True, tag="s", symbol="w", relaxation=True, hint="scale 1 with nu = mu = 0 is exact decoding")
NU = Param("nu", "Cool-SD annealing rate per draft index i within a round", default=0.0, low=0.0, tag="nu",
           symbol="ν", relaxation=True)
MU = Param("mu", "Cool-SD offset of the annealed weight's exponent", default=0.0, tag="mu", symbol="μ", relaxation=True)
GROUP = Param("group", "GSD: ranks of the target's probability order in a draft's cluster window (the authors' 14; "
              "1 is exact)", kind="int", default=14, low=1, tag="G", relaxation=True)
GAP = Param("gap", "GSD: largest |p(v) - p(x)| of a cluster member (the authors' 0.15; 0 is exact)", default=0.15,
            low=0.0, high=1.0, tag="gap", relaxation=True)
SKIP = Param("skip", "VVS verification skipping: none; every (every skip_every-th round commits a drafted path "
             "unverified; the next verify re-runs it); similarity (trees: skip when the draft paths agree)",
             kind="choice", default="none", choices=("none", "every", "similarity"), grid=False, named="custom",
             fill=False)
SKIP_EVERY = Param("skip_every", "VVS: the period of skipped rounds (the authors' run_vvs.sh: 5)", kind="int", default=5,
                   low=2, tag="i", symbol="i", applies=lambda spec: spec.get("skip") == "every")
SIMILARITY = Param("similarity", "VVS: skip a round when its draft paths' mean codebook cosine similarity reaches this "
                   "(the authors' sim_threshold 0.70)", default=0.7, low=-1.0, high=1.0, tag="sim", symbol="s",
                   applies=lambda spec: spec.get("skip") == "similarity")
BETA = Param("beta", "entropy-aware acceptance: min(1, w p(x)/q(x)) with w = exp(beta H(p) / log V), H the target's "
             "entropy (0 is exact)", low=0.0, tag="b", symbol="β", relaxation=True,
             hint="beta 0 is exact decoding: use name: exact")


def _check_tree(value, where: str):
    from lantern.engine.decoding.tree_shapes import SHAPES

    if isinstance(value, str):
        if value not in SHAPES:
            raise UserError(f"{where} = {value!r} is not a static tree; use {', '.join(SHAPES)} or a list of rank paths")
        return value
    from lantern.engine.decoding.tree_shapes import validate_tree_paths

    try:
        return [list(p) for p in validate_tree_paths(value)]
    except UserError as e:
        raise UserError(f"{where}: {e}") from None


def _rule(kind: str, *keys: str):
    def make(spec: dict):
        from lantern.engine.rules.acceptance import AcceptRule

        return AcceptRule(kind, **{k: spec[k] for k in keys})
    return make


def _own(module: str, name: str):
    """A family's rule builder from its own module (retarget.py, peers.py), imported when a decoder is built."""
    def make(spec: dict):
        import importlib

        return getattr(importlib.import_module(f"lantern.engine.rules.{module}"), name)(spec)
    return make


def _chain(spec: dict):
    from lantern.engine.decoding.chain import Chain

    return Chain(spec["gamma"], spec["skip_every"] if spec.get("skip") == "every" else 0)


def _skipping(tree, spec: dict):
    """A tree shape with the spec's VVS schedule (engine/decoding/skipping.py); DynamicTree is a frozen dataclass.
    A `similarity` schedule also needs the VQ codebook (skipping.attach_codebook, build_decoder's)."""
    if spec.get("skip") == "every":
        object.__setattr__(tree, "skip_every", spec["skip_every"])
    if spec.get("skip") == "similarity":
        object.__setattr__(tree, "skip_similarity", spec["similarity"])
    return tree


def _static(spec: dict):
    from lantern.engine.decoding.trees import static_tree

    return _skipping(static_tree(spec["tree"], spec.get("gamma", GAMMA.default)), spec)


def _jacobi(spec: dict):
    from lantern.engine.decoding.jacobi import Jacobi

    if spec.get("proactive", 1) > 1:
        from lantern.engine.decoding.jacobi_tree import ProactiveJacobi

        return ProactiveJacobi(spec["window"], spec["coupling"], spec["proactive"], spec["proactive_depth"])
    return Jacobi(spec["window"], spec["coupling"])


def _check_proactive(spec: dict, where: str) -> None:
    """The proactive tree's levels are window positions, and its nodes are all verified in one forward."""
    if spec.get("proactive", 1) == 1:
        return
    K, D = spec["proactive"], spec["proactive_depth"]
    for window in spec["window"] if isinstance(spec["window"], list) else [spec["window"]]:
        if D > window:
            raise UserError(f"{where}.proactive_depth = {D} exceeds window = {window}: the tree's levels are window "
                            "positions; lower proactive_depth or raise window")
    nodes = sum(K ** d for d in range(1, D + 1))
    if nodes > 1024:  # jacobi_tree.MAX_TREE (no torch here)
        raise UserError(f"{where}: proactive = {K} with proactive_depth = {D} verifies {nodes} tree nodes per "
                        "forward; keep K + K^2 + .. + K^D <= 1024")


def _dynamic(spec: dict):
    from lantern.engine.decoding.trees import DynamicTree

    return _skipping(DynamicTree(spec["total_tokens"], spec["depth"], spec["top_k"]), spec)


SKIPPING = ("chain", "static", "dynamic")  # the drafting kinds with a VVS schedule (skip, skip_every)
FAMILIES: dict[str, Family] = {}
DRAFTINGS: dict[str, Drafting] = {}


def register(entry: Family | Drafting) -> None:
    """Add a family or drafting kind; its position in the registry is its place in tables and figures."""
    table = FAMILIES if isinstance(entry, Family) else DRAFTINGS
    if entry.name in FAMILIES or entry.name in DRAFTINGS or entry.name in ("none", "control"):
        raise ValueError(f"method {entry.name!r} is already registered")
    table[entry.name] = entry


for _entry in (
    Family("vanilla", "AR (vanilla)", "plain autoregressive decoding, one target forward per token", speculative=False),
    Family("exact", "Exact SD", "exact speculative sampling (greedy: greedy verification)", make_rule=_rule("exact")),
    Family("lantern", "LANTERN", "relaxed acceptance: a draft claims its k nearest latent neighbours' mass up to delta",
           (DELTA, K, RESIDUAL), make_rule=_rule("lantern", "delta", "k", "residual")),
    Family("lanternpp", "LANTERN++", "relaxed acceptance with the relative bound p~(x) <= lam p(x)",
           (LAM, K, RESIDUAL), make_rule=_rule("lanternpp", "lam", "k", "residual")),
    Family("lanterntv", "LANTERN-TV", "relaxed acceptance toward one relaxed target per position, chosen before the "
           "draft: TV <= delta per step for sampled drafts too", (DELTA, K), make_rule=_own("retarget", "lanterntv_rule")),
    Family("coolsd", "Cool-SD", "annealed relaxed acceptance min(1, w_i p(x)/q(x)), w_i = scale exp(-nu i - mu) over "
           "the draft index i in a round", (SCALE, NU, MU), make_rule=_own("peers", "coolsd_rule")),
    Family("gsd", "GSD", "grouped acceptance p(C(x))/q(C(x)) over rank-near latent neighbours of x",
           (GROUP, K, GAP), make_rule=_own("peers", "gsd_rule")),
    Family("entropy", "Entropy-aware", "entropy-aware acceptance min(1, w p(x)/q(x)), w = exp(beta H(p) / log V) "
           "from the target's entropy H(p) (arXiv 2510.09012)", (BETA,), make_rule=_own("peers", "entropy_rule")),
    Drafting("chain", "chain", "EAGLE-1 chain of gamma drafts", (GAMMA, SKIP, SKIP_EVERY), _chain),
    Drafting("static", "static tree", "static draft tree (EAGLE-1, LANTERN++)",
             (TREE, TREE_GAMMA, SKIP, SKIP_EVERY, SIMILARITY), _static),
    Drafting("dynamic", "dynamic tree", "EAGLE-2 dynamic tree", (TOTAL_TOKENS, DEPTH, TOP_K, SKIP, SKIP_EVERY, SIMILARITY),
             _dynamic),
    Drafting("jacobi", "Jacobi", "speculative Jacobi decoding (SJD): the target refines a window of its own guesses, "
             "no drafter; coupled re-drafts: SCD, SJD-PAC's adaptive continuation; proactive: SJD-PAC's candidate "
             "tree", (WINDOW, COUPLING, PROACTIVE, PROACTIVE_DEPTH), _jacobi, drafter=False, check=_check_proactive),
):
    register(_entry)


# -- specs ------------------------------------------------------------------------------------------------------
def family(spec: dict, where: str = "method") -> Family:
    name = spec.get("name") if isinstance(spec, dict) else None
    if name not in FAMILIES:
        raise UserError(f"{where}.name = {name!r} is not a method; use one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def _params(spec: dict) -> list[Param]:
    """The parameters that apply to spec (family's, then its drafting's; conditional ones by the spec)."""
    fam = FAMILIES[spec["name"]]
    out = list(fam.params)
    if fam.speculative:
        out += [p for p in DRAFTINGS[spec["drafting"]].params if p.applies is None or p.applies(spec)]
    return out


def normalize(entry: dict, where: str = "method", context: dict | None = None, grid: bool = False) -> dict:
    """A config entry (grid lists allowed when `grid`) or one point's spec, validated, defaults filled, and
    reduced to the keys that apply: name, drafting (speculative families), parameters (and seed, if given)."""
    if not isinstance(entry, dict):
        raise UserError(f"{where} = {entry!r} must be a mapping with a name, e.g. {{name: lantern, delta: 0.1, k: 10}}")
    fam = family(entry, where)
    context = context or {}
    spec = {"name": fam.name}
    if fam.speculative:
        drafting = entry.get("drafting", "chain")
        if drafting not in DRAFTINGS:
            raise UserError(f"{where}.drafting = {drafting!r} is not allowed; use one of {', '.join(DRAFTINGS)}")
        spec["drafting"] = drafting
        if "tree" in entry and drafting == "static":
            spec["tree"] = TREE.check(entry["tree"], f"{where}.tree", context)
        if "skip" in entry and drafting in SKIPPING:  # decides whether skip_every / similarity apply
            spec["skip"] = SKIP.check(entry["skip"], f"{where}.skip", context)
            if spec["skip"] == "similarity" and drafting == "chain":
                raise UserError(f"{where}.skip = 'similarity' needs a draft tree (a chain has one path to compare); "
                                "use drafting: static or dynamic, or skip: every")
        if "proactive" in entry and drafting == "jacobi":  # decides whether proactive_depth applies
            spec["proactive"] = PROACTIVE.check(entry["proactive"], f"{where}.proactive", context)
    params = _params(spec)
    known = {"name", "seed"} | ({"drafting"} if fam.speculative else set()) | {p.name for p in params}
    for key in entry:
        if key not in known:
            raise UserError(_not_applicable(fam, spec, key, params, where))
    for p in params:
        if p.name in spec:
            continue
        if p.name not in entry:
            if p.default is REQUIRED:
                example = {"delta": "0.1", "lam": "2", "k": "10"}.get(p.name, "...")
                raise UserError(f"{where} ({fam.name}) needs {p.name}; add e.g. {p.name}: [{example}]")
            if p.fill:
                spec[p.name] = p.default
            continue
        value = entry[p.name]
        if isinstance(value, list) and p.grid:
            if not grid:
                raise UserError(f"{where}.{p.name} = {value!r} must be one value here (lists only in the config's sweep)")
            if not value:
                raise UserError(f"{where}.{p.name} is an empty list; give at least one value")
            spec[p.name] = [p.check(v, f"{where}.{p.name}", context) for v in value]
        else:
            spec[p.name] = p.check(value, f"{where}.{p.name}", context)
    for p in params:
        if not p.fill and spec.get(p.name) == p.default:
            del spec[p.name]
    if fam.speculative and DRAFTINGS[spec["drafting"]].check is not None:
        DRAFTINGS[spec["drafting"]].check(spec, where)
    if "seed" in entry:
        spec["seed"] = entry["seed"]
    return spec


def _check_modes(value, where: str) -> list[str]:
    if not isinstance(value, list) or not value or any(m not in MODES for m in value):
        raise UserError(f"{where} = {value!r} must be a non-empty list of decoding modes from {list(MODES)}, e.g. "
                        "[sampling]; leave it out to run the point in every mode of sweep.modes")
    return list(dict.fromkeys(value))


def applicable(entry: dict) -> dict:
    """entry without the keys that do not apply to it (manifests of earlier versions carried config defaults such
    as gamma on a dynamic tree); what is left still goes through `normalize`."""
    if not isinstance(entry, dict) or entry.get("name") not in FAMILIES:
        return entry
    fam = FAMILIES[entry["name"]]
    spec = {"name": fam.name}
    if fam.speculative:
        spec["drafting"] = entry.get("drafting", "chain")
        if spec["drafting"] not in DRAFTINGS:
            return entry
        if spec["drafting"] == "static" and "tree" in entry:
            spec["tree"] = entry["tree"]
        if spec["drafting"] in SKIPPING and "skip" in entry:
            spec["skip"] = entry["skip"]
        if spec["drafting"] == "jacobi" and "proactive" in entry:
            spec["proactive"] = entry["proactive"]
    keep = {"name", "seed", "drafting"} | {p.name for p in _params(spec)}
    return {k: v for k, v in entry.items() if k in keep}


def _not_applicable(fam: Family, spec: dict, key: str, params: list[Param], where: str) -> str:
    what = fam.name + (f" with {spec['drafting']} drafting" if fam.speculative else "")
    takes = ", ".join(["drafting"] * fam.speculative + [p.name for p in params]) or "no parameters"
    known = {p.name for f in FAMILIES.values() for p in f.params} | {p.name for d in DRAFTINGS.values() for p in d.params}
    verb = "does not apply to" if key in known | {"drafting"} else "is not a parameter of"
    return f"{where}.{key} {verb} {what} (it takes {takes}); remove it"


def expand(entries: list[dict], seed: int, control_seed: int | None = None, context: dict | None = None,
           where: str = "sweep.methods") -> dict[str, dict]:
    """Sweep points as data: point name -> spec, each entry's list values expanded into a grid. `vanilla` also
    adds `vanilla-control` (seed control_seed). An entry's `modes` (a list of MODES) limits its points to those
    decoding modes (mode_points; a point's `modes` key, which decoder_spec drops). Two entries that give one point
    the same name are an error."""
    points: dict[str, dict] = {}
    origin: dict[str, int] = {}
    for i, entry in enumerate(entries):
        modes = None
        if isinstance(entry, dict) and "modes" in entry:  # where the point runs, not how it decodes
            modes = _check_modes(entry["modes"], f"{where}[{i}].modes")
            entry = {k: v for k, v in entry.items() if k != "modes"}
        spec = normalize(entry, f"{where}[{i}]", context, grid=True)
        axes = [k for k, v in spec.items() if isinstance(v, list) and k != "tree"]
        for values in itertools.product(*(spec[k] for k in axes)):
            point = {**spec, **dict(zip(axes, values)), "seed": spec.get("seed", seed)}
            if modes:
                point["modes"] = modes
            named = [(point_name(point), point)]
            if not speculative(point) and control_seed is not None:
                named.append((f"{point_name(point)}-control", {**point, "seed": control_seed}))
            for name, s in named:
                if name in points:
                    raise UserError(f"{where}[{i}] repeats the point {name} of {where}[{origin[name]}]; remove one")
                points[name], origin[name] = s, i
    return points


def mode_points(points: dict[str, dict], mode: str) -> dict[str, dict]:
    """The points a decoding mode runs: those whose entry names no `modes`, or names this one. Greedy decoding
    ignores the seed, so a control run (plain AR with another seed) would repeat vanilla byte for byte and give a
    noise band of zero by construction: greedy runs none, and its noise band comes from the bootstrap over images
    alone."""
    return {name: p for name, p in points.items() if mode in p.get("modes", MODES)
            and not (mode == "greedy" and name.endswith("-control"))}


def _digest(obj) -> str:
    """8 hex digits naming a custom value (a tree's rank paths) in a point name."""
    return hashlib.sha256(json.dumps(obj).encode()).hexdigest()[:8]


def point_name(spec: dict) -> str:
    """e.g. lantern-chain-g4-d0.1-k10, lanternpp-static-naive_extend_57-l5-k50, exact-dynamic-n30."""
    fam = FAMILIES[spec["name"]]
    if not fam.speculative:
        return fam.name
    parts = [fam.name, spec["drafting"]]
    for p in DRAFTINGS[spec["drafting"]].params + fam.params:
        if p.name not in spec or not p.in_name(spec):
            continue
        value = spec[p.name]
        if p.kind == "tree":
            parts.append(value if isinstance(value, str) else f"custom{_digest(value)}")
        else:
            parts.append(f"{p.tag}{p.format(value)}" if p.kind != "choice" else str(value))
    return "-".join(parts)


# -- what the workflow, tables and figures ask --------------------------------------------------------------------
def speculative(spec: dict) -> bool:
    return FAMILIES[spec["name"]].speculative


def needs_drafter(spec: dict) -> bool:
    return speculative(spec) and DRAFTINGS[spec.get("drafting", "chain")].drafter


def needs_neighbours(spec: dict) -> bool:
    return any(p.name == "k" for p in FAMILIES[spec["name"]].params)


def spec_columns() -> list[str]:
    """sweep.csv's method columns: name, drafting, every registered parameter, seed."""
    names = [p.name for f in FAMILIES.values() for p in f.params] + [p.name for d in DRAFTINGS.values() for p in d.params]
    return ["name", "drafting"] + list(dict.fromkeys(names)) + ["seed"]


def from_row(row) -> dict:
    """A spec from a table row (pandas NaN / None for parameters that do not apply; ints stored as floats)."""
    get = row.get if hasattr(row, "get") else row.__getitem__
    spec = {"name": get("name")}
    fam = FAMILIES.get(spec["name"])
    if fam is None:
        return spec
    if fam.speculative:
        spec["drafting"] = get("drafting")
    for p in fam.params + (DRAFTINGS[spec["drafting"]].params if fam.speculative and spec["drafting"] in DRAFTINGS else ()):
        value = get(p.name)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        spec[p.name] = int(value) if p.kind == "int" else value
    return spec


def order(spec: dict) -> tuple:
    """Registry order: families, then drafting kinds, as registered."""
    drafting = spec.get("drafting")
    return (list(FAMILIES).index(spec["name"]) if spec["name"] in FAMILIES else len(FAMILIES),
            list(DRAFTINGS).index(drafting) + 1 if drafting in DRAFTINGS else 0)


def label(name: str) -> str:
    return FAMILIES[name].label if name in FAMILIES else str(name)


def _value(p: Param, value) -> str:
    if isinstance(value, float) and value.is_integer() and p.kind == "int":
        value = int(value)
    return p.format(value)


def setting(spec: dict) -> str:
    """A point's hyperparameters in words, e.g. 'chain γ=4, δ=0.2, k=50' (vanilla: the empty string)."""
    fam = FAMILIES.get(spec["name"])
    if fam is None or not fam.speculative:
        return ""
    draft = DRAFTINGS[spec["drafting"]]
    shape = [draft.label]
    for p in draft.params:
        if p.name in spec and p.in_name(spec):
            shape.append(spec[p.name] if p.kind == "tree" and isinstance(spec[p.name], str) else
                         "custom" if p.kind == "tree" else f"{p.symbol or p.name}={_value(p, spec[p.name])}")
    parts = [" ".join(map(str, shape))]
    for p in fam.params:
        if p.name in spec and p.in_name(spec):
            parts.append(f"{p.name}={spec[p.name]}" if p.kind == "choice" else f"{p.symbol or p.name}={_value(p, spec[p.name])}")
    return ", ".join(parts)


def symbol(key: str) -> str:
    """A parameter's symbol in labels (δ for delta)."""
    found = [p for f in FAMILIES.values() for p in f.params] + [p for d in DRAFTINGS.values() for p in d.params]
    return next((p.symbol for p in found if p.name == key and p.symbol), key)


def relaxation_axes(name: str) -> list[str]:
    """The relaxation-strength parameters of a family (delta and k for LANTERN), the axes of its grid figures."""
    return [p.name for p in FAMILIES[name].params if p.relaxation] if name in FAMILIES else []


def shape_key(spec: dict) -> tuple:
    """Points that differ only in their relaxation grid share a shape key."""
    return tuple((k, json.dumps(v)) for k, v in spec.items()
                 if k not in ("seed", "modes", *relaxation_axes(spec["name"])))


def decoder_spec(point: dict) -> dict:
    """A sweep point's spec as its generation job takes it: without the modes it runs in."""
    return {k: v for k, v in point.items() if k != "modes"}


def shape_label(spec: dict) -> str:
    """The draft shape and non-relaxation settings of a point, e.g. 'chain γ=4' or 'static tree naive_extend_57'."""
    strength = set(relaxation_axes(spec["name"]))
    return setting({k: v for k, v in spec.items() if k not in strength})


# -- decoding -----------------------------------------------------------------------------------------------------
def rule(spec: dict):
    return FAMILIES[spec["name"]].rule(spec)


def drafting(spec: dict):
    return DRAFTINGS[spec["drafting"]].build(spec)


def build_decoder(spec: dict, params, target, drafter_path: str | None, neighbours_path: str | None,
                  vq_path: str | None, device, compile: bool = False, layout=None, drafter=None):
    """(cond [B] or [B, T, C], generators, cond_mask [B, T] or None) -> (tokens [B, N], [ImageStats] * B) for a
    speculative point (`lantern sample`): speculative.decode, the one loop of every drafting kind (one image is a
    batch of one). compile: its verify forward compiled with static shapes (engine/decoding/rounds.py). layout: the
    world's forced structural tokens (engine/models/layout.py; the table then covers its codes); drafter: one already
    loaded (a Chameleon world's), instead of drafter_path."""
    from lantern.engine.rules.neighbours import load_neighbours, read_codebook
    from lantern.engine.decoding.speculative import decode

    spec = normalize(spec)
    accept, draft = rule(spec), drafting(spec)
    if needs_drafter(spec) and not drafter_path and drafter is None:
        raise UserError(f"method {spec['name']} with {spec['drafting']} drafting needs a drafter checkpoint (--drafter)")
    table = None
    if accept.table_width:  # a relaxed rule that reads neighbours (Cool-SD reads none)
        if not neighbours_path or not vq_path:
            raise UserError(f"{accept.describe()} needs a neighbour table (--neighbours) and its VQ checkpoint (--vq)")
        table = load_neighbours(neighbours_path, read_codebook(vq_path), accept.table_width)
        codes = target.args.vocab_size if layout is None else layout.codebook  # a layout's head adds forced ids
        if table.shape[0] != codes:
            raise UserError(f"neighbour table {neighbours_path} covers {table.shape[0]} codes; the target has "
                            f"{codes}")
        table = table.to(device)
    if spec.get("skip") == "similarity":  # VVS compares draft paths by their codes' embeddings
        if not vq_path:
            raise UserError("skip: similarity needs the VQ checkpoint (--vq) for its codebook")
        from lantern.engine.decoding.skipping import attach_codebook

        codes = target.args.vocab_size if layout is None else layout.codebook  # trees draft codes under a layout
        attach_codebook(draft, read_codebook(vq_path), codes, device)
    if not needs_drafter(spec):
        drafter = None
    elif drafter is None:
        from lantern.engine.models.drafter import load_drafter

        drafter = load_drafter(drafter_path, target)

    def run(cond, generators, cond_mask=None):
        return decode(target, drafter, cond, params, accept, draft, generators, table, cond_mask, compile=compile,
                      layout=layout)

    return run


def describe() -> str:
    """The registry in words (`lantern methods`)."""
    lines = []
    for title, table in (("method families (name:)", FAMILIES), ("drafting kinds (drafting:)", DRAFTINGS)):
        lines.append(title)
        for entry in table.values():
            lines.append(f"  {entry.name}: {entry.doc}")
            for p in entry.params:
                default = "required" if p.default is REQUIRED else f"default {p.default}"
                lines.append(f"      {p.name} ({p.kind}, {default}{', list = grid' if p.grid else ''}): {p.doc}")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    """`lantern methods`: print every method family and drafting kind with its parameters."""
    if argv:
        raise UserError("usage: lantern methods (no arguments)")
    print(describe())
