"""Static and dynamic draft trees under a layout with forced structural tokens (engine/decoding/forced_trees.py,
docs/chameleon-layout.md "Tree rounds"), and chain and tree rounds as one compiled call under it ("Compiled
rounds"), on the tiny GPT with test_layout.py's toy layouts: 3 x 4 codes + eol (a depth-5 tree crosses one or two
row ends a round), 2 x 2 codes + eol for the exact law."""
import itertools

import pytest
import torch

from lantern.engine.decoding.chain import Chain
from lantern.engine.decoding.generate import generate
from lantern.engine.decoding.sampling import SamplingParams, image_generator, logits_to_probs, mix_cfg
from lantern.engine.decoding.speculative import decode
from lantern.engine.decoding.trees import DynamicTree, StaticTree, static_tree
from lantern.engine.models.drafter import Drafter
from lantern.engine.models.layout import Layout, code_steps, codes_to_ids, image_logits
from lantern.engine.rules.acceptance import AcceptRule
from lantern.errors import UserError
from tiny import assert_same_decodes, chi_square_pvalue, float64_pair, gens, one_thread, tiny_target  # noqa: F401 (fixture)

TOY = Layout("toy", 3, 4, eol=15, code_offset=0, codebook=15, vocab=16)
TABLE = torch.stack([torch.roll(torch.arange(15), -i)[1:] for i in range(15)])  # codes 0 .. 14
TREES = {"mc_sim_7b_63": lambda: static_tree("mc_sim_7b_63"), "twin_chain_8": lambda: static_tree("twin_chain_8"),
         "dynamic": lambda: DynamicTree(total_tokens=20, depth=4, top_k=4)}


@pytest.fixture(scope="module")
def toy_pair():
    """test_layout.py's pair: the tiny GPT in float64, an untrained drafter with random weights."""
    return float64_pair()


@pytest.mark.parametrize("tree", TREES)
def test_greedy_trees_with_a_layout_give_greedy_ar(toy_pair, tree):
    """Greedy trees over the codes, eol nodes spliced into the verify, give greedy AR's codes; tau counts codes over
    target forwards, the prefill and every round counted."""
    target, drafter = toy_pair
    params = SamplingParams(cfg_scale=2.0, greedy=True)
    cond = torch.arange(5) % 4
    want, _ = generate(target, cond, params, gens(5), layout=TOY)
    for rule in (AcceptRule(), AcceptRule("lantern", delta=0.4, k=5)):
        got, stats = decode(target, drafter, cond, params, rule, TREES[tree](), gens(5), TABLE, layout=TOY)
        if rule.kind == "exact":
            assert torch.equal(got, want)
        assert got.shape == (5, 12) and got.max() < 15
        for s in stats:
            rounds = len(s.accepted_per_step)
            assert s.n_tokens == 12 and s.target_forwards == 1 + rounds and s.tau == 12 / (1 + rounds)
            # the first code from the prefill, then each round its accepted codes and a bonus code, but none past
            # the grid when the last round's drafts complete it
            assert s.accepted_total + rounds in (11, 12)
        assert rule.kind == "exact" or sum(s.accepted_total for s in stats) > 20


def rank0_drafts(tree: StaticTree | None):
    """A recorder of each round's drafts along the top-ranked path, by the codes done when it was drafted (greedy
    drafts depend on the committed codes only)."""
    from lantern.engine.decoding.chain_rounds import ChainRounds
    from lantern.engine.decoding.tree_rounds import TreeRounds

    seen, chain_draft, tree_draft = {}, ChainRounds.draft, TreeRounds.draft  # before the test patches them
    if tree is None:
        def draft(self, images):
            chain_draft(self, images)
            seen.update({im.n: x[:g].tolist() for im, x, g in zip(images, self.X, self.g)})
        return seen, draft
    top = [tree.paths.index((0,) * d) for d in range(1, tree.depth + 1)]

    def draft(self, images):
        tree_draft(self, images)
        seen.update({im.n: im.draft.tokens[[i for i in top if i < len(im.draft.tokens)]].tolist() for im in images})
    return seen, draft


@pytest.mark.parametrize("tree", ["chain", "twin_chain_8", "mc_sim_7b_63"])
def test_tree_drafts_along_the_top_path_are_the_chains(toy_pair, tree, monkeypatch):
    """The drafter under a layout sees the eol tokens at their positions: a tree's top-ranked path holds, round by
    round, the chain's greedy drafts of that depth (chain_rounds' slots), sibling branches and their eol passes
    hidden from it; a chain-shaped tree also costs the chain's drafter forwards."""
    from lantern.engine.decoding.chain_rounds import ChainRounds
    from lantern.engine.decoding.tree_rounds import TreeRounds

    target, drafter = toy_pair
    params = SamplingParams(cfg_scale=2.0, greedy=True)
    cond = torch.arange(4) % 4
    shape = static_tree(tree, 6)
    chains, record = rank0_drafts(None)
    monkeypatch.setattr(ChainRounds, "draft", record)
    _, chain_stats = decode(target, drafter, cond[:1], params, AcceptRule(), Chain(shape.depth), gens(1), layout=TOY)
    monkeypatch.undo()
    paths, record = rank0_drafts(shape)
    monkeypatch.setattr(TreeRounds, "draft", record)
    _, tree_stats = decode(target, drafter, cond[:1], params, AcceptRule(), shape, gens(1), layout=TOY)
    common = set(chains) & set(paths)
    assert len(common) >= 3 and any((n - 1) % 4 == 3 for n in common)  # a round whose y ends a row
    assert all(chains[n] == paths[n] for n in common)
    if tree == "chain":
        assert chains == paths and chain_stats[0].drafter_forwards == tree_stats[0].drafter_forwards


RULES = {"exact": AcceptRule(), "lantern": AcceptRule("lantern", delta=0.3, k=5),
         "lanternpp-lumina": AcceptRule("lanternpp", lam=4.0, k=5, residual="lumina")}


@pytest.mark.parametrize("tree, rule", [("mc_sim_7b_63", "exact"), ("mc_sim_7b_63", "lantern"),
                                        ("mc_sim_7b_63", "lanternpp-lumina"), ("dynamic", "exact"),
                                        ("dynamic", "lanternpp-lumina")])
def test_sampled_trees_with_a_layout_batch_equals_one_by_one(toy_pair, tree, rule):
    """Each image of a batch gets the codes, rounds and stats it gets alone (float64): no uniform is spent on a
    forced token, so every image's stream is its own."""
    target, drafter = toy_pair
    params = SamplingParams(cfg_scale=2.0, top_k=10)
    cond = torch.arange(5) % 4
    got, stats = decode(target, drafter, cond, params, RULES[rule], TREES[tree](), gens(5, 2), TABLE, layout=TOY)
    alone = [decode(target, drafter, cond[i : i + 1], params, RULES[rule], TREES[tree](), gens(5, 2)[i : i + 1],
                    TABLE, layout=TOY) for i in range(5)]
    assert_same_decodes(got, stats, torch.cat([t for t, _ in alone]), [s for _, (s,) in alone], 12)
    assert got.max() < 15 and len({tuple(s.accepted_per_step) for s in stats}) > 1


SMALL = Layout("toy2", 2, 2, eol=3, code_offset=0, codebook=3, vocab=4)
# ranks below the 3 codes; depth 3 from code 0 crosses the row end after code 1 (and a round from code 1 starts on it)
SMALL_TREE = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)]


@pytest.mark.parametrize("tree", ["static", "dynamic"])
def test_exact_trees_with_a_layout_reproduce_the_authors_distribution(tree):
    """Exact tree SD over a 2 x 2 layout with an eol (codes 0..2, eol 3) emits the law of the authors' sequence: the
    joint of the four codes by one teacher-forced pass with the eol in place (chi-square over the 81 grids)."""
    layout = SMALL
    target = tiny_target(scale=4.0, vocab_size=4, image_tokens=9, num_classes=2)
    drafter = Drafter.from_target(target).eval()
    torch.nn.init.normal_(drafter.fc.weight, std=0.3)  # a poor drafter: plenty of rejections too
    params = SamplingParams(cfg_scale=2.0, top_k=2)
    codes = torch.tensor(list(itertools.product(range(3), repeat=4)))
    ids = codes_to_ids(layout, codes)  # [81, 6]: c c eol c c eol
    with torch.no_grad():
        logits, _ = target(torch.cat([torch.ones(81, dtype=torch.long), torch.full((81,), 2)]),
                           torch.cat([ids, ids])[:, :-1])
    probs = torch.stack([logits_to_probs(image_logits(layout, mix_cfg(logits[:, s], params, j)), params)
                         for j, s in enumerate(code_steps(layout, torch.arange(4)).tolist())], 1)
    joint = probs.gather(2, codes[:, :, None])[:, :, 0].double().prod(1)
    index = {tuple(c): i for i, c in enumerate(codes.tolist())}
    shape = StaticTree(SMALL_TREE) if tree == "static" else DynamicTree(total_tokens=7, depth=2, top_k=2)
    counts, rejected, n, B = torch.zeros(81, dtype=torch.float64), 0, 600, 50
    for first in range(0, n, B):
        got, stats = decode(target, drafter, torch.ones(B, dtype=torch.long), params, AcceptRule(), shape,
                            [image_generator(13, i) for i in range(first, first + B)], layout=layout)
        for c, s in zip(got.tolist(), stats):
            counts[index[tuple(c)]] += 1
            rejected += sum(a < d for a, d in zip(s.accepted_per_step, s.tree_depth))
    assert rejected > n / 6
    assert chi_square_pvalue(joint, counts, n) > 1e-3


@pytest.mark.parametrize("kind", ["chain", "mc_sim_7b_63", "twin_chain_8", "dynamic"])
@pytest.mark.parametrize("greedy, rule", [(True, "exact"), (False, "exact"), (False, "lanternpp-lumina")])
def test_graph_rounds_with_a_layout_equal_eager_rounds(toy_pair, monkeypatch, kind, greedy, rule):
    """compile=True's one-call rounds (chain_graph.chain_round, tree_graph.tree_round) at their static widths under
    the layout, run without inductor (float64, exact): every image's codes, rounds and stats as the eager rounds'."""
    from lantern.engine.decoding import compiled

    asked = []
    monkeypatch.setattr(compiled, "compiled_step", lambda fn, device: asked.append(fn.__name__) or fn)
    target, drafter = toy_pair
    params = SamplingParams(cfg_scale=2.0, greedy=greedy, top_k=10)
    drafting = Chain(6) if kind == "chain" else TREES[kind]()
    cond = torch.arange(5) % 4
    want, want_stats = decode(target, drafter, cond, params, RULES[rule], drafting, gens(5, 2), TABLE, layout=TOY)
    got, stats = decode(target, drafter, cond, params, RULES[rule], drafting, gens(5, 2), TABLE, layout=TOY,
                        compile=True)
    assert set(asked) == {"chain_round" if kind == "chain" else "tree_round"}
    assert_same_decodes(got, stats, want, want_stats, 12)


def test_a_layout_of_codes_only_runs_every_kind(toy_pair, monkeypatch):
    """A layout without forced tokens (Anole's kind; here codes at ids 1 .. 15): greedy chains and trees give greedy
    AR's codes, and the one-call rounds at static widths (no inductor) the eager rounds' sampled codes."""
    from lantern.engine.decoding import compiled

    monkeypatch.setattr(compiled, "compiled_step", lambda fn, device: fn)
    target, drafter = toy_pair
    layout, cond = Layout("codes", 3, 4, code_offset=1, codebook=15, vocab=16), torch.arange(4) % 4
    for greedy in (True, False):
        params = SamplingParams(cfg_scale=2.0, greedy=greedy, top_k=10)
        want, _ = generate(target, cond, params, gens(4, 2), layout=layout)
        for kind in (Chain(4), TREES["mc_sim_7b_63"](), TREES["dynamic"]()):
            got, stats = decode(target, drafter, cond, params, AcceptRule(), kind, gens(4, 2), layout=layout)
            assert not greedy or torch.equal(got, want)
            graph, graph_stats = decode(target, drafter, cond, params, AcceptRule(), kind, gens(4, 2),
                                        layout=layout, compile=True)
            assert_same_decodes(graph, graph_stats, got, stats, 12)


@pytest.mark.slow
def test_compiled_rounds_with_a_layout_give_eager_codes(one_thread):
    """Inductor's compiled chain and static-tree rounds under the layout (float32, one graph each, about two minutes
    on 2 cores) give the eager rounds' codes and rounds."""
    torch.manual_seed(3)
    target = tiny_target(scale=3.0)
    drafter = Drafter.from_target(target).eval()
    torch.nn.init.normal_(drafter.fc.weight, std=0.3)
    params, cond = SamplingParams(cfg_scale=2.0, top_k=8), torch.tensor([0, 3, 1])
    from torch._dynamo.utils import counters

    for drafting in (Chain(4), static_tree("mc_sim_7b_63")):
        before = counters["stats"]["unique_graphs"]
        want, want_stats = decode(target, drafter, cond, params, RULES["lantern"], drafting, gens(3), TABLE,
                                  layout=TOY)
        got, stats = decode(target, drafter, cond, params, RULES["lantern"], drafting, gens(3), TABLE, layout=TOY,
                            compile=True)
        assert_same_decodes(got, stats, want, want_stats, 12)
        assert counters["stats"]["unique_graphs"] > before  # the round really compiled (no eager fallback)


def test_layouts_refuse_what_does_not_run(toy_pair):
    """Trees that rank past the codebook are refused in one line (skipped verifies and the proactive tree run:
    tests/test_layout_skipping.py, tests/test_layout_jacobi_tree.py)."""
    target, drafter = toy_pair
    small = Layout("toy3", 3, 4, eol=15, code_offset=0, codebook=3, vocab=16)
    with pytest.raises(UserError, match="beyond the 3 image codes"):
        decode(target, drafter, torch.arange(1), SamplingParams(), AcceptRule(), static_tree("mc_sim_7b_63"), gens(1),
               layout=small)
