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
from lantern.engine.decoding.sampling import SamplingParams
from lantern.engine.decoding.skipping import SkippingChainRounds, SkippingTreeRounds, skips
from lantern.engine.decoding.tree_graph import GraphTreeRounds
from lantern.engine.decoding.tree_rounds import TreeRounds
from lantern.engine.decoding.trees import DynamicTree, StaticTree
from lantern.engine.models.layout import Layout
from lantern.engine.models.model import GPT
from lantern.engine.rules.acceptance import AcceptRule
from lantern.errors import UserError


def layout_supported(drafting, compile: bool = False) -> bool:
    """Whether rounds_for runs `drafting` (a drafting object; plain AR has none and always runs) under a layout with
    forced structural tokens: the one condition, which the config check asks too, so it follows what is built."""
    return drafting is None or (isinstance(drafting, Chain) and not compile and not skips(drafting))


def rounds_for(drafting, target: GPT, drafter, params: SamplingParams, rule: AcceptRule, table: Tensor | None,
               B: int, compile: bool = False, layout: Layout | None = None):
    """compile: every kind under every rule with a device form (chain_graph.graph_capturable: all of the registry's)
    runs each round as one compiled call (chain_graph.py, tree_graph.py, jacobi_graph.py: every coupling too); drafts that skip
    verifies (VVS, skipping.py) run eagerly. layout (forced structural tokens, docs/chameleon-layout.md): eager
    chain rounds only so far."""
    if layout is not None:
        if not layout_supported(drafting, compile) or drafter is None:
            raise UserError(f"layout {layout.name} (forced structural tokens) runs with chain drafting, eager, "
                            "without skipped verifies, so far; trees, Jacobi windows and compiled rounds are "
                            "designed in docs/chameleon-layout.md")
        rounds = ChainRounds(target, drafter, drafting, params, rule, table, B)
        rounds.use_layout(layout)
        return rounds
    if isinstance(drafting, Jacobi):
        graph = compile and graph_capturable(rule)
        return (GraphJacobiRounds if graph else JacobiRounds)(target, drafting, params, rule, table, B)
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
