"""Which rounds run each drafting kind: the one place that pairs a kind's drafts (chain.Chain, trees.StaticTree /
DynamicTree, jacobi.Jacobi) with its batched rounds, so that speculative.decode's loop knows no drafting kind and a
new kind is a Rounds class and a line here."""

from __future__ import annotations

from torch import Tensor

from lantern.engine.decoding.chain import Chain
from lantern.engine.decoding.chain_graph import GraphChainRounds, graph_capturable
from lantern.engine.decoding.chain_rounds import ChainRounds
from lantern.engine.decoding.jacobi import Jacobi, JacobiRounds
from lantern.engine.decoding.jacobi_graph import GraphJacobiRounds
from lantern.engine.decoding.jacobi_tree import JacobiTreeRounds, ProactiveJacobi
from lantern.engine.decoding.jacobi_tree_graph import GraphJacobiTreeRounds
from lantern.engine.decoding.sampling import SamplingParams
from lantern.engine.decoding.skipping import SkippingChainRounds, SkippingTreeRounds, skips
from lantern.engine.decoding.tree_graph import GraphTreeRounds
from lantern.engine.decoding.tree_rounds import TreeRounds
from lantern.engine.decoding.trees import DynamicTree, StaticTree
from lantern.engine.models.layout import Layout
from lantern.engine.models.model import GPT
from lantern.engine.rules.acceptance import AcceptRule
from lantern.errors import UserError


def layout_refusal(drafting, compile: bool = False, rule: AcceptRule | None = None, codebook: int | None = None,
                   drafter: bool = True) -> str | None:
    """Why rounds cannot decode `drafting` (None: plain AR) under a layout with forced tokens
    (docs/chameleon-layout.md), or None: plain AR, chain, tree and Jacobi rounds (SJD-PAC's proactive tree too) can,
    eager or compiled, and skipped verifies (VVS) eager. The one condition: rounds_for applies it, and the config
    check asks it (through layout_supported) before any job, so both follow what is built."""
    if isinstance(drafting, ProactiveJacobi) and codebook is not None and drafting.proactive > codebook:
        return f"proactive={drafting.proactive} candidates per position exceed the {codebook} image codes"
    if drafting is None or isinstance(drafting, Jacobi):
        return None
    if not drafter:
        return f"{type(drafting).__name__} drafting needs a drafter"
    if compile and rule is not None and not graph_capturable(rule):
        return f"{rule.describe()} has no compiled round; decode with compile off"
    if isinstance(drafting, (StaticTree, DynamicTree)) and codebook is not None and drafting.max_rank >= codebook:
        return f"{drafting.describe()} drafts rank {drafting.max_rank}, beyond the {codebook} image codes"
    return None


def layout_supported(drafting, compile: bool = False) -> bool:
    """Whether rounds_for runs `drafting` (None: plain AR) under a layout with forced structural tokens."""
    return layout_refusal(drafting, compile) is None


def rounds_for(drafting, target: GPT, drafter, params: SamplingParams, rule: AcceptRule, table: Tensor | None,
               B: int, compile: bool = False, layout: Layout | None = None):
    """compile: every kind under every rule with a device form (chain_graph.graph_capturable: all of the registry's)
    runs each round as one compiled call (chain_graph.py, tree_graph.py, jacobi_graph.py: every coupling too); drafts that skip
    verifies (VVS, skipping.py) run eagerly. layout (forced structural tokens, docs/chameleon-layout.md): the rounds
    `layout_refusal` allows. SJD-PAC's proactive tree: jacobi_tree.py's rounds, jacobi_tree_graph.py's compiled."""
    if layout is not None:
        refused = layout_refusal(drafting, compile, rule, layout.codebook, drafter is not None)
        if refused:
            raise UserError(f"layout {layout.name} (forced structural tokens): {refused}")
    if isinstance(drafting, ProactiveJacobi):
        graph = compile and graph_capturable(rule)
        return (GraphJacobiTreeRounds if graph else JacobiTreeRounds)(target, drafting, params, rule, table, B, layout)
    if isinstance(drafting, Jacobi):
        graph = compile and graph_capturable(rule)
        return (GraphJacobiRounds if graph else JacobiRounds)(target, drafting, params, rule, table, B, layout)
    if layout is not None:
        chain = isinstance(drafting, Chain)
        kind = (GraphChainRounds if chain else GraphTreeRounds) if compile else ChainRounds if chain else TreeRounds
        if skips(drafting):  # VVS: eager rounds (speculative.decode compiles none of them)
            kind = SkippingChainRounds if chain else SkippingTreeRounds
        rounds = kind(target, drafter, drafting, params, rule, table, B)
        rounds.use_layout(layout)
        return rounds
    if drafter is None:
        raise ValueError(f"{type(drafting).__name__} drafting needs a drafter")
    if skips(drafting):  # VVS: eager rounds (speculative.decode compiles none of them)
        kind = SkippingChainRounds if isinstance(drafting, Chain) else SkippingTreeRounds
        return kind(target, drafter, drafting, params, rule, table, B)
    if compile and graph_capturable(rule):
        if isinstance(drafting, Chain):
            return GraphChainRounds(target, drafter, drafting, params, rule, table, B)
        if isinstance(drafting, (StaticTree, DynamicTree)):
            return GraphTreeRounds(target, drafter, drafting, params, rule, table, B)
    kind = ChainRounds if isinstance(drafting, Chain) else TreeRounds
    return kind(target, drafter, drafting, params, rule, table, B)
