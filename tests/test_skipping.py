"""VVS verification skipping (engine/decoding/skipping.py) on tiny targets, chains and trees: a schedule that never
fires is the decoder token for token, every i-th round skips and no other, the target's cache after a skipped round and the next verify
is a fresh prefill's, batches give each image its own tokens, and the joint distribution's distance from the
target, measured on a tiny vocabulary (not exact: the distance is stated in docs/decoders.md)."""

import numpy as np
import pytest
import torch

from lantern.engine import methods
from lantern.engine.decoding.chain import Chain
from lantern.engine.decoding.sampling import SamplingParams, image_generator
from lantern.engine.decoding.kinds import rounds_for
from lantern.engine.decoding.skipping import SkippingChainRounds
from lantern.engine.decoding.speculative import decode
from lantern.engine.decoding.stats import StepTimer
from lantern.engine.models.drafter import Drafter, DrafterOptions
from lantern.engine.rules.acceptance import AcceptRule
from lantern.errors import UserError
from lantern.pipeline.tables import accepted_mask
from tiny import (assert_same_decodes, chi_square_pvalue, decode_one, exact_joint, gens, one_by_one,  # noqa: F401
                  one_thread, ragged_t2i, tiny_target)


def poor_pair(**kw):
    """A float64 tiny target and a drafter with random weights: drafts often wrong, so both paths run."""
    target = tiny_target(**kw).double()
    drafter = Drafter.from_target(target).eval().double()
    torch.nn.init.normal_(drafter.fc.weight, std=0.3)
    return target, drafter


KINDS = {"chain": {"drafting": "chain", "gamma": 3}, "static": {"drafting": "static", "tree": "twin_chain_8"},
         "dynamic": {"drafting": "dynamic", "total_tokens": 8, "depth": 2, "top_k": 3}}


def shape(kind: str, every: int = 0):
    """The drafting kind's shape from the registry, with a VVS schedule when `every`."""
    skip = {"skip": "every", "skip_every": every} if every else {}
    return methods.drafting(methods.normalize({"name": "exact", **KINDS[kind], **skip}))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("greedy", [False, True])
def test_a_schedule_that_never_fires_is_the_decoder_token_for_token(one_thread, kind, greedy):
    target, drafter = poor_pair()
    params, cond = SamplingParams(cfg_scale=2.0, greedy=greedy), torch.arange(3)
    table = torch.stack([torch.cat([torch.arange(i), torch.arange(i + 1, 16)]) for i in range(16)])
    for rule in (AcceptRule(), AcceptRule("lantern", delta=0.2, k=3)):
        want, want_stats = decode(target, drafter, cond, params, rule, shape(kind), gens(3), table)
        got, stats = decode(target, drafter, cond, params, rule, shape(kind, 1000), gens(3), table)
        assert torch.equal(got, want)
        for s, w in zip(stats, want_stats):
            assert (s.accepted_per_step, s.target_forwards, s.skipped_rounds) == (w.accepted_per_step,
                                                                                  w.target_forwards, 0)


def run_rounds(target, drafter, cond, params, drafting, generators, seen=None):
    """speculative.decode's loop over the VVS rounds (kinds.rounds_for), recording each round's skip flags per
    image and, after a verify that re-ran unverified positions, for each image in it: (its index, smax, its
    unverified count, its tokens so far, the drafted nodes, their parents (-1: y), its [cond, uncond] logits)."""
    rounds = rounds_for(drafting, target, drafter, params, AcceptRule(), None, len(generators))
    images = rounds.prefill(cond, generators, StepTimer("cpu"), None, False)
    flags = {im.index: [] for im in images}
    while active := [im for im in images if im.n < target.args.image_tokens]:
        rounds.draft(active)
        for im, skip in zip(active, rounds.skip):
            flags[im.index].append(skip)
        logits, hidden = rounds.verify(active, None)
        if seen is not None and logits is not None and rounds.smax > 0:
            n_v = len(rounds.verifying)
            for k, i in enumerate(rounds.verifying):
                im = active[i]
                if isinstance(rounds, SkippingChainRounds):
                    done = int(rounds.done[i])
                    tokens, nodes = rounds.buf[im.index, :done].tolist(), rounds.X[i, : rounds.g[i]].tolist()
                    parents = list(range(-1, len(nodes) - 1))
                else:
                    tokens, nodes, parents = list(im.tokens), im.draft.tokens.tolist(), im.draft.parent.tolist()
                seen.append((im.index, rounds.smax, rounds.unverified[im.index], tokens, nodes, parents,
                             logits[k::n_v].clone()))
        rounds.commit(active, logits, hidden)
    return rounds.finish(images, StepTimer("cpu")), flags


@pytest.mark.parametrize("kind, every", [("chain", 2), ("chain", 3), ("static", 2), ("dynamic", 3)])
def test_every_i_skips_exactly_every_ith_round(one_thread, kind, every):
    target, drafter = poor_pair()
    (tokens, stats), flags = run_rounds(target, drafter, torch.arange(3), SamplingParams(cfg_scale=2.0),
                                        shape(kind, every), gens(3))
    for b, s in enumerate(stats):
        rounds = len(s.accepted_per_step)
        assert flags[b] == [(r + 1) % every == 0 for r in range(rounds)]
        assert s.skipped_rounds == rounds // every > 0
        assert s.target_forwards == 1 + rounds - rounds // every  # the prefill, then the verified rounds
        assert s.tau == 16 / s.target_forwards
        # a skipped round records g - 1: its last committed draft stands where a verified round's bonus token does,
        # so the tables' per-position reading of the stats row holds (it raises on a row that emits another count)
        assert sum(a + 1 for a in s.accepted_per_step) == 15
        accepted_mask(np.array(s.accepted_per_step), 16)


@pytest.mark.parametrize("kind", KINDS)
def test_the_cache_after_a_skip_and_a_verify_is_a_fresh_prefills(one_thread, kind):
    """The verify after a skipped round re-runs the unverified positions: its logits at them, at y and at every
    drafted node equal those of one uncached forward over the image's tokens and the node's path (float64)."""
    target, drafter = poor_pair()
    params, seen = SamplingParams(cfg_scale=2.0), []
    run_rounds(target, drafter, torch.arange(2), params, shape(kind, 2), gens(2), seen)
    label = lambda b: torch.tensor([b, target.args.num_classes])  # noqa: E731 - the cond and uncond rows

    for b, smax, s, tokens, nodes, parents, logits in seen:  # logits: this image's [cond, uncond] rows
        n = len(tokens)
        fresh, _ = target(label(b), torch.tensor(tokens)[None].expand(2, -1))
        for col in range(smax - s, smax + 1):  # the unverified inputs, then y: token n - 1 - smax + col
            torch.testing.assert_close(logits[:, col], fresh[:, n - smax + col], rtol=0, atol=1e-10)
        for i in range(len(nodes)):
            path = [i]
            while parents[path[-1]] >= 0:
                path.append(parents[path[-1]])
            seq = torch.tensor(tokens + [nodes[j] for j in reversed(path)])
            fresh, _ = target(label(b), seq[None].expand(2, -1))
            torch.testing.assert_close(logits[:, smax + 1 + i], fresh[:, -1], rtol=0, atol=1e-10)
    assert sum(s > 0 for _, _, s, *_ in seen) >= 2


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("greedy", [False, True])
def test_a_batch_gives_each_image_its_own_tokens_under_skipping(one_thread, kind, greedy):
    target, drafter, cond, mask = ragged_t2i(DrafterOptions())
    params = SamplingParams(cfg_scale=2.0, greedy=greedy)
    got, stats = decode(target, drafter, cond, params, AcceptRule(), shape(kind, 2), gens(4), None, mask)
    want, want_stats = one_by_one(target, drafter, cond, params, AcceptRule(), shape(kind, 2), gens(4), None, mask)
    assert_same_decodes(got, stats, want, want_stats, target.args.image_tokens)
    assert [s.skipped_rounds for s in stats] == [s.skipped_rounds for s in want_stats]


def joint_counts(target, drafter, params, chain, seqs, n):
    index = {tuple(s): i for i, s in enumerate(seqs.tolist())}
    counts = torch.zeros(len(seqs), dtype=torch.float64)
    for i in range(n):
        tokens, _ = decode_one(target, drafter, torch.tensor([1]), params, AcceptRule(), chain, image_generator(5, i))
        counts[index[tuple(tokens.tolist())]] += 1
    return counts


def test_skipping_moves_the_joint_distribution_away_from_the_target(one_thread):
    """V = 3, N = 4 (81 sequences), a poor drafter: exact SD's sample passes the chi-square against the exact joint
    and its TV is the sampling noise; VVS every 2nd round fails it, and its joint TV lies well above that noise.
    Measured (n = 1000 each): exact 0.090 (the noise), VVS every 2 0.413 (docs/decoders.md)."""
    V, N, n = 3, 4, 1000
    target, drafter = poor_pair(scale=4.0, vocab_size=V, image_tokens=N, num_classes=2)
    params = SamplingParams(cfg_scale=2.0)
    seqs, joint = exact_joint(target, 1, params, V, N)
    exact = joint_counts(target, drafter, params, Chain(2), seqs, n)
    vvs = joint_counts(target, drafter, params, Chain(2, 2), seqs, n)
    tv_exact = 0.5 * (exact / n - joint).abs().sum().item()
    tv_vvs = 0.5 * (vvs / n - joint).abs().sum().item()
    print(f"joint TV from the target, n = {n}: exact chain {tv_exact:.3f}, VVS every 2 {tv_vvs:.3f}")
    assert chi_square_pvalue(joint, exact, n) > 1e-3
    assert chi_square_pvalue(joint, vvs, n) < 1e-6
    assert tv_vvs > 2 * tv_exact


def test_registry_names_and_validates_the_schedule():
    spec = methods.normalize({"name": "lantern", "drafting": "chain", "delta": 0.2, "k": 10, "skip": "every",
                              "skip_every": 5})
    assert methods.point_name(spec) == "lantern-chain-g4-every-i5-d0.2-k10"
    assert methods.drafting(spec) == Chain(4, 5)
    plain = methods.normalize({"name": "lantern", "drafting": "chain", "delta": 0.2, "k": 10})
    assert methods.point_name(plain) == "lantern-chain-g4-d0.2-k10" and methods.drafting(plain) == Chain(4, 0)


@pytest.mark.parametrize("entry, needle", [
    ({"name": "exact", "skip": "always"}, "skip = 'always' is not allowed; use one of none, every, similarity"),
    ({"name": "exact", "skip": "similarity"}, "skip = 'similarity' needs a draft tree"),
    ({"name": "exact", "drafting": "static", "skip": "similarity", "similarity": 1.5}, "similarity = 1.5 exceeds 1"),
    ({"name": "exact", "drafting": "static", "skip": "every", "similarity": 0.5}, "similarity does not apply"),
    ({"name": "exact", "skip": "every", "skip_every": 1}, "skip_every = 1 must be >= 2"),
    ({"name": "exact", "skip_every": 3}, "skip_every does not apply"),
    ({"name": "exact", "drafting": "jacobi", "skip": "every"}, "skip does not apply"),
])
def test_bad_schedules_one_line(entry, needle):
    with pytest.raises(UserError) as e:
        methods.normalize(entry, "sweep.methods[0]")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_compile_true_runs_the_eager_skipping_rounds(one_thread, monkeypatch):
    from lantern.engine.decoding import compiled

    asked = []
    monkeypatch.setattr(compiled, "compiled_step", lambda fn, device: asked.append(fn.__name__) or fn)
    target, drafter = poor_pair()
    params, cond = SamplingParams(cfg_scale=2.0), torch.arange(3)
    want, _ = decode(target, drafter, cond, params, AcceptRule(), shape("chain", 2), gens(3))
    got, stats = decode(target, drafter, cond, params, AcceptRule(), shape("chain", 2), gens(3), compile=True)
    assert torch.equal(got, want) and asked == [] and all(s.skipped_rounds for s in stats)


def test_path_similarity_by_hand():
    """Leaves in node order, every second kept; per-depth cosine of the codes' embeddings, weights 0.9^l over the
    longest path, 0 where a path is shorter; the mean over pairs."""
    from lantern.engine.decoding.skipping import path_similarity

    codebook = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]])
    # nodes 0, 1 children of y; 2, 3 of node 0; 4 of node 1; 5 of node 4. Leaves 2, 3, 5 -> kept 2, 5
    parent = [-1, -1, 0, 0, 1, 4]
    tokens = torch.tensor([0, 1, 2, 3, 3, 2])
    # path of 2: nodes 0, 2 = codes 0, 2; path of 5: nodes 1, 4, 5 = codes 1, 3, 2
    cos = [0.0, (1 * 2 + 1 * 0) / (2 ** 0.5 * 2), 0.0]  # depth 1: e0.e1; depth 2: e2.e3; depth 3: path 2 ended
    w = [0.9 ** l for l in range(3)]
    want = sum(a * b for a, b in zip(w, cos)) / sum(w)
    assert path_similarity(parent, tokens, codebook) == pytest.approx(want)
    assert path_similarity([-1, 0], torch.tensor([0, 1]), codebook) == float("-inf")  # one leaf: never skip


def test_similarity_skips_only_after_warm_up_and_never_twice_in_a_row(one_thread):
    target, drafter = poor_pair()
    drafting = shape("dynamic")
    object.__setattr__(drafting, "skip_similarity", -1.0)  # any agreement: skip wherever the schedule allows
    object.__setattr__(drafting, "skip_codebook", torch.randn(16, 4, dtype=torch.float64))
    (tokens, stats), flags = run_rounds(target, drafter, torch.arange(3), SamplingParams(cfg_scale=2.0), drafting,
                                        gens(3))
    for b, s in enumerate(stats):
        f = flags[b]
        assert s.skipped_rounds == sum(f) > 0 and not any(a and b for a, b in zip(f, f[1:]))
        n = 1  # tokens before each round: no skip while an image has 6 or fewer
        for skip, a in zip(f, s.accepted_per_step):
            assert not skip or n > 6
            n += a + 1
    never = shape("dynamic")
    object.__setattr__(never, "skip_similarity", 2.0)  # beyond any cosine: the plain tree token for token
    object.__setattr__(never, "skip_codebook", torch.randn(16, 4, dtype=torch.float64))
    params = SamplingParams(cfg_scale=2.0)
    want, _ = decode(target, drafter, torch.arange(3), params, AcceptRule(), shape("dynamic"), gens(3))
    got, _ = decode(target, drafter, torch.arange(3), params, AcceptRule(), never, gens(3))
    assert torch.equal(got, want)


def test_the_registry_names_a_similarity_schedule():
    spec = methods.normalize({"name": "lantern", "drafting": "dynamic", "delta": 0.2, "k": 10, "skip": "similarity"})
    assert methods.point_name(spec) == "lantern-dynamic-similarity-sim0.7-d0.2-k10"
    assert methods.drafting(spec).skip_similarity == 0.7


def test_lantern_sample_decoder_reads_the_codebook_for_similarity(one_thread, tmp_path):
    from tiny import save_world

    target = tiny_target()
    save_world(tmp_path, target)
    spec = {"name": "exact", "drafting": "dynamic", "total_tokens": 8, "depth": 2, "top_k": 3, "skip": "similarity",
            "similarity": -1.0}
    with pytest.raises(UserError, match="needs the VQ checkpoint"):
        methods.build_decoder(spec, SamplingParams(cfg_scale=2.0), target, str(tmp_path / "drafter.pt"), None, None,
                              "cpu")
    run = methods.build_decoder(spec, SamplingParams(cfg_scale=2.0), target, str(tmp_path / "drafter.pt"), None,
                                str(tmp_path / "vq.pt"), "cpu")
    tokens, stats = run(torch.arange(2), gens(2))
    assert tokens.shape == (2, 16) and all(s.skipped_rounds > 0 for s in stats)
