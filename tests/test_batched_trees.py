"""Batched draft-tree speculative decoding (engine/decoding/tree_rounds.py): static and dynamic trees decode every
image as a batch of one does (same tokens, rounds and stats; float64), and batched exact static
trees sample the target's distribution."""
import copy

import pytest
import torch

from lantern.engine.decoding import tree_rounds
from lantern.engine.rules.acceptance import AcceptRule
from lantern.engine.models.drafter import AUTHORS_LLAMAGEN, Drafter, DrafterOptions
from lantern.engine.models.model import KVCache
from lantern.engine.decoding.sampling import SamplingParams, image_generator
from lantern.engine.decoding.speculative import decode
from lantern.engine.decoding.stats import GpuPath
from lantern.engine.decoding.trees import DynamicTree, StaticTree, static_tree
from lantern.errors import UserError
from lantern.syncs import SyncCounter
from test_batched import RULES, TABLE
from tiny import assert_same_decodes, one_by_one, ragged_t2i, chi_square_pvalue, exact_joint, gens, one_thread, tiny_target, trained  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("one_thread")

RULES = {k: RULES[k] for k in ("exact", "lantern", "lanternpp")}
TREES = {
    # a small custom shape whose second branch is deeper than its first: accepted paths off the top-ranked branch
    # move in the cache
    "small": StaticTree([[0], [1], [2], [0, 0], [0, 1], [1, 0], [1, 0, 0], [1, 0, 0, 0]]),
    "twin_chain_8": static_tree("twin_chain_8"),
    "dynamic": DynamicTree(total_tokens=12, depth=3, top_k=3),
}


@pytest.fixture(scope="module")
def f64(trained):
    target, drafter = copy.deepcopy(trained)
    return target.double(), drafter.double()


def check_same(target, drafter, cond, params, rule, tree, cond_mask=None, seed=0):
    """Batched == one by one: tokens, rounds and stats of every image; returns the batched stats."""
    B = cond.shape[0]
    want, want_stats = one_by_one(target, drafter, cond, params, rule, tree, gens(B, seed), TABLE, cond_mask)
    got, stats = decode(target, drafter, cond, params, rule, tree, gens(B, seed), TABLE, cond_mask)
    assert_same_decodes(got, stats, want, want_stats, target.args.image_tokens)
    return stats


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("greedy, cfg", [(True, 1.0), (True, 3.0), (False, 1.0), (False, 3.0)])
def test_batched_trees_equal_one_by_one(f64, tree, rule, greedy, cfg):
    target, drafter = f64
    check_same(target, drafter, torch.arange(3) % 4, SamplingParams(cfg_scale=cfg, greedy=greedy), RULES[rule],
               TREES[tree])


@pytest.mark.parametrize("B", [1, 3, 5])
@pytest.mark.parametrize("tree", ["deep", "dynamic"])
def test_ragged_rounds(f64, monkeypatch, B, tree):
    """Images accept different paths each round and finish in different rounds; the deep static tree (depth 9)
    and the dynamic tree (drafts 4 deep) are cut near each image's end at different rounds. cfg_interval makes
    each position's distribution depend on its own image-token index. Paths off the first branch move cache
    entries (GPT.keep_rows)."""
    target, drafter = f64
    shape = StaticTree([(0,) * d for d in range(1, 10)] + [(1,), (1, 0), (1, 0, 0), (0, 1), (0, 1, 0)]) \
        if tree == "deep" else TREES["dynamic"]
    moves = []
    keep_rows = type(target).keep_rows
    monkeypatch.setattr(type(target), "keep_rows", lambda self, *a: (moves.append(a), keep_rows(self, *a)))
    params = SamplingParams(cfg_scale=2.0, cfg_interval=4, top_k=8, top_p=0.95)
    stats = check_same(target, drafter, torch.arange(B) % 4, params, RULES["lantern"], shape, seed=3)
    full = shape.depth if tree == "deep" else shape.depth + 1
    if B > 1:
        assert any(d < full for s in stats for d in s.tree_depth)  # cut near the end
        assert len({len(s.accepted_per_step) for s in stats}) > 1
        assert len({tuple(s.tree_depth) for s in stats}) > 1
        assert moves
    assert all(s.target_forwards == 1 + len(s.accepted_per_step) for s in stats)


@pytest.mark.parametrize("options", [DrafterOptions(), AUTHORS_LLAMAGEN], ids=["ours", "authors"])
@pytest.mark.parametrize("greedy", [True, False])
def test_t2i_ragged_caption_masks(options, greedy):
    target, drafter, cond, mask = ragged_t2i(options)
    for tree, rule in (("small", "exact"), ("dynamic", "lantern")):
        check_same(target, drafter, cond, SamplingParams(cfg_scale=2.0, greedy=greedy), RULES[rule], TREES[tree],
                   cond_mask=mask)


def test_keep_rows_moves_each_rows_own_slots():
    cache = KVCache(3, 2, 8, 4, torch.float64, "cpu")
    cache.k.copy_(torch.randn_like(cache.k))
    cache.v.copy_(torch.randn_like(cache.v))
    want_k, want_v = cache.k.clone(), cache.v.clone()
    for r, src, dst in ((0, [3, 5], 2), (2, [4, 5, 7], 3)):  # row 2 overlaps its own sources
        want_k[r, :, dst : dst + len(src)] = want_k[r, :, src]
        want_v[r, :, dst : dst + len(src)] = want_v[r, :, src]
    cache.keep_rows(torch.tensor([0, 0, 2, 2, 2]), torch.tensor([3, 5, 4, 5, 7]), torch.tensor([2, 3, 3, 4, 5]))
    assert torch.equal(cache.k, want_k) and torch.equal(cache.v, want_v)


def test_batched_exact_static_tree_sampling_reproduces_the_target_distribution():
    V, N, n, B = 3, 4, 700, 35
    target = tiny_target(scale=4.0, vocab_size=V, image_tokens=N, num_classes=2, n_layer=1)
    drafter = Drafter.from_target(target).eval()
    torch.nn.init.normal_(drafter.fc.weight, std=0.3)  # a poor drafter: plenty of rejections too
    params = SamplingParams(cfg_scale=2.0, top_k=2)
    # the shape offers a third root child, past the drafter's top-2 support: never a candidate
    tree = StaticTree([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    seqs, joint = exact_joint(target, 1, params, V, N)
    index = {tuple(s): i for i, s in enumerate(seqs.tolist())}
    counts = torch.zeros(len(seqs), dtype=torch.float64)
    accepted = rejected = 0
    for first in range(0, n, B):
        tokens, stats = decode(target, drafter, torch.ones(B, dtype=torch.long), params,
                                                     AcceptRule(), tree,
                                                     [image_generator(13, i) for i in range(first, first + B)])
        for t, s in zip(tokens.tolist(), stats):
            counts[index[tuple(t)]] += 1
            accepted += s.accepted_total
            rejected += sum(a < d for a, d in zip(s.accepted_per_step, s.tree_depth))
    assert accepted > n / 6 and rejected > n / 6
    assert chi_square_pvalue(joint, counts, n) > 1e-3


def test_bad_calls(f64):
    target, drafter = f64
    with pytest.raises(ValueError, match="one generator per image"):
        decode(target, drafter, torch.arange(3), SamplingParams(), AcceptRule(), TREES["small"],
                                     gens(2))
    with pytest.raises(UserError, match="neighbour table"):
        decode(target, drafter, torch.arange(2), SamplingParams(), RULES["lantern"],
                                     TREES["dynamic"], gens(2))
    with pytest.raises(UserError, match="beyond the vocabulary"):
        decode(target, drafter, torch.arange(2), SamplingParams(), AcceptRule(),
                                     DynamicTree(top_k=17), gens(2))


@pytest.mark.parametrize("tree", ["naive_extend_57", "dynamic"])
@pytest.mark.parametrize("rule", ["exact", "lantern", "lanternpp"])
def test_cpu_walk_shortcut_changes_no_token(trained, monkeypatch, tree, rule):
    """The sampled walk skips, on a CPU, the children and depths no tree can still reach (tree_rounds.settled);
    the GPU path runs them all. Both give the same tokens and stats, bit for bit."""
    target, drafter = trained
    shape = static_tree(tree) if tree != "dynamic" else DynamicTree()
    cond = torch.arange(6) % target.args.num_classes
    run = lambda: decode(target, drafter, cond, SamplingParams(cfg_scale=2.0), RULES[rule], shape, gens(6, 2), TABLE)  # noqa: E731
    skipped = []
    monkeypatch.setattr(tree_rounds, "settled",
                        lambda live, f=tree_rounds.settled: skipped.append(f(live)) or skipped[-1])
    cpu, cpu_stats = run()
    assert any(skipped)  # the shortcut really fired
    monkeypatch.setattr(GpuPath, "counting", 1)  # the GPU path
    gpu, gpu_stats = run()
    assert_same_decodes(cpu, cpu_stats, gpu, gpu_stats, target.args.image_tokens)


@pytest.mark.parametrize("tree", ["naive_extend_57", "dynamic"])
@pytest.mark.parametrize("rule", ["exact", "lantern"])
@pytest.mark.parametrize("greedy", [True, False])
def test_tree_rounds_take_at_most_12_host_syncs(trained, tree, rule, greedy):
    """Issue #27: a tree round of a batch of 8 costs at most 12 host syncs (lantern.syncs counts them on a CPU),
    greedy and sampling: the acceptance of every image runs on the device at once, one read per round."""
    target, drafter = trained
    shape = static_tree(tree) if tree != "dynamic" else DynamicTree()
    cond = torch.arange(8) % target.args.num_classes
    with SyncCounter() as c:
        _, stats = decode(target, drafter, cond, SamplingParams(cfg_scale=2.0, greedy=greedy), RULES[rule], shape,
                          gens(8, 0), TABLE)
    rounds = max(len(s.accepted_per_step) for s in stats)
    assert c.total <= 12 * rounds, sorted(c.sites.items(), key=lambda kv: -kv[1])[:5]
