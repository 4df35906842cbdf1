"""Tiny targets and drafters for the decoding tests (test_drafter, test_speculative, test_trees, test_jacobi), and
the exact joint distribution and chi-square test their exactness checks share."""
import itertools

import pytest
import torch

from lantern.pipeline.train_drafter import DrafterParams, self_generate, train_drafter
from lantern.engine.decoding.sampling import image_generator, logits_to_probs, mix_cfg
from lantern.engine.models.model import GPT, ModelArgs


def tiny_target(model_type="c2i", scale=30.0, seed=0, **kw):
    """A 2-layer GPT over 16 codes and 4 classes; `scale` sharpens its next-token distributions, so that drafter
    agreement is learnable in seconds."""
    base = dict(dim=32, n_layer=2, n_head=2, vocab_size=16, num_classes=4, image_tokens=16, multiple_of=32)
    if model_type == "t2i":
        base.update(model_type="t2i", cls_token_num=5, caption_dim=12)
    base.update(kw)
    torch.manual_seed(seed)
    model = GPT(ModelArgs(**base)).eval()
    with torch.no_grad():
        model.output.weight.mul_(scale)
    return model


def float64_pair():
    """The layout tests' pair: the tiny GPT in float64 and an untrained drafter with random weights, so that drafts
    are often wrong."""
    from lantern.engine.models.drafter import Drafter

    torch.manual_seed(3)
    target = tiny_target(scale=3.0).double()
    drafter = Drafter.from_target(target).eval().double()
    torch.nn.init.normal_(drafter.fc.weight, std=0.3)
    return target, drafter


def save_world(root, target):
    """target.pt, drafter.pt (an untrained drafter for `target`) and vq.pt (a random 16-code VQ) under root."""
    import dataclasses

    from lantern.engine.models.checkpoint import save_checkpoint
    from lantern.engine.models.drafter import Drafter, save_drafter
    from lantern.engine.models.vq import VQArgs, VQModel

    save_checkpoint(root / "target.pt", target, args=target.args.to_dict())
    save_drafter(root / "drafter.pt", Drafter.from_target(target))
    vq_args = VQArgs(codebook_size=16, codebook_embed_dim=4, ch=8, ch_mult=(1, 1), z_channels=8, enc_res_blocks=1,
                     dec_res_blocks=1, norm_groups=4)
    torch.manual_seed(0)
    save_checkpoint(root / "vq.pt", VQModel(vq_args), args=dataclasses.asdict(vq_args))
    return root


def assert_same_decodes(got, stats, want, want_stats, n_tokens: int) -> None:
    """A batched decode (tokens [B, N], stats) equals one-by-one decodes of its images: tokens, rounds, forwards."""
    assert torch.equal(got, want)
    for s, w in zip(stats, want_stats, strict=True):
        assert s.accepted_per_step == w.accepted_per_step and s.tree_depth == w.tree_depth
        assert (s.target_forwards, s.drafter_forwards, s.accepted_total) == \
            (w.target_forwards, w.drafter_forwards, w.accepted_total)
        assert s.tau == w.tau and s.batch_size == len(stats) and s.n_tokens == n_tokens
        assert min(s.time_draft_s, s.time_verify_s, s.time_other_s) >= 0


def ragged_t2i(options):
    """A float64 t2i target, its drafter (`options`) with random weights so that its drafts depend on the captions
    it sees, and 4 caption conditions [4, 5, 12] with differently left-padded masks [4, 5]."""
    from lantern.engine.models.drafter import Drafter

    target = tiny_target("t2i").double()
    drafter = Drafter.from_target(target, options).eval().double()
    for w in (drafter.fc.weight, drafter.layer.attention.wqkv.weight, drafter.layer.attention.wo.weight):
        torch.nn.init.normal_(w, std=0.4)
    cond = torch.randn(4, 5, 12, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)
    return target, drafter, cond, mask


def exact_joint(target, label, params, V, N):
    """P(sequence) of AR sampling for every sequence, by one teacher-forced pass."""
    seqs = torch.tensor(list(itertools.product(range(V), repeat=N)))
    n = len(seqs)
    cond = torch.cat([torch.full((n,), label), torch.full((n,), target.args.num_classes)])
    with torch.no_grad():
        logits, _ = target(cond, torch.cat([seqs, seqs])[:, :-1])
    probs = torch.stack([logits_to_probs(mix_cfg(logits[:, j], params, j), params) for j in range(N)], 1)
    return seqs, probs.gather(2, seqs[:, :, None])[:, :, 0].double().prod(1)


def chi_square_pvalue(joint, counts, n: int) -> float:
    """p-value of observed sequence counts against the exact joint probabilities (cells expecting fewer than 5
    pooled into one); nothing may land outside the support."""
    assert counts[joint == 0].sum() == 0
    big, small = joint * n >= 5, (joint > 0) & (joint * n < 5)
    expected, observed = joint[big] * n, counts[big]
    if small.any():
        expected = torch.cat([expected, (joint[small] * n).sum().view(1)])
        observed = torch.cat([observed, counts[small].sum().view(1)])
    stat = ((observed - expected) ** 2 / expected).sum()
    return torch.special.gammaincc(torch.tensor((len(expected) - 1) / 2, dtype=torch.float64), stat / 2).item()


def gens(n, seed=0):
    return [image_generator(seed, i) for i in range(n)]


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one thread. Two OpenMP threads on a busy 2-core machine make each small masked attention
    call ~100x slower (~15 ms instead of ~0.1 ms)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def trained(one_thread):
    """A tiny c2i target and a drafter trained on its own samples (a few seconds), so drafts are often right."""
    target = tiny_target()
    labels = torch.arange(192) % 4
    tokens = self_generate(target, labels, {"temperature": 1.0}, seed=0)
    drafter, _ = train_drafter(target, tokens, labels, DrafterParams(epochs=6, batch_size=32, lr=3e-3))
    return target, drafter


FUSED_LAYERS = (0, 2)


def four_layers():
    return tiny_target(n_layer=4)


@pytest.fixture(scope="module")
def trained_fused(one_thread):
    """A 4-layer tiny target and a drafter that also reads its layers 0 and 2 (DrafterOptions.feature_layers),
    trained on the target's own samples (seconds)."""
    target = four_layers()
    labels = torch.arange(192) % 4
    tokens = self_generate(target, labels, {"temperature": 1.0}, seed=0)
    drafter, _ = train_drafter(target, tokens, labels, DrafterParams(epochs=6, batch_size=32, lr=3e-3,
                                                                     feature_layers=list(FUSED_LAYERS)))
    assert target.feature_layers == FUSED_LAYERS
    return target, drafter


def decode_one(target, drafter, cond, params, rule, drafting, generator, table=None, cond_mask=None):
    """One image (cond [1] or [1, T, C]) through speculative.decode as a batch of one: (tokens [N], stats)."""
    from lantern.engine.decoding.speculative import decode

    tokens, (stats,) = decode(target, drafter, cond, params, rule, drafting, [generator], table, cond_mask)
    return tokens[0], stats


def one_by_one(target, drafter, cond, params, rule, drafting, generators, table=None, cond_mask=None):
    """Each image of a batch decoded as a batch of one (the reference of "a batch of B gives each image the tokens it
    gets alone"): (tokens [B, N], stats)."""
    out = [decode_one(target, drafter, cond[i : i + 1], params, rule, drafting, g, table,
                      None if cond_mask is None else cond_mask[i : i + 1]) for i, g in enumerate(generators)]
    return torch.stack([t for t, _ in out]), [s for _, s in out]


def sample_index(probs: torch.Tensor, generator: torch.Generator) -> int:
    """The reference for sampling.draw: an inverse-CDF draw from a 1-D distribution with one uniform from
    `generator` (never a zero-mass index)."""
    u = torch.rand((), generator=generator, dtype=torch.float64).item()
    cdf = probs.detach().double().cumsum(0)
    u *= cdf[-1].item()
    idx = int(torch.searchsorted(cdf, torch.tensor([u], dtype=torch.float64, device=cdf.device), right=True).item())
    if idx >= probs.numel():  # u rounded onto the total mass
        idx = int(torch.nonzero(probs > 0)[-1].item())
    return idx
