"""VVS skipped verifies under a layout with forced structural tokens (engine/decoding/skipping.py with forced.py and
forced_trees.py; docs/skipping.md, docs/chameleon-layout.md), on the tiny GPT with test_layout.py's 3 x 4 + eol toy
layout. VVS is not exact, so what is tested is what holds: a schedule that never fires is the plain layout round
token for token; a batch gives each image its own codes; the target's cache holds, before every forward, the authors'
sequence (eol tokens included) at every position it reads, also after a skipped round that commits codes across a
row end; and on a layout of codes only the rounds are VVS without a layout, token for token."""
import pytest
import torch

from lantern.engine import methods
from lantern.engine.decoding.sampling import SamplingParams
from lantern.engine.decoding.skipping import Schedule
from lantern.engine.decoding.speculative import decode
from lantern.engine.models.drafter import Drafter
from lantern.engine.models.layout import Layout, codes_to_ids
from lantern.engine.rules.acceptance import AcceptRule
from tiny import assert_same_decodes, float64_pair, gens, one_thread, tiny_target  # noqa: F401 (fixture)

TOY = Layout("toy", 3, 4, eol=15, code_offset=0, codebook=15, vocab=16)
TABLE = torch.stack([torch.roll(torch.arange(15), -i)[1:] for i in range(15)])  # codes 0 .. 14
KINDS = {"chain": {"drafting": "chain", "gamma": 3}, "long chain": {"drafting": "chain", "gamma": 6},
         "static": {"drafting": "static", "tree": "mc_sim_7b_63"},
         "dynamic": {"drafting": "dynamic", "total_tokens": 12, "depth": 3, "top_k": 3}}
RULES = {"exact": AcceptRule(), "lantern": AcceptRule("lantern", delta=0.3, k=5)}


def shape(kind: str, every: int = 0):
    """The drafting kind from the registry, with a VVS schedule (skip every `every`-th round) when `every`."""
    skip = {"skip": "every", "skip_every": every} if every else {}
    return methods.drafting(methods.normalize({"name": "exact", **KINDS[kind], **skip}))


@pytest.fixture(scope="module")
def toy_pair():
    """test_layout.py's pair: the tiny GPT in float64, an untrained drafter with random weights."""
    return float64_pair()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("greedy", [True, False])
def test_a_schedule_that_never_fires_is_the_layout_round(one_thread, toy_pair, kind, greedy):
    """skip_every beyond any image's rounds: codes, rounds and stats of the plain layout rounds (chain_rounds',
    tree_rounds'), under the exact and a relaxed rule."""
    target, drafter = toy_pair
    params, cond = SamplingParams(cfg_scale=2.0, greedy=greedy, top_k=10), torch.arange(4) % 4
    for rule in RULES.values():
        want, want_stats = decode(target, drafter, cond, params, rule, shape(kind), gens(4, 2), TABLE, layout=TOY)
        got, stats = decode(target, drafter, cond, params, rule, shape(kind, 1000), gens(4, 2), TABLE, layout=TOY)
        assert_same_decodes(got, stats, want, want_stats, 12)
        assert all(s.skipped_rounds == 0 for s in stats)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rule", RULES)
def test_skipping_with_a_layout_batch_equals_one_by_one(one_thread, toy_pair, kind, rule):
    """Each image of a batch gets the codes, rounds and stats it gets alone (float64), skipped rounds included; the
    stats count codes: every other round skipped, the target forwards are the prefill and the verified rounds."""
    target, drafter = toy_pair
    params, cond = SamplingParams(cfg_scale=2.0, top_k=10), torch.arange(5) % 4
    got, stats = decode(target, drafter, cond, params, RULES[rule], shape(kind, 2), gens(5, 3), TABLE, layout=TOY)
    alone = [decode(target, drafter, cond[i : i + 1], params, RULES[rule], shape(kind, 2), gens(5, 3)[i : i + 1],
                    TABLE, layout=TOY) for i in range(5)]
    assert_same_decodes(got, stats, torch.cat([t for t, _ in alone]), [s for _, (s,) in alone], 12)
    assert [s.skipped_rounds for s in stats] == [s.skipped_rounds for _, (s,) in alone]
    assert got.shape == (5, 12) and got.max() < 15  # codes only: no forced id among them
    for s in stats:
        rounds = len(s.accepted_per_step)
        assert s.skipped_rounds == rounds // 2 > 0
        assert s.target_forwards == 1 + rounds - rounds // 2 and s.tau == 12 / s.target_forwards
        # a skipped round commits g codes and records g - 1, a verified one a + 1 with its bonus code (none past the
        # grid when its drafts complete it): the first code came from the prefill
        assert s.accepted_total + rounds in (11, 12)


def test_a_similarity_schedule_runs_under_a_layout(one_thread, toy_pair):
    """skip: similarity compares a tree's paths by their codes' embeddings (a codebook of the layout's 15 codes):
    skipped rounds happen, and a batch equals one image at a time."""
    target, drafter = toy_pair
    params, cond = SamplingParams(cfg_scale=2.0, top_k=10), torch.arange(4) % 4

    def similar():
        drafting = shape("dynamic")
        object.__setattr__(drafting, "skip_similarity", -1.0)  # any agreement: skip wherever the schedule allows
        object.__setattr__(drafting, "skip_codebook", torch.randn(15, 4, dtype=torch.float64,
                                                                  generator=torch.Generator().manual_seed(0)))
        return drafting

    got, stats = decode(target, drafter, cond, params, RULES["exact"], similar(), gens(4, 6), layout=TOY)
    alone = [decode(target, drafter, cond[i : i + 1], params, RULES["exact"], similar(), gens(4, 6)[i : i + 1],
                    layout=TOY) for i in range(4)]
    assert_same_decodes(got, stats, torch.cat([t for t, _ in alone]), [s for _, (s,) in alone], 12)
    assert all(s.skipped_rounds > 0 for s in stats) and got.max() < 15


def recorder(target, monkeypatch):
    """Wraps the target's forward_rows and keep_rows: a list of every cached forward's (ids, pos, slots, visible,
    rows) and cache move, in order (the ids from the embed_tokens call before each forward)."""
    calls, last = [], {}
    embed, forward, keep = target.embed_tokens, target.forward_rows, target.keep_rows

    def embed_tokens(tokens):
        last["ids"] = tokens
        return embed(tokens)

    def forward_rows(x, pos, slots, visible, rows=None):
        calls.append(("forward", last["ids"].clone(), pos.clone(), slots.clone(), visible.clone(), rows))
        return forward(x, pos, slots, visible, rows)

    def keep_rows(rows, src, dst):
        calls.append(("keep", rows.clone(), src.clone(), dst.clone()))
        return keep(rows, src, dst)

    monkeypatch.setattr(target, "embed_tokens", embed_tokens)
    monkeypatch.setattr(target, "forward_rows", forward_rows)
    monkeypatch.setattr(target, "keep_rows", keep_rows)
    return calls


def check_cache(calls, truth: torch.Tensor, T: int) -> int:
    """Replays the recorded forwards and moves on a model of the target's cache (slot -> id per cache row): before
    each forward, every real query sees every slot from T up to its row's first fed position, and each holds the
    authors' id there (truth [rows, steps]); the ids a forward feeds at positions already checked later on are the
    committed ones. Returns the number of row-forwards checked."""
    cache, checked = {}, 0
    for call in calls:
        if call[0] == "keep":
            _, rows, src, dst = call
            moved = [(r, d, cache.get(r, {}).get(s)) for r, s, d in zip(rows.tolist(), src.tolist(), dst.tolist())]
            for r, d, v in moved:
                cache.setdefault(r, {})[d] = v
            continue
        _, ids, pos, slots, visible, rows = call
        L = visible.shape[-1]  # the scratch slot, where padding writes, is the last
        rows = list(range(ids.shape[0])) if rows is None else rows.tolist()
        for b, row in enumerate(rows):
            real = slots[b] != L - 1
            if not real.any():
                continue
            first = int(pos[b][real].min())
            mine = cache.setdefault(row, {})
            for q in range(T, first):
                assert mine.get(q) == int(truth[row, q - T]), f"cache row {row}, position {q}"
            assert bool(visible[b][real][:, T:first].all())
            checked += 1
            for s, i in zip(slots[b][real].tolist(), ids[b][real].tolist()):
                mine[s] = i
    return checked


LONG = Layout("toy5", 5, 4, eol=15, code_offset=0, codebook=15, vocab=16)  # 25 steps: more rounds per image


@pytest.fixture(scope="module")
def long_pair():
    """toy_pair's models with room for LONG's 25 steps."""
    torch.manual_seed(3)
    target = tiny_target(scale=3.0, image_tokens=25).double()
    drafter = Drafter.from_target(target).eval().double()
    torch.nn.init.normal_(drafter.fc.weight, std=0.3)
    return target, drafter


@pytest.mark.parametrize("kind", KINDS)
def test_the_target_reads_the_authors_sequence_after_skipped_rounds(one_thread, long_pair, kind, monkeypatch):
    """Every target forward of sampled VVS rounds (every 2nd round skipped) reads, at every position before the ones
    it feeds, the authors' sequence of the image's final codes, eol tokens at their positions: a skipped round's
    codes and the eols between them are fed before any later code is verified. Some skipped round commits codes
    across a row end (its unverified inputs hold an eol)."""
    target, drafter = long_pair
    params, cond, B = SamplingParams(cfg_scale=2.0, top_k=10), torch.arange(4) % 4, 4
    waited, before = [], Schedule.before

    def record(self, indices, smax):
        out = before(self, indices, smax)
        waited.append(out.clone())
        return out

    monkeypatch.setattr(Schedule, "before", record)
    calls = recorder(target, monkeypatch)
    codes, stats = decode(target, drafter, cond, params, RULES["lantern"], shape(kind, 2), gens(B, 4), TABLE,
                          layout=LONG)
    monkeypatch.undo()
    assert codes.max() < 15 and all(s.skipped_rounds > 0 for s in stats)
    truth = codes_to_ids(LONG, codes).repeat(2, 1)  # cache rows b and B + b (CFG) hold image b's sequence
    checked = check_cache(calls, truth, target.args.cls_token_num)
    assert checked >= sum(s.target_forwards - 1 for s in stats) * 2
    assert sum(int((w == LONG.eol).sum()) for w in waited) >= 2


def catch_ups(drafter, monkeypatch):
    """Wraps the drafter's catch-up forwards (a round's first drafter forward, chains' and trees'): a list of their
    (ids, pos, rows), each input's id read back from its embedding (-1: none, the condition's inputs and padding)."""
    calls, catching, draft, forward = [], [], Schedule.draft, drafter.forward_rows
    table = drafter.embed_tokens(torch.arange(drafter.tok_embeddings.num_embeddings))

    def flagged(self, images):
        catching.append(True)
        return draft(self, images)

    def forward_rows(emb, hidden, pos, slots, visible, rows=None):
        if catching:
            catching.clear()
            match = (emb[..., None, :] == table).all(-1)
            calls.append((torch.where(match.any(-1), match.int().argmax(-1), -1), pos.clone(), rows))
        return forward(emb, hidden, pos, slots, visible, rows)

    monkeypatch.setattr(Schedule, "draft", flagged)
    monkeypatch.setattr(drafter, "forward_rows", forward_rows)
    return calls


@pytest.mark.parametrize("kind", KINDS)
def test_the_drafter_catches_up_on_the_authors_sequence(one_thread, long_pair, kind, monkeypatch):
    """The drafter's input at position p is the token at p + 1 (EAGLE's pairing): every catch-up of sampled VVS rounds
    (every 2nd skipped) feeds, and finds below its first input, the authors' sequence of the final codes shifted by
    one, eol tokens included, also after a skipped round that committed codes across a row end."""
    target, drafter = long_pair
    params, cond, T = SamplingParams(cfg_scale=2.0, top_k=10), torch.arange(4) % 4, target.args.cls_token_num
    calls = catch_ups(drafter, monkeypatch)
    codes, stats = decode(target, drafter, cond, params, RULES["lantern"], shape(kind, 2), gens(4, 4), TABLE,
                          layout=LONG)
    monkeypatch.undo()
    assert all(s.skipped_rounds > 0 for s in stats)
    truth = codes_to_ids(LONG, codes).repeat(2, 1)
    cache, checked = {}, 0
    for ids, pos, rows in calls:
        rows = list(range(ids.shape[0])) if rows is None else rows.tolist()
        for b, row in enumerate(rows):
            real = ids[b] >= 0
            first, mine = int(pos[b][real].min()), cache.setdefault(row, {})
            for q in range(T, first):
                assert mine.get(q) == int(truth[row, q + 1 - T]), f"drafter row {row}, position {q}"
            for p, i in zip(pos[b][real].tolist(), ids[b][real].tolist()):  # its own inputs: committed tokens
                assert i == int(truth[row, p + 1 - T]), f"drafter row {row}, input at position {p}"
                mine[p] = i
                checked += i == LONG.eol
    assert checked >= 8  # eol inputs: each image's two rows at least once, on average


@pytest.mark.parametrize("kind", KINDS)
def test_the_check_sees_a_missing_eol(one_thread, long_pair, kind, monkeypatch):
    """check_cache fails when a skipped round's eol is not fed: the unverified inputs with each eol replaced by a
    code id (the skipped round without the layout's splice)."""
    target, drafter = long_pair
    params, cond = SamplingParams(cfg_scale=2.0, top_k=10), torch.arange(4) % 4
    before = Schedule.before
    monkeypatch.setattr(Schedule, "before", lambda self, indices, smax: torch.where(
        before(self, indices, smax) == LONG.eol, 0, before(self, indices, smax)))
    calls = recorder(target, monkeypatch)
    codes, _ = decode(target, drafter, cond, params, RULES["lantern"], shape(kind, 2), gens(4, 4), TABLE,
                      layout=LONG)
    monkeypatch.undo()
    with pytest.raises(AssertionError, match="cache row"):
        check_cache(calls, codes_to_ids(LONG, codes).repeat(2, 1), target.args.cls_token_num)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("greedy", [True, False])
def test_a_layout_of_codes_only_skips_as_without_a_layout(one_thread, toy_pair, kind, greedy):
    """A layout with no forced token whose codes are the target's ids (4 x 4 codes, ids 0 .. 15): VVS rounds under
    it give the codes, rounds and stats of VVS rounds without a layout (every 2nd and every 3rd round skipped)."""
    target, drafter = toy_pair
    layout = Layout("codes", 4, 4, code_offset=0, codebook=16, vocab=16)
    table = torch.stack([torch.roll(torch.arange(16), -i)[1:] for i in range(16)])
    params, cond = SamplingParams(cfg_scale=2.0, greedy=greedy, top_k=10), torch.arange(4) % 4
    for every in (2, 3):
        want, want_stats = decode(target, drafter, cond, params, RULES["lantern"], shape(kind, every), gens(4, 5),
                                  table)
        got, stats = decode(target, drafter, cond, params, RULES["lantern"], shape(kind, every), gens(4, 5), table,
                            layout=layout)
        assert_same_decodes(got, stats, want, want_stats, 16)
        assert [s.skipped_rounds for s in stats] == [s.skipped_rounds for s in want_stats]
        assert all(s.skipped_rounds > 0 for s in stats)
