"""A drafter that reads target layers beside h_t (DrafterOptions.feature_layers, EAGLE-3's feature fusion): what the
target hands on, the fused drafter's start, its checkpoints, its training and its exactness in decoding (greedy
chains and trees with it: test_speculative and test_trees, over both trained pairs)."""
import copy

import pytest
import torch

from lantern.engine.rules.acceptance import AcceptRule
from lantern.engine.decoding.chain import Chain
from lantern.engine.models.drafter import Drafter, DrafterOptions, load_drafter, save_drafter, target_states
from lantern.engine.decoding.sampling import SamplingParams, image_generator
from lantern.engine.decoding.speculative import decode
from lantern.errors import UserError
from lantern.hparams import DrafterParams
from lantern.params import check_feature_layers
from lantern.pipeline.train_drafter import drafter_losses, unrolled
from tiny import (FUSED_LAYERS, assert_same_decodes, chi_square_pvalue, decode_one, exact_joint,  # noqa: F401
                  four_layers, gens, one_by_one, one_thread, tiny_target, trained_fused)

pytestmark = pytest.mark.usefixtures("one_thread")
LAYERS = FUSED_LAYERS

@torch.no_grad()
def test_the_target_hands_on_its_layers_before_h_and_its_logits_stay():
    target = four_layers()
    cond, tokens = torch.tensor([1, 3]), torch.randint(0, 16, (2, 15))
    _, h, logits = target_states(target, cond, tokens)
    outputs = {}
    hooks = [target.layers[i].register_forward_hook(lambda m, a, o, i=i: outputs.__setitem__(i, o)) for i in LAYERS]
    Drafter.from_target(target, DrafterOptions(feature_layers=LAYERS))  # the drafter tells the target what it reads
    assert target.feature_layers == LAYERS
    _, feats, fused_logits = target_states(target, cond, tokens)
    for hook in hooks:
        hook.remove()
    d = target.args.dim
    assert feats.shape == (*h.shape[:2], 3 * d)
    torch.testing.assert_close(fused_logits, logits, rtol=0, atol=0)
    torch.testing.assert_close(feats[..., -d:], h, rtol=0, atol=0)
    for k, i in enumerate(LAYERS):
        torch.testing.assert_close(feats[..., k * d : (k + 1) * d], outputs[i], rtol=0, atol=0)


@torch.no_grad()
def test_an_untrained_fused_drafter_is_the_eagle_one_drafter():
    """fuse starts as h_t alone, so training starts from EAGLE-1's function; a d-wide state passes unfused."""
    target = four_layers()
    plain = Drafter.from_target(target)
    fused = Drafter.from_target(target, DrafterOptions(feature_layers=LAYERS))
    assert fused.load_state_dict(plain.state_dict(), strict=False).missing_keys == ["fuse.weight", "fuse.bias"]
    x, feats, _ = target_states(target, torch.tensor([2]), torch.randint(0, 16, (1, 15)))
    emb, h = plain.inputs(x[:, :1], torch.randint(0, 16, (1, 15))), feats[:, :-1]
    torch.testing.assert_close(fused(emb, h), plain(emb, h[..., -32:]))
    torch.testing.assert_close(fused.fused(h[..., -32:]), h[..., -32:], rtol=0, atol=0)
    with torch.no_grad():
        fused.fuse.weight.normal_()
    assert not torch.allclose(fused(emb, h), plain(emb, h[..., -32:]))


def test_checkpoints_keep_the_layers_and_the_fusion(tmp_path):
    target = four_layers()
    drafter = Drafter.from_target(target, DrafterOptions(feature_layers=LAYERS))
    with torch.no_grad():
        drafter.fuse.weight.normal_()
    assert {k.split(".")[0] for k in drafter.trained_state()} == {"fc", "layer", "fuse"}
    save_drafter(tmp_path / "d.pt", drafter)
    target.feature_layers = ()
    back = load_drafter(tmp_path / "d.pt", target)
    assert back.options.feature_layers == LAYERS and target.feature_layers == LAYERS
    torch.testing.assert_close(back.fuse.weight, drafter.fuse.weight)
    plain = Drafter.from_target(target)  # an EAGLE-1 drafter resets the target to h_t alone
    assert plain.fuse is None and target.feature_layers == ()


@pytest.mark.parametrize("layers, needle", [
    ([2, 0], "increasing"), ([-1], "increasing"), ([1, 1], "increasing"), ("0", "increasing"), ([True], "increasing"),
])
def test_bad_layer_lists(layers, needle):
    with pytest.raises(UserError, match=needle):
        DrafterParams(feature_layers=layers)
    with pytest.raises(UserError, match=needle):
        DrafterOptions(feature_layers=layers)


def test_a_layer_at_or_past_the_last_is_refused():
    with pytest.raises(UserError, match=r"below the target's last layer \(3: .* e\.g\. \[0, 1, 2\]"):
        Drafter.from_target(four_layers(), DrafterOptions(feature_layers=(1, 3)))
    with pytest.raises(UserError, match=r"or \[\] \(it has no layer below its last\)"):
        check_feature_layers([0], 1)


def test_training_fuses_the_first_step_and_feeds_later_steps_predictions():
    target = four_layers()
    drafter = Drafter.from_target(target, DrafterOptions(feature_layers=LAYERS))
    x, feats, _ = target_states(target, torch.tensor([0, 1]), torch.randint(0, 16, (2, 15)))
    emb = drafter.inputs(x[:, :1], torch.randint(0, 16, (2, 15)))
    one, two = unrolled(drafter, emb, feats[:, :-1], None, 2)
    torch.testing.assert_close(one, drafter(emb, drafter.fused(feats[:, :-1])))
    assert two.shape == (2, one.shape[1] - 1, 32)
    losses = drafter_losses(drafter, target, torch.tensor([0, 1]), torch.randint(0, 16, (2, 15)), unroll=2)
    assert {"reg", "reg_2", "accept", "accept_2"} <= set(losses) and all(v.isfinite() for v in losses.values())
    losses["reg"].backward()
    assert drafter.fuse.weight.grad is not None and drafter.fuse.weight.grad.abs().sum() > 0


def test_a_fused_batch_decodes_as_its_images_do_alone(trained_fused):
    target, drafter = copy.deepcopy(trained_fused)
    target, drafter = target.double(), drafter.double()  # batched and one-by-one matmuls round alike in float64
    assert target.feature_layers == LAYERS
    params, cond = SamplingParams(cfg_scale=2.0), torch.arange(4)
    want, want_stats = one_by_one(target, drafter, cond, params, AcceptRule(), Chain(3), gens(4))
    got, stats = decode(target, drafter, cond, params, AcceptRule(), Chain(3), gens(4))
    assert_same_decodes(got, stats, want, want_stats, target.args.image_tokens)


def test_exact_sampling_with_a_fused_drafter_reproduces_the_target_distribution():
    V, N, n = 3, 4, 700
    target = tiny_target(scale=4.0, vocab_size=V, image_tokens=N, num_classes=2, n_layer=3)
    drafter = Drafter.from_target(target, DrafterOptions(feature_layers=(0, 1))).eval()
    torch.nn.init.normal_(drafter.fuse.weight, std=0.3)  # the layers move the drafts; a poor drafter rejects often
    params = SamplingParams(cfg_scale=2.0, top_k=2)
    seqs, joint = exact_joint(target, 1, params, V, N)
    index = {tuple(s): i for i, s in enumerate(seqs.tolist())}
    counts = torch.zeros(len(seqs), dtype=torch.float64)
    accepted = rejected = 0
    for i in range(n):
        tokens, s = decode_one(target, drafter, torch.tensor([1]), params, AcceptRule(), Chain(3), image_generator(11, i))
        counts[index[tuple(tokens.tolist())]] += 1
        accepted += s.accepted_total
        rejected += sum(a < 3 for a in s.accepted_per_step)
    assert accepted > n / 6 and rejected > n / 6
    assert chi_square_pvalue(joint, counts, n) > 1e-3
