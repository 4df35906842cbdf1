import pytest
import torch

from lantern.engine.rules.acceptance import AcceptRule, accept_probability, after_rejection, sibling_budget
from lantern.engine.models.drafter import Drafter, target_states
from lantern.errors import UserError
from lantern.engine.decoding.generate import decode_one_token, generate, prefill
from lantern.engine.decoding.sampling import SamplingParams, image_generator, row_probs
from lantern.engine.decoding.chain import Chain
from lantern.engine.methods import drafting, normalize
from lantern.engine.decoding.speculative import decode
from lantern.pipeline.tables import accepted_mask
from lantern.engine.decoding.trees import (
    Draft, DynamicTree, StaticTree, static_tree, validate_tree_paths,
)
from lantern.engine.decoding.rounds import SCRATCH, Image
from lantern.engine.decoding.tree_rounds import TreeRounds
from lantern.engine.decoding.stats import ImageStats
from tiny import chi_square_pvalue, decode_one, exact_joint, gens, one_thread, tiny_target, trained, trained_fused  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("one_thread")


def tree_from_method(spec: dict):
    """The draft tree of a sweep method spec, as the registry builds it."""
    return drafting(normalize({"name": "exact", **spec}))


TREES = {
    "static": static_tree("naive_extend_57"),
    "dynamic": DynamicTree(),
    "small-dynamic": DynamicTree(total_tokens=12, depth=3, top_k=3),
}


# -- shapes -------------------------------------------------------------------------------------------------------
def _fan(prefix, n):
    return [list(prefix) + [r] for r in range(n)]


# The authors' naive_extend_57 (jadohu/LANTERN, models/drafters/choices.py), written out by parent and fan-out.
AUTHORS_NAIVE_EXTEND_57 = (
    _fan([], 5)
    + _fan([0], 4) + _fan([1], 3) + _fan([2], 3) + _fan([3], 2) + _fan([4], 1)
    + _fan([0, 0], 4) + _fan([0, 1], 3) + _fan([0, 2], 3) + _fan([0, 3], 2) + _fan([1, 0], 2) + _fan([1, 1], 1)
    + _fan([2, 0], 1)
    + _fan([0, 0, 0], 4) + _fan([0, 0, 1], 3) + _fan([0, 0, 2], 2) + _fan([0, 0, 3], 1) + _fan([0, 1, 0], 2)
    + _fan([0, 1, 1], 1) + _fan([0, 2, 0], 1)
    + _fan([0, 0, 0, 0], 3) + _fan([0, 0, 0, 1], 2) + _fan([0, 0, 1, 0], 2) + _fan([0, 0, 1, 1], 1)
    + _fan([0, 0, 2, 0], 1)
)


def test_naive_extend_57_is_the_authors_tree_node_for_node():
    tree = static_tree("naive_extend_57")
    assert len(AUTHORS_NAIVE_EXTEND_57) == 57
    # every node, in the authors' order (sorted by depth, then lexicographically)
    assert tree.paths == sorted(map(tuple, AUTHORS_NAIVE_EXTEND_57), key=lambda p: (len(p), p))
    assert [tree.paths[i] for i in (0, 4, 5, 17, 18, 33, 34, 47, 48, 56)] == [
        (0,), (4,), (0, 0), (4, 0), (0, 0, 0), (2, 0, 0), (0, 0, 0, 0), (0, 2, 0, 0), (0, 0, 0, 0, 0), (0, 0, 2, 0, 0)]
    assert torch.bincount(tree.depths).tolist() == [0, 5, 13, 16, 14, 9]
    assert tree.max_rank == 4 and [len(c) for c in tree.children[:6]] == [5, 4, 3, 3, 2, 1]
    # the same list handed in as a custom tree builds the same shape
    custom = tree_from_method({"drafting": "static", "tree": AUTHORS_NAIVE_EXTEND_57[::-1]})
    assert custom.paths == tree.paths and custom.children == tree.children and torch.equal(custom.block, tree.block)


def test_naive_extend_57_shape():
    tree = static_tree("naive_extend_57")
    assert tree.n == 57 and tree.depth == 5 and tree.max_rank < 10
    assert torch.bincount(tree.depths).tolist() == [0, 5, 13, 16, 14, 9]
    assert tree_from_method({"drafting": "static"}).paths == tree.paths  # the default
    # parents come before children and every node's mask row is its path
    for i, p in enumerate(tree.paths):
        anc = [tree.paths[j] for j in tree.anc[i].nonzero().flatten().tolist()]
        assert anc == [p[:d] for d in range(1, len(p) + 1)]
    assert tree.upto(2).n == 18 and tree.upto(9) is tree


# The authors' Lumina-mGPT tree: EAGLE-1's mc_sim_7b_63 (SafeAILab/EAGLE model/choices.py, used by jadohu/LANTERN
# with eagle_version 1), written out by parent and fan-out.
AUTHORS_MC_SIM_7B_63 = (
    _fan([], 4)
    + _fan([0], 3) + _fan([1], 2) + _fan([2], 2) + _fan([3], 1)
    + _fan([0, 0], 3) + _fan([0, 1], 2) + _fan([0, 2], 2) + _fan([1, 0], 1)
    + _fan([0, 0, 0], 3)
    + _fan([0, 0, 0, 0], 2)
)


def test_mc_sim_7b_63_is_the_authors_tree_node_for_node():
    tree = tree_from_method({"drafting": "static", "tree": "mc_sim_7b_63"})
    assert len(AUTHORS_MC_SIM_7B_63) == 25 and tree.n == 25 and tree.depth == 5
    assert tree.paths == sorted(map(tuple, AUTHORS_MC_SIM_7B_63), key=lambda p: (len(p), p))
    assert torch.bincount(tree.depths).tolist() == [0, 4, 8, 8, 3, 2]
    assert tree.max_rank == 3 and tree.fanout == [4, 3, 3, 3, 2, 0]
    # EAGLE's listing, in its own order (the first node per depth and the deepest two)
    assert [tree.paths[i] for i in (0, 3, 4, 11, 12, 19, 20, 22, 23, 24)] == [
        (0,), (3,), (0, 0), (3, 0), (0, 0, 0), (1, 0, 0), (0, 0, 0, 0), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1)]
    custom = tree_from_method({"drafting": "static", "tree": AUTHORS_MC_SIM_7B_63[::-1]})
    assert custom.paths == tree.paths and torch.equal(custom.block, tree.block)
    assert normalize({"name": "lanternpp", "drafting": "static", "tree": "mc_sim_7b_63", "lam": 5, "k": 10})[
        "tree"] == "mc_sim_7b_63"


@pytest.mark.parametrize("greedy", [True, False])
def test_mc_sim_7b_63_decodes(trained, greedy):
    """A decode with the Lumina tree: greedy gives greedy AR's tokens; sampled LANTERN++ runs to full images with
    accepted paths no deeper than the tree."""
    target, drafter = trained
    tree = static_tree("mc_sim_7b_63")
    params = SamplingParams(cfg_scale=2.0, greedy=greedy)
    cond = torch.arange(4)
    if greedy:
        ar, _ = generate(target, cond, params, gens(4))
        out, stats = decode(target, drafter, cond, params, AcceptRule(), tree, gens(4))
        assert torch.equal(out, ar)
    else:
        table = torch.stack([torch.roll(torch.arange(16), -i)[1:] for i in range(16)])
        rule = AcceptRule("lanternpp", lam=5.0, k=10, residual="lumina")  # the authors' Lumina-mGPT setting
        out, stats = decode(target, drafter, cond, params, rule, tree, gens(4), table=table)
        assert out.shape == (4, 16) and out.min() >= 0 and out.max() < 16
    assert sum(s.accepted_total for s in stats) > 8
    assert all(a <= d <= 5 for s in stats for a, d in zip(s.accepted_per_step, s.tree_depth))


def test_shape_specs_and_errors():
    chain = tree_from_method({"drafting": "static", "tree": "chain", "gamma": 6})
    assert chain.paths == [(0,) * d for d in range(1, 7)]
    custom = tree_from_method({"drafting": "static", "tree": [[1], [0], [0, 0]]})
    assert custom.paths == [(0,), (1,), (0, 0)] and custom.children == [[0, 1], [2], [], []]
    dyn = tree_from_method({"drafting": "dynamic", "top_k": 4})
    assert dyn == DynamicTree(59, 4, 4) and tree_from_method({"drafting": "dynamic"}) == DynamicTree(59, 4, 10)
    assert static_tree("twin_chain_8").n == 16 and static_tree("twin_chain_8").depth == 8
    assert validate_tree_paths([[0, 0], [1], [0]]) == [(0,), (1,), (0, 0)]
    assert validate_tree_paths([[r] for r in range(10)])[-1] == (9,)
    for bad, needle in [([[0], [0, 0, 0]], "no parent"), ([[0], [2]], "skips rank"), ([[0], [0]], "twice"),
                        ([[0], [-1]], "ranks"), ([], "non-empty"), ("bushy", "not a static tree"),
                        ([[r] for r in range(11)], "ranks must be < 10"), ([[0], [0, True]], "ranks"),
                        ([[0], "0"], "ranks"), ([[0], [0, 1.0]], "ranks")]:
        with pytest.raises(UserError, match=needle) as e:
            tree_from_method({"drafting": "static", "tree": bad})
        assert "\n" not in str(e.value)
        if not isinstance(bad, str):
            with pytest.raises(UserError, match=needle):
                validate_tree_paths(bad)
    with pytest.raises(UserError, match="gamma"):
        static_tree("chain", 0)
    with pytest.raises(UserError, match="top_k"):
        DynamicTree(top_k=0)


# -- greedy: exactly the AR tokens ---------------------------------------------------------------------------------
@pytest.mark.parametrize("pair", ["trained", "trained_fused"])  # EAGLE-1, and a drafter reading target layers
@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_greedy_tree_decoding_equals_greedy_ar(pair, cfg, request):
    target, drafter = request.getfixturevalue(pair)
    params = SamplingParams(cfg_scale=cfg, greedy=True, top_k=8)
    cond = torch.arange(4)
    ar, _ = generate(target, cond, params, gens(4))
    for name, tree in TREES.items():
        out, stats = decode(target, drafter, cond, params, AcceptRule(), tree, gens(4))
        assert torch.equal(out, ar), name
        assert sum(s.accepted_total for s in stats) > 20  # long accepted paths were exercised, not only corrections


def test_greedy_tree_equals_ar_t2i_with_padding():
    target = tiny_target("t2i")
    drafter = Drafter.from_target(target).eval()
    cond = torch.randn(2, 5, 12)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    params = SamplingParams(cfg_scale=2.0, greedy=True)
    ar, _ = generate(target, cond, params, gens(2), cond_mask=mask)
    for tree in (TREES["static"], TREES["small-dynamic"]):
        out, _ = decode(target, drafter, cond, params, AcceptRule(), tree, gens(2), cond_mask=mask)
        assert torch.equal(out, ar)


def test_chain_shaped_tree_is_chain_sd(trained):
    target, drafter = trained
    params = SamplingParams(cfg_scale=2.0, greedy=True)
    cond = torch.arange(4)
    want, want_stats = decode(target, drafter, cond, params, AcceptRule(), Chain(3), gens(4))
    got, stats = decode(target, drafter, cond, params, AcceptRule(), static_tree("chain", 3), gens(4))
    assert torch.equal(got, want)
    assert [s.accepted_per_step for s in stats] == [s.accepted_per_step for s in want_stats]
    assert all(s.drafter_forwards == w.drafter_forwards for s, w in zip(stats, want_stats))


@pytest.mark.parametrize("greedy", [True, False])
def test_stats_rows(trained, greedy):
    target, drafter = trained
    params = SamplingParams(cfg_scale=2.0, greedy=greedy)
    for tree in TREES.values():
        tokens, s = decode_one(target, drafter, torch.tensor([1]), params, AcceptRule(), tree, gens(1)[0])
        assert tokens.shape == (16,) and s.target_forwards == 1 + len(s.accepted_per_step)
        assert s.accepted_total == sum(s.accepted_per_step)
        assert all(a <= d <= 5 for a, d in zip(s.accepted_per_step, s.tree_depth))
        assert s.tau == 16 / s.target_forwards and s.time_draft_s > 0 and s.time_verify_s > 0
        row = s.row()
        assert row["tree_depth"] == " ".join(map(str, s.tree_depth))
        accepted_mask(torch.tensor(s.accepted_per_step).numpy(), 16)  # consistent with the tables' token layout


@pytest.mark.parametrize("greedy", [True, False])
def test_relaxation_deepens_trees(trained, greedy):
    target, drafter = trained
    params = SamplingParams(cfg_scale=2.0, greedy=greedy)
    table = torch.stack([torch.roll(torch.arange(16), -i)[1:] for i in range(16)])
    cond = torch.arange(4).repeat(2)
    tau = lambda stats: sum(s.tau for s in stats) / len(stats)  # noqa: E731
    for tree in (TREES["static"], TREES["dynamic"]):
        _, exact = decode(target, drafter, cond, params, AcceptRule(), tree, gens(8))
        for rule in (AcceptRule("lantern", delta=0.4, k=15), AcceptRule("lanternpp", lam=20.0, k=15)):
            tokens, relaxed = decode(target, drafter, cond, params, rule, tree, gens(8), table=table)
            assert tokens.min() >= 0 and tokens.max() < 16
            assert tau(relaxed) > tau(exact)


def test_relaxed_tree_needs_a_table(trained):
    target, drafter = trained
    with pytest.raises(UserError, match="neighbour table"):
        decode_one(target, drafter, torch.tensor([0]), SamplingParams(), AcceptRule("lanternpp", lam=2.0, k=3),
                           TREES["static"], gens(1)[0])
    small = tiny_target(vocab_size=4, image_tokens=4)
    with pytest.raises(UserError, match="beyond the vocabulary"):
        decode_one(small, Drafter.from_target(small), torch.tensor([0]), SamplingParams(), AcceptRule(),
                           TREES["static"], gens(1)[0])


# -- masks and cache compaction against brute force ---------------------------------------------------------------
def full_next(target, rows, seq):
    """Brute force: a full uncached forward over seq; the logits predicting the token after it."""
    logits, _ = target(rows, torch.tensor(seq).expand(rows.shape[0], -1))
    return logits[:, -1]


@torch.no_grad()
def test_tree_verification_and_compaction_match_full_forward(trained):
    target, _ = trained
    tree = TREES["static"]
    rows = torch.tensor([1, 4])  # cond and the null class: two rows, as under CFG
    torch.manual_seed(3)
    prefix = torch.randint(0, 16, (5,)).tolist()
    T, Q = 1, 1 + len(prefix) - 1  # y = prefix[-1] sits at position Q
    tokens = torch.randint(0, 16, (tree.n,))
    paths = [tree.anc[i].nonzero().flatten() for i in range(tree.n)]
    best = next(i for i in range(tree.n) if tree.paths[i] == (0, 1, 1, 0))  # a path of scattered slots
    seq = prefix + tokens[paths[best]].tolist()
    # brute force first: uncached full forwards (the model must have no cache for these)
    want = [full_next(target, rows, prefix + tokens[path].tolist()) for path in [[]] + paths]
    want_next = full_next(target, rows, seq + [7])
    target.setup_cache(2, extra=tree.n)
    prefill(target, rows)
    for i, t in enumerate(prefix[:-1]):
        decode_one_token(target, torch.tensor([t, t]), T + i)
    im = Image(0, None, prefix, Q, 0, torch.zeros(2, 1, 1), None, ImageStats(n_tokens=16, target_forwards=1))
    im.draft = Draft(tokens, tree.depths, tree.parent, tree.block, tree.children)
    logits, _ = TreeRounds(target, None, tree, SamplingParams(), AcceptRule(), None, 1).verify([im], None)
    for i in range(tree.n + 1):
        torch.testing.assert_close(logits[:, i], want[i], atol=1e-4, rtol=1e-4)
    # accept a depth-4 path, compact it, continue: the cache is the one sequential decoding builds
    target.keep(Q + 1 + paths[best], Q + 1)
    nxt, _ = decode_one_token(target, torch.tensor([7, 7]), Q + 5)
    torch.testing.assert_close(nxt, want_next, atol=1e-4, rtol=1e-4)
    kept = [(layer.attention.kv_cache.k.clone(), layer.attention.kv_cache.v.clone()) for layer in target.layers]
    target.setup_cache(2, extra=tree.n)
    prefill(target, rows)
    for i, t in enumerate(seq + [7]):
        decode_one_token(target, torch.tensor([t, t]), T + i)
    for (k, v), layer in zip(kept, target.layers):
        end = Q + 6
        torch.testing.assert_close(k[:, :, :end], layer.attention.kv_cache.k[:, :, :end], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v[:, :, :end], layer.attention.kv_cache.v[:, :, :end], atol=1e-5, rtol=1e-5)
    target.clear_cache()


def grow_one(target, drafter, tree, params, x, h, prefix, generator):
    """The tree tree_rounds.TreeRounds grows for one image after `prefix`, its drafter catching up on the target's
    inputs and hidden states (x, h)."""
    im = Image(0, generator, prefix.tolist(), target.args.cls_token_num + len(prefix) - 1, 0, x[:, 1:], h[:, :-1],
               ImageStats(n_tokens=target.args.image_tokens, target_forwards=1))
    drafter.setup_cache(2, extra=tree.drafter_extra + SCRATCH)
    TreeRounds(target, drafter, tree, params, AcceptRule(), None, 1).draft([im])
    drafter.clear_cache()
    return im.draft


@torch.no_grad()
def test_drafter_tree_passes_match_uncached_drafter(trained):
    """Each drafted node's drafter distribution equals an uncached drafter pass along its path."""
    target, drafter = trained
    tree, params = TREES["static"], SamplingParams(cfg_scale=2.0)
    rows = torch.tensor([2, 4])
    prefix = torch.randint(0, 16, (4,), generator=torch.Generator().manual_seed(5))
    n_done = 4
    x, h, _ = target_states(target, rows, prefix.expand(2, -1))
    pred = drafter(x[:, 1:], h[:, :-1])[:, -1:]
    draft = grow_one(target, drafter, tree, params, x, h, prefix, torch.Generator().manual_seed(0))
    assert draft.drafter_passes == 4
    for i in [i for i in range(tree.n) if tree.children[i + 1]]:
        path = tree.anc[i].nonzero().flatten()
        emb, hid, p = x[:, 1:], h[:, :-1], pred
        for node in path:  # brute force, one node deeper at a time, feeding the drafter's own predictions
            emb = torch.cat([emb, drafter.embed_tokens(draft.tokens[node]).expand(2, 1, -1)], 1)
            hid = torch.cat([hid, p], 1)
            p = drafter(emb, hid)[:, -1:]
        want = row_probs(drafter.head(p), params, n_done + len(path))[0]
        torch.testing.assert_close(draft.q[tree.q_row[i + 1]], want, atol=1e-5, rtol=1e-4)
    # children are distinct draws without replacement from the parent's drafter distribution
    for cs in draft.children:
        toks = draft.tokens[cs].tolist()
        assert len(set(toks)) == len(toks)


# -- sampling: exact trees reproduce the target, relaxed trees stay within delta ------------------------------------
@pytest.mark.parametrize("kind, n", [
    ("static", 700),
    ("dynamic", 700),
    pytest.param("static", 3000, marks=pytest.mark.slow),
])
def test_exact_tree_sampling_reproduces_the_target_distribution(kind, n):
    V, N = 3, 4
    target = tiny_target(scale=4.0, vocab_size=V, image_tokens=N, num_classes=2, n_layer=1)
    drafter = Drafter.from_target(target).eval()
    torch.nn.init.normal_(drafter.fc.weight, std=0.3)  # a poor drafter: plenty of rejections too
    params = SamplingParams(cfg_scale=2.0, top_k=2)
    # the static shape offers a third root child, past the drafter's top-2 support: never a candidate
    tree = StaticTree([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]) if kind == "static" else \
        DynamicTree(total_tokens=6, depth=2, top_k=2)
    seqs, joint = exact_joint(target, 1, params, V, N)
    index = {tuple(s): i for i, s in enumerate(seqs.tolist())}
    counts = torch.zeros(len(seqs), dtype=torch.float64)
    accepted = rejected = 0
    for i in range(n):
        tokens, s = decode_one(target, drafter, torch.tensor([1]), params, AcceptRule(), tree, image_generator(11, i))
        counts[index[tuple(tokens.tolist())]] += 1
        accepted += s.accepted_total
        rejected += sum(a < d for a, d in zip(s.accepted_per_step, s.tree_depth))
    assert accepted > n / 6 and rejected > n / 6  # both paths ran often
    assert counts[joint == 0].sum() == 0  # nothing outside the top-k support
    assert chi_square_pvalue(joint, counts, n) > 1e-3


def emitted_siblings(p, cands, table, rule):
    """Exact distribution of the token emitted at a node whose deterministic children `cands` are tried in order."""
    E, mass, budget = torch.zeros_like(p), 1.0, sibling_budget(None, rule)
    for x in cands:
        a, c, m = accept_probability(p, None, torch.tensor(x), table, rule, budget)
        E[x] += mass * a
        mass = mass * (1 - a)
        p, _, budget = after_rejection(p, None, x, c.item(), int(m), table, rule, budget)
    return E + mass * p


@torch.no_grad()
def test_relaxed_dynamic_tree_keeps_the_per_step_tv_bound():
    """Token 1 is the first tree-verified token: its law given token 0 must be the bounded LANTERN emission from
    the root's top-2 candidates (chi-square on (t0, t1)), and that law is within delta of the target's."""
    V, N, n, delta = 4, 4, 1200, 0.25
    target = tiny_target(scale=3.0, vocab_size=V, image_tokens=N, num_classes=2, n_layer=1, seed=1)
    drafter = Drafter.from_target(target).eval()
    torch.nn.init.normal_(drafter.fc.weight, std=0.3)
    params = SamplingParams(cfg_scale=2.0)
    table = torch.tensor([[1, 2, 3], [0, 2, 3], [3, 1, 0], [2, 0, 1]])
    rule = AcceptRule("lantern", delta=delta, k=2)
    tree = DynamicTree(total_tokens=7, depth=1, top_k=2)  # keeps all 2 + 4 offered nodes
    rows = torch.tensor([1, 2])
    logits0, _ = target(rows, torch.zeros(2, 0, dtype=torch.long))
    p0 = row_probs(logits0[:, :1], params, 0)[0]
    expected, tvs = torch.zeros(V, V, dtype=torch.float64), []
    for t0 in range(V):
        x, h, logits = target_states(target, rows, torch.tensor([[t0], [t0]]))
        p1 = row_probs(logits[:, 1:], params, 1)[0].double()
        q1 = row_probs(drafter.head(drafter(x[:, 1:], h[:, :-1])), params, 1)[0]
        E = emitted_siblings(p1, q1.topk(2).indices.tolist(), table, rule)
        tvs.append(0.5 * (E - p1).abs().sum().item())
        expected[t0] = p0[t0].double() * E
    assert max(tvs) <= delta + 1e-9 and max(tvs) > 0.1  # bounded, and the relaxation really moved mass
    counts = torch.zeros(V, V, dtype=torch.float64)
    for i in range(n):
        tokens, _ = decode_one(target, drafter, torch.tensor([1]), params, rule, tree, image_generator(5, i), table)
        counts[tokens[0], tokens[1]] += 1
    assert counts[expected == 0].sum() == 0  # e.g. the aggregated neighbours of a rejected draft
    assert chi_square_pvalue(expected.flatten(), counts.flatten(), n) > 1e-3


# -- routing from a sweep method ----------------------------------------------------------------------------------
def test_build_decoder_routes_trees(tmp_path, trained):
    from lantern.engine.models.drafter import save_drafter
    from lantern.engine.methods import build_decoder
    from lantern.engine.rules.neighbours import NeighbourParams, build_table

    target, drafter = trained
    save_drafter(tmp_path / "d.pt", drafter)
    codebook = torch.randn(16, 4)
    torch.save({"model": {"quantize.embedding.weight": codebook}}, tmp_path / "vq.pt")
    torch.save(build_table(codebook, NeighbourParams(k=15)), tmp_path / "nb.pt")
    paths = dict(drafter_path=str(tmp_path / "d.pt"), neighbours_path=str(tmp_path / "nb.pt"),
                 vq_path=str(tmp_path / "vq.pt"), device=torch.device("cpu"))
    params = SamplingParams(cfg_scale=2.0)
    for method in ({"name": "lanternpp", "drafting": "static", "lam": 5.0, "k": 10},
                   {"name": "lantern", "drafting": "dynamic", "delta": 0.1, "k": 10, "top_k": 4},
                   {"name": "exact", "drafting": "static", "tree": "chain", "gamma": 3}):
        tokens, (stats,) = build_decoder(method, params, target, **paths)(torch.tensor([2]), [image_generator(0, 0)])
        assert tokens.shape == (1, 16) and len(stats.tree_depth) == len(stats.accepted_per_step) > 0
    with pytest.raises(UserError, match="skips rank"):
        build_decoder({"name": "exact", "drafting": "static", "tree": [[1]]}, params, target, **paths)
    with pytest.raises(UserError, match="drafting = 'zigzag' is not allowed"):
        build_decoder({"name": "exact", "drafting": "zigzag"}, params, target, **paths)


@torch.no_grad()
def test_dynamic_tree_is_eagle2_selection(trained):
    """Brute force EAGLE-2 with uncached drafter passes along each path: the same kept nodes (as token paths)."""
    target, drafter = trained
    tree, params = DynamicTree(total_tokens=12, depth=3, top_k=3), SamplingParams(cfg_scale=2.0, greedy=True)
    rows = torch.tensor([3, 4])
    prefix = torch.randint(0, 16, (5,), generator=torch.Generator().manual_seed(2))
    n_done = 5
    x, h, _ = target_states(target, rows, prefix.expand(2, -1))
    pred = drafter(x[:, 1:], h[:, :-1])[:, -1:]
    draft = grow_one(target, drafter, tree, params, x, h, prefix, torch.Generator())

    def logq(path):  # the drafter's log-distribution after the token path, by uncached passes
        emb, hid, p = x[:, 1:], h[:, :-1], pred
        for tok in path:
            emb = torch.cat([emb, drafter.embed_tokens(torch.tensor([tok])).expand(2, 1, -1)], 1)
            hid = torch.cat([hid, p], 1)
            p = drafter(emb, hid)[:, -1:]
        return row_probs(drafter.head(p), params, n_done + len(path))[0].log()

    offered, frontier = {}, [((), 0.0)]
    for _ in range(tree.depth + 1):
        level = []
        for path, score in frontier:
            s, t = logq(path).topk(tree.top_k)
            level += [(path + (tok,), score + v) for v, tok in zip(s.tolist(), t.tolist())]
        offered.update(level)
        frontier = sorted(level, key=lambda c: -c[1])[: tree.top_k]
    want = set(sorted(offered, key=lambda p: -offered[p])[: tree.total_tokens - 1])
    toks = draft.tokens.tolist()
    got = set()
    for i in range(len(toks)):
        path, j = [], i
        while j >= 0:
            path.append(toks[j])
            j = int(draft.parent[j])
        got.add(tuple(reversed(path)))
    assert got == want and draft.drafter_passes == tree.depth
    assert int(draft.depth.max()) == max(len(p) for p in want)


@pytest.mark.parametrize("name", ["naive_extend_57", "mc_sim_7b_63", "twin_chain_8"])
def test_fanout_is_the_most_children_at_each_depth(name):
    """StaticTree.fanout, which bounds a sampled walk's tries per depth (tree_rounds.walk), counted from the rank
    paths: a node at depth d has as many children as paths extend it by one rank."""
    from collections import Counter

    tree = static_tree(name)
    kids = Counter(tuple(p[:-1]) for p in tree.paths)
    by_depth = [max((kids[tuple(p)] for p in [()] + [tuple(q) for q in tree.paths] if len(p) == d), default=0)
                for d in range(tree.depth + 1)]
    assert tree.fanout == by_depth and tree.fanout[-1] == 0
