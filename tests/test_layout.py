"""engine/models/layout.py: the Chameleon families' generated sequences against the authors' rules, written out here
from their logits processors and decoders (jadohu/LANTERN models/ea_model_{anole,lumina_mgpt}.py)."""
import pytest
import torch

from lantern.engine.models.layout import (
    ANOLE, LAYOUTS, LUMINA_MGPT_768, Layout, code_steps, codes_to_ids, forced_after, forced_tokens, ids_to_codes,
    image_logits, image_mask, lumina_layout, tau_authors, tau_codes,
)
from lantern.errors import UserError


def authors_lumina_forced(n: int, h: int = 48, w: int = 48):
    """MultiModalLogitsProcessor for the n-th token after [8197, size, size]: 8803 when (n + 1) % (w + 1) == 0,
    8196 when n + 1 == (w + 1) * h + 1 (applied last, so it wins), else None (image ids only)."""
    token = 8803 if (n + 1) % (w + 1) == 0 else None
    if n + 1 == (w + 1) * h + 1:
        token = 8196
    return token


def test_lumina_forcing_is_the_authors_rule():
    forced = forced_tokens(LUMINA_MGPT_768)
    assert LUMINA_MGPT_768.steps == 2353 == forced.numel() and LUMINA_MGPT_768.codes == 2304
    assert forced.tolist() == [-1 if authors_lumina_forced(n) is None else authors_lumina_forced(n)
                               for n in range(2353)]
    eol = (forced == 8803).nonzero().flatten()
    assert eol.tolist() == list(range(48, 2352, 49)) and len(eol) == 48  # exactly every 49th slot
    assert (forced == 8196).nonzero().flatten().tolist() == [2352]  # after the 2352 grid slots
    assert LUMINA_MGPT_768.forced_steps == 49 and LUMINA_MGPT_768.prefix == (8197, 8828, 8828)
    assert len(LUMINA_MGPT_768.prefix) + LUMINA_MGPT_768.steps == 2356  # boi .. eoi
    # Anole: 32 x 32 codes, nothing forced
    assert ANOLE.steps == ANOLE.codes == 1024 and bool((forced_tokens(ANOLE) == -1).all())


def test_lumina_sizes_and_validation():
    assert lumina_layout(768) == LUMINA_MGPT_768 and LAYOUTS["lumina-mgpt-768"] is LUMINA_MGPT_768
    assert lumina_layout(512).prefix == (8197, 8820, 8820) and lumina_layout(1024).prefix[1] == 8836
    assert (lumina_layout(512).rows, lumina_layout(1024).cols) == (32, 64)
    for bad in (700, 0, True, "768"):
        with pytest.raises(UserError, match="multiple of 32"):
            lumina_layout(bad)
    with pytest.raises(UserError, match="image code's id"):
        Layout("x", 2, 2, eol=100)  # inside 4 .. 8195
    with pytest.raises(UserError, match="outside the vocabulary"):
        Layout("x", 2, 2, eoi=70000)
    with pytest.raises(UserError, match="do not fit"):
        Layout("x", 2, 2, code_offset=60000)
    with pytest.raises(UserError, match="rows=0"):
        Layout("x", 0, 2)


@pytest.mark.parametrize("layout", [ANOLE, LUMINA_MGPT_768, lumina_layout(512)], ids=lambda lay: lay.name)
def test_ids_and_codes_round_trip(layout):
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 8192, (3, layout.rows, layout.cols), generator=g)
    ids = codes_to_ids(layout, codes)
    assert ids.shape == (3, layout.steps)
    assert torch.equal(ids_to_codes(layout, ids), codes)
    assert torch.equal(codes_to_ids(layout, codes.flatten(1)), ids)  # a flat code sequence as well
    forced = forced_tokens(layout)
    assert torch.equal(ids[:, forced >= 0], forced[forced >= 0].expand(3, -1))
    # code i sits at step code_steps(i), as id code + 4
    i = torch.arange(layout.codes)
    assert torch.equal(ids[:, code_steps(layout, i)], codes.flatten(1) + 4)


def test_lumina_ids_to_codes_is_the_authors_decode():
    """Their decode: strip eoi, assert 48 x 49 tokens, drop the newline column, ids - 4 (bpe2img; id = code + 4)."""
    g = torch.Generator().manual_seed(1)
    ids = codes_to_ids(LUMINA_MGPT_768, torch.randint(0, 8192, (48, 48), generator=g))
    assert ids[-1] == 8196
    grid = ids[:-1].view(48, 49)
    assert bool((grid[:, -1] == 8803).all())
    assert torch.equal(ids_to_codes(LUMINA_MGPT_768, ids), grid[:, :48] - 4)


def test_ids_to_codes_names_the_broken_step():
    ids = codes_to_ids(LUMINA_MGPT_768, torch.zeros(48, 48, dtype=torch.long))
    broken = ids.clone()
    broken[97] = 5  # an eol slot holding a code
    with pytest.raises(ValueError, match="step 97 holds an id that is not token 8803"):
        ids_to_codes(LUMINA_MGPT_768, broken)
    broken = ids.clone()
    broken[3] = 8803  # a code slot holding a structural token
    with pytest.raises(ValueError, match="step 3 holds an id that is not an image code's id"):
        ids_to_codes(LUMINA_MGPT_768, broken)
    with pytest.raises(ValueError, match="2352 generated ids, expected 2353"):
        ids_to_codes(LUMINA_MGPT_768, ids[:-1])
    with pytest.raises(ValueError, match="0 .. 8191"):
        codes_to_ids(ANOLE, torch.full((32, 32), 8192))


@pytest.mark.parametrize("layout", [ANOLE, LUMINA_MGPT_768, Layout("toy", 3, 4, eol=15, code_offset=0, codebook=15,
                                                                     vocab=16)], ids=lambda lay: lay.name)
def test_forced_after_each_code_is_what_the_sequence_holds(layout):
    """Splicing each code's followers after it rebuilds the generated sequence: the primitive a round uses to feed
    the forced tokens to the target in the same forward (docs/chameleon-layout.md)."""
    codes = torch.arange(layout.codes) % layout.codebook
    after = forced_after(layout, torch.arange(layout.codes))
    spliced = [t for c, f in zip(codes.tolist(), after.tolist()) for t in [c + layout.code_offset] + [x for x in f
                                                                                                      if x >= 0]]
    assert spliced == codes_to_ids(layout, codes).tolist()
    assert torch.equal(code_steps(layout, torch.arange(layout.codes)) - torch.arange(layout.codes),
                       torch.cat([torch.zeros(1, dtype=torch.long), (after >= 0).sum(-1).cumsum(0)[:-1]]))


@pytest.mark.parametrize("layout", [ANOLE, LUMINA_MGPT_768], ids=lambda lay: lay.name)
def test_image_mask_is_the_authors_restriction(layout):
    """Anole: ids 0..3 and 8196..65535 set to finfo.min; Lumina: every id not in range(4, 8196) suppressed. The
    softmax over the image head's rows alone is that distribution, with exact zeros elsewhere."""
    mask = image_mask(layout)
    authors = torch.ones(65536, dtype=torch.bool)
    authors[:4] = False
    authors[8196:] = False
    assert torch.equal(mask, authors) and int(mask.sum()) == 8192
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 65536, generator=g) * 4
    theirs = torch.softmax(logits.masked_fill(~authors, torch.finfo(logits.dtype).min), -1)
    ours = torch.softmax(image_logits(layout, logits), -1)
    assert bool((theirs[:, ~authors] == 0).all())
    torch.testing.assert_close(theirs[:, authors], ours, rtol=1e-6, atol=0)


def test_tau_both_ways():
    """800 verify rounds after the prefill: ours counts codes over every forward, theirs every generated step after
    the first (eol and eoi included) over the rounds."""
    assert tau_codes(LUMINA_MGPT_768, 801) == pytest.approx(2304 / 801)
    assert tau_authors(LUMINA_MGPT_768, 801) == pytest.approx(2352 / 800)
    assert tau_codes(ANOLE, 401) == pytest.approx(1024 / 401) and tau_authors(ANOLE, 401) == pytest.approx(1023 / 400)
    with pytest.raises(ValueError, match="verify forward"):
        tau_authors(ANOLE, 1)


# -- plain AR with a layout, on a tiny LlamaGen GPT standing in for a Chameleon target --------------------------------
# 3 rows of 4 codes, each row closed by id 15 (the tiny GPT's last vocabulary row): 15 steps within its 16 positions
TOY = Layout("toy", 3, 4, eol=15, code_offset=0, codebook=15, vocab=16)


def authors_ar(model, cond, params, generators, layout):
    """The authors' plain AR written out: one forward per generated step, forced tokens included; at a free step the
    CFG-mixed logits with every non-image id at -inf (their processor), drawn with the image's next uniform."""
    from lantern.engine.decoding.generate import cfg_rows, decode_one_token, prefill
    from lantern.engine.decoding.sampling import Uniforms, logits_to_probs, mix_cfg, next_tokens

    rows, _ = cfg_rows(model, cond, params)
    model.setup_cache(rows.shape[0])
    logits, _ = prefill(model, rows)
    u = None if params.greedy else Uniforms(generators, layout.codes, cond.device).u
    forced, allowed = forced_tokens(layout).tolist(), image_mask(layout)
    ids, code = [], 0
    for step in range(layout.steps):
        if forced[step] >= 0:
            token = torch.full((cond.shape[0],), forced[step])
        else:
            guided = mix_cfg(logits, params, code).masked_fill(~allowed, float("-inf"))
            token = next_tokens(logits_to_probs(guided, params), params, None if u is None else u[:, code])
            code += 1
        ids.append(token)
        if step < layout.steps - 1:
            fed = torch.cat([token, token]) if params.use_cfg else token
            logits, _ = decode_one_token(model, fed, model.args.cls_token_num + step)
    model.clear_cache()
    return torch.stack(ids, 1)


@pytest.mark.parametrize("greedy, cfg, top_k", [(True, 3.0, 0), (False, 1.0, 0), (False, 3.0, 8)])
def test_generate_with_a_layout_is_the_authors_ar(greedy, cfg, top_k):
    """generate(layout=...) against the authors' loop (float64): the same codes, eol at every row's end, the forced
    tokens' forwards counted."""
    from lantern.engine.decoding.generate import generate
    from lantern.engine.decoding.sampling import SamplingParams
    from tiny import gens, tiny_target

    model = tiny_target(scale=3.0).double()
    params = SamplingParams(cfg_scale=cfg, greedy=greedy, top_k=top_k)
    cond = torch.arange(6) % 4
    codes, stats = generate(model, cond, params, gens(6), layout=TOY)
    ids = authors_ar(model, cond, params, gens(6), TOY)
    assert bool((ids[:, [4, 9, 14]] == 15).all()) and bool((ids[:, forced_tokens(TOY) < 0] < 15).all())
    assert torch.equal(codes, ids_to_codes(TOY, ids).flatten(1))
    assert codes.shape == (6, 12) and len({tuple(c) for c in codes.tolist()}) > 1
    assert all(s.n_tokens == 12 and s.target_forwards == 12 + 2 for s in stats)  # two eol forwards; the last eol
    # needs none


# -- chain rounds with a layout (eager) ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def toy_pair():
    """The tiny GPT in float64 with an untrained drafter given random weights, so that drafts are often wrong."""
    from tiny import float64_pair

    return float64_pair()


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_chain_with_a_layout_gives_greedy_ar(toy_pair, gamma):
    """Greedy chain rounds over the codes, eol spliced into the forwards, give greedy AR's codes; gamma 6 spans a row
    end in every round."""
    from lantern.engine.decoding.chain import Chain
    from lantern.engine.decoding.generate import generate
    from lantern.engine.decoding.sampling import SamplingParams
    from lantern.engine.decoding.speculative import decode
    from lantern.engine.rules.acceptance import AcceptRule
    from tiny import gens

    target, drafter = toy_pair
    params = SamplingParams(cfg_scale=2.0, greedy=True)
    cond = torch.arange(5) % 4
    want, _ = generate(target, cond, params, gens(5), layout=TOY)
    got, stats = decode(target, drafter, cond, params, AcceptRule(), Chain(gamma), gens(5), layout=TOY)
    assert torch.equal(got, want)
    assert all(s.n_tokens == 12 and s.target_forwards == 1 + len(s.accepted_per_step) for s in stats)
    assert sum(s.accepted_total for s in stats) > 0


@pytest.mark.parametrize("rule", ["exact", "lantern", "lanternpp-lumina"])
def test_sampled_chain_with_a_layout_batch_equals_one_by_one(toy_pair, rule):
    """Each image of a batch gets the codes, rounds and stats it gets alone (float64), relaxed rules included."""
    from lantern.engine.decoding.chain import Chain
    from lantern.engine.decoding.sampling import SamplingParams
    from lantern.engine.decoding.speculative import decode
    from lantern.engine.rules.acceptance import AcceptRule
    from tiny import assert_same_decodes, gens

    target, drafter = toy_pair
    rule = {"exact": AcceptRule(), "lantern": AcceptRule("lantern", delta=0.3, k=5),
            "lanternpp-lumina": AcceptRule("lanternpp", lam=4.0, k=5, residual="lumina")}[rule]
    table = torch.stack([torch.roll(torch.arange(15), -i)[1:] for i in range(15)])  # codes 0 .. 14
    params = SamplingParams(cfg_scale=2.0, top_k=10)
    cond = torch.arange(6) % 4
    got, stats = decode(target, drafter, cond, params, rule, Chain(5), gens(6, 2), table, layout=TOY)
    alone = [decode(target, drafter, cond[i : i + 1], params, rule, Chain(5), gens(6, 2)[i : i + 1], table,
                    layout=TOY) for i in range(6)]
    assert_same_decodes(got, stats, torch.cat([t for t, _ in alone]), [s for _, (s,) in alone], 12)
    assert got.max() < 15 and len({tuple(s.accepted_per_step) for s in stats}) > 1


def test_exact_chain_with_a_layout_reproduces_the_authors_distribution():
    """Exact chain SD over a 2 x 2 layout with an eol (codes 0..2, eol 3) emits the law of the authors' sequence: the
    joint of the four codes by one teacher-forced pass over ids with the eol in place (chi-square, 700 images)."""
    import itertools

    from lantern.engine.decoding.chain import Chain
    from lantern.engine.decoding.sampling import SamplingParams, image_generator, logits_to_probs, mix_cfg
    from lantern.engine.decoding.speculative import decode
    from lantern.engine.models.drafter import Drafter
    from lantern.engine.rules.acceptance import AcceptRule
    from tiny import chi_square_pvalue, tiny_target

    layout = Layout("toy2", 2, 2, eol=3, code_offset=0, codebook=3, vocab=4)
    target = tiny_target(scale=4.0, vocab_size=4, image_tokens=9, num_classes=2)
    drafter = Drafter.from_target(target).eval()
    torch.nn.init.normal_(drafter.fc.weight, std=0.3)  # a poor drafter: plenty of rejections too
    params = SamplingParams(cfg_scale=2.0, top_k=2)
    codes = torch.tensor(list(itertools.product(range(3), repeat=4)))
    ids = codes_to_ids(layout, codes)  # [81, 6]: c c eol c c eol
    n_seq = len(codes)
    with torch.no_grad():
        logits, _ = target(torch.cat([torch.ones(n_seq, dtype=torch.long), torch.full((n_seq,), 2)]),
                           torch.cat([ids, ids])[:, :-1])
    steps = code_steps(layout, torch.arange(4))
    probs = torch.stack([logits_to_probs(image_logits(layout, mix_cfg(logits[:, s], params, j)), params)
                         for j, s in enumerate(steps.tolist())], 1)
    joint = probs.gather(2, codes[:, :, None])[:, :, 0].double().prod(1)
    index = {tuple(c): i for i, c in enumerate(codes.tolist())}
    counts = torch.zeros(n_seq, dtype=torch.float64)
    n, B, rejected = 700, 35, 0
    for first in range(0, n, B):
        got, stats = decode(target, drafter, torch.ones(B, dtype=torch.long), params, AcceptRule(), Chain(3),
                            [image_generator(12, i) for i in range(first, first + B)], layout=layout)
        for c, s in zip(got.tolist(), stats):
            counts[index[tuple(c)]] += 1
            rejected += sum(a < min(3, 4) for a in s.accepted_per_step)
    assert rejected > n / 6
    assert chi_square_pvalue(joint, counts, n) > 1e-3


def test_slot_geometry_by_hand():
    """TOY (rows of 4 codes, eol 15): y = code 3 ends row 0, so slot 0 is the eol and drafts 4, 5, 6 sit at slots 1,
    2, 3; the bonus code 7 at slot 4 ends row 1 but is predicted by slot 3's row. Images near the end: codes past the
    grid sit at the spare slot, never read."""
    from lantern.engine.decoding.forced import slot_geometry, slot_width, verify_rows

    forced, code_slot, slot_code = slot_geometry(TOY, torch.tensor([4, 1, 11]), 3)
    S = slot_width(TOY, 3)
    assert S == 3 + 1 + 2 and forced.shape == slot_code.shape == (3, S)
    assert forced[0].tolist() == [15, -1, -1, -1, -1, 15] and code_slot[0].tolist() == [1, 2, 3, 4]
    assert slot_code[0].tolist() == [-1, 0, 1, 2, 3, -1]
    assert forced[1].tolist() == [-1, -1, -1, 15, -1, -1] and code_slot[1].tolist() == [0, 1, 2, 4]  # y = code 0
    assert code_slot[2].tolist() == [0, S - 1, S - 1, S - 1]  # code 11 is the last; past it nothing
    assert verify_rows(TOY, 4, 3) == 5 and verify_rows(TOY, 1, 3) == 5 and verify_rows(TOY, 11, 1) == 2


def test_head_layout_is_the_same_sequence_in_the_chameleon_heads_columns():
    """Chameleon's head exposes the codes as columns 0..8191 and the layout's eol / eoi after them: mapping the
    head-space sequence's columns back to ids gives the authors' sequence."""
    from lantern.engine.models.layout import head_layout

    head, extra = head_layout(LUMINA_MGPT_768)
    assert extra == (8803, 8196) and (head.eol, head.eoi, head.code_offset, head.vocab) == (8192, 8193, 0, 8194)
    assert (head.rows, head.cols, head.steps, head.prefix) == (48, 48, 2353, ())
    codes = torch.randint(0, 8192, (2, 48, 48), generator=torch.Generator().manual_seed(0))
    ids = torch.cat([torch.arange(4, 8196), torch.tensor(extra)])  # column -> token id (Chameleon.head_ids)
    assert torch.equal(ids[codes_to_ids(head, codes)], codes_to_ids(LUMINA_MGPT_768, codes))
    assert head_layout(ANOLE) == (Layout("anole", 32, 32, code_offset=0, codebook=8192, vocab=8192), ())
