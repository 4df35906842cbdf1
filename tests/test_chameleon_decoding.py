"""Every decoder on a tiny Chameleon target (read from HF shards) and the authors' Chameleon drafter layout:
greedy speculative decoding gives greedy AR's tokens, a batch of left-padded prompts gives each image its tokens
alone, the exact rule (and LANTERN at delta 0) reproduces the target's distribution, and the authors' drafter
state dict loads strictly and computes their function (transformers' Chameleon layer)."""
import itertools

import pytest
import torch

from lantern.engine.decoding.chain import Chain
from lantern.engine.decoding.generate import cfg_rows, generate
from lantern.engine.decoding.jacobi import Jacobi
from lantern.engine.decoding.sampling import SamplingParams, image_generator, logits_to_probs, mix_cfg
from lantern.engine.decoding.speculative import decode
from lantern.engine.decoding.trees import DynamicTree, StaticTree
from lantern.engine.models.chameleon import ChameleonDrafter
from lantern.engine.models.chameleon_load import drafter_from_authors
from lantern.engine.rules.acceptance import AcceptRule
from lantern.errors import UserError
from lantern.worlds.chameleon.hf import load_drafter
from tiny import chi_square_pvalue, gens, one_thread  # noqa: F401 (fixture)
from tiny_chameleon import hf_model, ours_from, save_shards

pytestmark = pytest.mark.usefixtures("one_thread")
ANOLE_NULL = (0, 21)  # the Anole null prompt's shape: BOS, then begin-of-image (21 in this tiny vocabulary)


def tiny(tmp_path_factory, codes=16, image_tokens=10, seed=0, std=0.5):
    folder = save_shards(hf_model(codes=codes, seed=seed, std=std), tmp_path_factory.mktemp("hf"))
    return ours_from(folder, cls_token_num=6, image_tokens=image_tokens, image_codes=codes, uncond_prompt=ANOLE_NULL)


def random_drafter(target, std=0.3):
    drafter = ChameleonDrafter.from_target(target).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for w in (drafter.fc.weight, drafter.layer.attention.wqkv.weight, drafter.layer.attention.wo.weight):
            w.normal_(0, std)
    return drafter


def prompts():
    """Three prompts of lengths 6, 3 and 4, left-padded with id 1 to T = 6."""
    ids = torch.tensor([[0, 30, 31, 32, 33, 8], [1, 1, 1, 0, 40, 8], [1, 1, 0, 50, 51, 8]])
    return ids, ids != 1


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Four codes, so that a random drafter's drafts are often the target's choice (both verify paths run)."""
    target = tiny(tmp_path_factory, codes=4, image_tokens=12)
    return target, random_drafter(target)


KINDS = {"chain": lambda: Chain(3), "static": lambda: StaticTree([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]),
         "dynamic": lambda: DynamicTree(total_tokens=8, depth=3, top_k=3), "jacobi": lambda: Jacobi(4)}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_greedy_speculative_equals_greedy_ar(pair, kind, cfg):
    target, drafter = pair
    params = SamplingParams(cfg_scale=cfg, greedy=True)
    ids, mask = prompts()
    ar, _ = generate(target, ids, params, gens(3), cond_mask=mask)
    sd, stats = decode(target, None if kind == "jacobi" else drafter, ids, params, AcceptRule(), KINDS[kind](),
                       gens(3), cond_mask=mask)
    assert torch.equal(sd, ar)
    assert sum(s.accepted_total for s in stats) > 0
    for i in range(3):  # each image alone, unpadded (its own prompt length), gets the same tokens
        real = ids[i][mask[i]][None]
        alone = target_for(target, real.shape[1])
        one, _ = generate(alone, real, params, gens(1), cond_mask=torch.ones_like(real, dtype=torch.bool))
        assert torch.equal(one[0], ar[i])


def target_for(target, T):
    """The same weights with T prompt slots (an unpadded prompt of length T)."""
    import dataclasses

    from lantern.engine.models.chameleon import Chameleon

    other = Chameleon(dataclasses.replace(target.args, cls_token_num=T)).double().eval()
    other.load_state_dict(target.state_dict())
    return other


def test_a_batch_of_padded_prompts_samples_each_image_as_alone(pair):
    target, drafter = pair
    params = SamplingParams(cfg_scale=3.0)
    ids, mask = prompts()
    table = torch.stack([torch.roll(torch.arange(4), -i)[1:] for i in range(4)])
    rule = AcceptRule("lantern", delta=0.2, k=2)
    batch, _ = decode(target, drafter, ids, params, rule, Chain(3), gens(3), table=table, cond_mask=mask)
    for i in range(3):
        one, _ = decode(target, drafter, ids[i : i + 1], params, rule, Chain(3), gens(3)[i : i + 1], table=table,
                        cond_mask=mask[i : i + 1])
        assert torch.equal(one[0], batch[i])


def exact_joint(target, ids, mask, params, V, N):
    """P(sequence) of AR sampling for every code sequence, by one teacher-forced pass over the CFG rows."""
    seqs = torch.tensor(list(itertools.product(range(V), repeat=N)))
    n = len(seqs)
    rows, rows_mask = cfg_rows(target, ids.expand(n, -1), params, mask.expand(n, -1))
    with torch.no_grad():
        logits, _ = target(rows, torch.cat([seqs, seqs])[:, :-1], rows_mask)
    probs = torch.stack([logits_to_probs(mix_cfg(logits[:, j], params, j), params) for j in range(N)], 1)
    return seqs, probs.gather(2, seqs[:, :, None])[:, :, 0].double().prod(1)


@pytest.mark.parametrize("rule", [AcceptRule(), AcceptRule("lantern", delta=0.0, k=2)])
def test_exact_sampling_reproduces_the_target_distribution(tmp_path_factory, rule):
    V, N, n = 3, 3, 600
    target = tiny(tmp_path_factory, codes=V, image_tokens=N, seed=2, std=0.8)
    drafter = random_drafter(target, std=0.6)
    ids, mask = prompts()
    ids, mask = ids[1:2], mask[1:2]  # a padded prompt
    params = SamplingParams(cfg_scale=2.0)
    seqs, joint = exact_joint(target, ids, mask, params, V, N)
    index = {tuple(s): i for i, s in enumerate(seqs.tolist())}
    table = torch.tensor([[1, 2], [2, 0], [0, 1]])
    counts = torch.zeros(len(seqs), dtype=torch.float64)
    accepted = rejected = 0
    for i in range(n):
        tokens, (s,) = decode(target, drafter, ids, params, rule, Chain(2), [image_generator(5, i)], table=table,
                              cond_mask=mask)
        counts[index[tuple(tokens[0].tolist())]] += 1
        accepted += s.accepted_total
        rejected += sum(a < 2 for a in s.accepted_per_step)
    assert accepted > n / 6 and rejected > n / 6
    assert chi_square_pvalue(joint, counts, n) > 1e-3


# -- the authors' drafter ----------------------------------------------------------------------------------------
def authors_state(target, seed=0):
    """A state dict with the authors' keys (reference 5): the frozen embedding, fc with bias, one HF Chameleon
    layer (rotate-half layout, per-head q/k-norm), as transformers' layer names them; and that layer."""
    hf = hf_model(seed=seed, std=0.3)
    layer = hf.model.layers[0]
    torch.manual_seed(seed)
    fc = torch.nn.Linear(64, 32).double()
    sd = {"embed_tokens.weight": target.tok_embeddings.weight.detach().clone(), "fc.weight": fc.weight.detach(),
          "fc.bias": fc.bias.detach(), **{f"layers.0.{k}": v for k, v in layer.state_dict().items()}}
    return sd, hf, fc


def authors_drafter(hf, fc, target, tokens, hidden, pos):
    """Their drafter's function with transformers' layer: fc(cat(embed(token p + 1), h_p)) -> the layer at
    positions `pos` (causal) -> no final norm -> the target's head."""
    x = fc(torch.cat([target.tok_embeddings(tokens), hidden], -1))
    S = x.shape[1]
    mask = torch.full((S, S), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)[None, None]
    cos_sin = hf.model.rotary_emb(x, pos)
    out = hf.model.layers[0](x, attention_mask=mask, position_ids=pos, position_embeddings=cos_sin)
    out = out[0] if isinstance(out, tuple) else out
    return target.head(out)


def test_the_authors_drafter_loads_strictly_and_computes_their_function(pair, tmp_path):
    target, _ = pair
    sd, hf, fc = authors_state(target)
    (tmp_path / "d").mkdir()
    cfg = hf.config.to_dict()
    cfg.update(num_hidden_layers=1, bias=True)
    import json

    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg, default=str))
    torch.save(sd, tmp_path / "d" / "pytorch_model.bin")
    drafter = load_drafter(tmp_path / "d", target)
    # two rows, the second left-padded by 2: drafter position p reads h_p, token p + 1, at RoPE position p - 2
    ids, mask = prompts()
    ids, mask = ids[:2], mask[:2]
    codes = torch.tensor([[0, 1, 2], [3, 2, 1]])
    with torch.no_grad():
        _, _, h = target.teacher_forced(ids, codes, mask)
        seq = torch.cat([ids, codes + 4], 1)
        drafter.setup_cache(2, extra=0, cond_mask=mask)
        out = drafter.step(drafter.cond_inputs(target.embed_cond(ids)), h[:, :5], 0)
        out = torch.cat([out, drafter.step(drafter.embed_tokens(codes), h[:, 5:8], 5)], 1)
        drafter.clear_cache()
        got = drafter.head(out)
        for r, pad in ((0, 0), (1, 3)):
            real = seq[r, pad:]
            pos = torch.arange(len(real) - 1)[None]
            want = authors_drafter(hf, fc, target, real[None, 1:], h[r : r + 1, pad:-1], pos)
            torch.testing.assert_close(got[r, pad:], want[0], atol=2e-6, rtol=1e-6)
    with pytest.raises(UserError, match=r"pytorch_model.bin: fc.bias has shape \(31,\), expected \(32,\)"):
        drafter_from_authors({**sd, "fc.bias": sd["fc.bias"][:-1]}, tmp_path / "d", target,
                             {"fc.bias": str(tmp_path / "d" / "pytorch_model.bin")})
    with pytest.raises(UserError, match="missing tensor layers.0.self_attn.k_norm.bias"):
        drafter_from_authors({k: v for k, v in sd.items() if k != "layers.0.self_attn.k_norm.bias"}, "d", target)
    with pytest.raises(UserError, match="unexpected tensor lm_head.weight"):
        drafter_from_authors({**sd, "lm_head.weight": target.output.weight}, "d", target)
    with pytest.raises(UserError, match="not the target's model.embed_tokens.weight"):
        drafter_from_authors({**sd, "embed_tokens.weight": sd["embed_tokens.weight"] + 1}, "d", target)


def test_rope_positions_are_the_authors(pair, monkeypatch):
    """RoPE is relative, so a row's constant shift changes no output in exact arithmetic (the tests above cannot
    see it); the positions still follow the authors' (their HF path rounds cos / sin to bf16 per absolute
    position): the Anole null row [pads, 0, boi] sits at 0, 1 and image token n at n - (T - 2) in the target and
    in the drafter, whose position p is that of h_p."""
    from lantern.engine.models import chameleon

    seen = []
    real = chameleon.rope_positions
    monkeypatch.setattr(chameleon, "rope_positions", lambda *a: seen.append(real(*a)) or seen[-1])
    target, drafter = pair
    ids = torch.tensor([[0, 30, 31, 32, 33, 8]])  # T = 6, unpadded
    params = SamplingParams(cfg_scale=3.0, greedy=True)
    with torch.no_grad():
        decode(target, drafter, ids, params, AcceptRule(), Chain(2), gens(1), cond_mask=ids >= 0)
    target_prefill, drafter_prefill = seen[0], seen[1]
    assert target_prefill.tolist() == [list(range(6)), [0, 0, 0, 0, 0, 1]]
    assert drafter_prefill.tolist() == [list(range(6)), [0, 0, 0, 0, 0, 1]]  # h_4 (BOS) reads boi at 0
    later = [p for p in seen[2:] if p.shape[1] and p[0, 0] >= 6]
    assert later and all(torch.equal(p[1], p[0] - 4) for p in later)


@pytest.mark.parametrize("kind", list(KINDS))
def test_static_shapes_equal_one_by_one(pair, kind, monkeypatch):
    """compile=True's static-width rounds and kept caches (inductor left out: the padding and the cache reuse
    alone, exactly) over a padded prompt batch, twice (the second batch reuses the kept caches): each image's
    tokens are those it gets decoded alone."""
    from lantern.engine.decoding import compiled

    monkeypatch.setattr(compiled, "compiled_step", lambda fn, device: fn)
    target, drafter = pair
    drafter = None if kind == "jacobi" else drafter
    params = SamplingParams(cfg_scale=3.0, top_k=3)
    ids, mask = prompts()
    table = torch.stack([torch.roll(torch.arange(4), -i)[1:] for i in range(4)])
    rule = AcceptRule("lantern", delta=0.2, k=2)
    for seed in (0, 1):
        got, _ = decode(target, drafter, ids, params, rule, KINDS[kind](), gens(3, seed), table, mask, compile=True)
        for i in range(3):
            one, _ = decode(target, drafter, ids[i : i + 1], params, rule, KINDS[kind](), gens(3, seed)[i : i + 1],
                            table, mask[i : i + 1])
            assert torch.equal(one[0], got[i])


@pytest.mark.slow
def test_compiled_plain_ar_gives_eager_tokens(pair):
    """generate(compile=True) through inductor on the Chameleon target (one graph for every step)."""
    target, _ = pair
    target = target.float()
    try:
        params = SamplingParams(cfg_scale=3.0, greedy=True)
        ids, mask = prompts()
        want, _ = generate(target, ids, params, gens(3), cond_mask=mask)
        got, _ = generate(target, ids, params, gens(3), cond_mask=mask, compile=True)
        assert torch.equal(got, want)
    finally:
        target.double()


def test_the_real_anole_ids_decode(tmp_path_factory):
    """Vocabulary 8832 (width 32): the decoders see the 8192 codes (ids 4..8195), the prompt and the null row use
    the real special ids (BOS 0, end of turn 8710, begin of image 8197); greedy chain and dynamic-tree decoding
    give greedy AR's tokens, and LANTERN with an 8192-row neighbour table samples codes."""
    folder = save_shards(hf_model(vocab=8832, codes=8192, std=0.5), tmp_path_factory.mktemp("anole"))
    target = ours_from(folder, cls_token_num=7, image_tokens=6, uncond_prompt=(0, 8197))
    drafter = random_drafter(target)
    assert target.args.vocab_size == 8192
    ids = torch.tensor([[1, 0, 100, 200, 300, 8710, 8197], [1, 1, 1, 0, 400, 8710, 8197]])  # left-padded to T = 7
    mask = ids != 1
    greedy = SamplingParams(cfg_scale=3.0, greedy=True)
    ar, _ = generate(target, ids, greedy, gens(2), cond_mask=mask)
    for kind in (Chain(3), DynamicTree(total_tokens=8, depth=3, top_k=3)):
        got, _ = decode(target, drafter, ids, greedy, AcceptRule(), kind, gens(2), cond_mask=mask)
        assert torch.equal(got, ar)
    table = (torch.arange(8192)[:, None] + torch.arange(1, 4)) % 8192
    tokens, stats = decode(target, drafter, ids, SamplingParams(cfg_scale=3.0, top_k=2000),
                           AcceptRule("lantern", delta=0.1, k=3), Chain(3), gens(2), table, mask)
    assert tokens.shape == (2, 6) and 0 <= tokens.min() and tokens.max() < 8192
    assert all(s.n_tokens == 6 for s in stats)
