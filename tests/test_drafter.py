import pytest
import torch
import torch.nn as nn

from lantern.engine.models.drafter import Drafter, load_drafter, save_drafter, target_states
from lantern.pipeline.train_drafter import DrafterParams, drafter_losses, main, train_drafter
from lantern.errors import UserError
from tiny import one_thread, tiny_target  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_architecture_is_eagle_one():
    target = tiny_target()
    d = Drafter.from_target(target)
    assert d.fc.in_features == 64 and d.fc.out_features == 32 and d.fc.bias is not None
    assert isinstance(d.layer.attention_norm, nn.Identity)  # no input norm
    norms = [m for m in d.modules() if type(m).__name__ == "RMSNorm"]
    assert norms == [d.layer.ffn_norm]  # the FFN's pre-norm is the only one: no input norm, no final norm
    assert torch.equal(d.tok_embeddings.weight, target.tok_embeddings.weight)
    assert torch.equal(d.output.weight, target.output.weight)
    assert not d.tok_embeddings.weight.requires_grad and not d.output.weight.requires_grad
    assert set(d.trained_state()) == {k for k in d.state_dict() if k.startswith(("fc.", "layer."))}


@torch.no_grad()
def test_target_states_agree_with_gpt_forward():
    for kind in ("c2i", "t2i"):
        target = tiny_target(kind)
        T = target.args.cls_token_num
        cond = torch.tensor([1, 4]) if kind == "c2i" else torch.randn(2, T, 12)
        mask = None if kind == "c2i" else torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
        tokens = torch.randint(0, 16, (2, 15))
        x, h, logits = target_states(target, cond, tokens, mask)
        want_logits, want_h = target(cond, tokens, cond_mask=mask)
        assert x.shape == (2, T + 15, 32)
        torch.testing.assert_close(logits[:, T - 1 :], want_logits)
        torch.testing.assert_close(h[:, T - 1 :], want_h)


def drafting_case(kind):
    """A tiny target's drafter whose attention matters, and one teacher-forced sequence of 15 image tokens (t2i: a
    left-padded caption): (drafter, T, condition mask, target inputs x, target states h)."""
    target = tiny_target(kind)
    d = Drafter.from_target(target).eval()
    torch.nn.init.normal_(d.layer.attention.wo.weight, std=0.3)  # make attention matter
    T = target.args.cls_token_num
    cond = torch.tensor([2]) if kind == "c2i" else torch.randn(1, T, 12)
    mask = None if kind == "c2i" else torch.tensor([[0, 1, 1, 1, 1]], dtype=torch.bool)
    x, h, _ = target_states(target, cond, torch.randint(0, 16, (1, 15)), mask)
    return d, T, mask, x, h


@pytest.mark.parametrize("kind", ["c2i", "t2i"])
@torch.no_grad()
def test_cached_drafting_matches_the_uncached_pass(kind):
    d, T, mask, x, h = drafting_case(kind)
    from lantern.engine.models.drafter import drafter_mask

    full = d(x[:, 1:], h[:, :-1], drafter_mask(mask, x.shape[1] - 1))
    d.setup_cache(1, cond_mask=mask)
    parts, s = [], 0
    for n in (T, 3, 1, 4, 2, 4):  # catch-up blocks of varied length, as speculative rounds produce them
        parts.append(d.step(x[:, 1 + s : 1 + s + n], h[:, s : s + n], s))
        s += n
    d.clear_cache()
    cached = torch.cat(parts, 1)
    torch.testing.assert_close(cached[:, T - 1 :], full[:, T - 1 :], atol=1e-5, rtol=1e-5)


def self_data(target, n=192):
    from lantern.pipeline.train_drafter import self_generate

    labels = torch.arange(n) % target.args.num_classes
    return self_generate(target, labels, {"temperature": 1.0}, seed=0), labels


def test_training_learns_and_mixes_null_rows(monkeypatch):
    target = tiny_target()
    tokens, labels = self_data(target)
    seen = []
    import lantern.pipeline.train_drafter as mod

    real = mod.drafter_losses

    def spy(drafter, target, cond, *a, **kw):
        seen.append(cond.clone())
        return real(drafter, target, cond, *a, **kw)

    monkeypatch.setattr(mod, "drafter_losses", spy)
    params = DrafterParams(epochs=4, batch_size=32, lr=3e-3, val_frac=0.1)
    d, metrics = train_drafter(target, tokens, labels, params)
    hist = metrics["history"]
    assert metrics["n_val"] == 19 and metrics["n_train"] == 173
    assert hist[-1]["val_loss"] < hist[0]["val_loss"] and hist[-1]["val_top1"] > 0.5
    null = target.args.num_classes
    train_conds = torch.cat(seen[:6])  # the first epoch's ceil(173 / 32) = 6 training batches
    share = (train_conds == null).float().mean().item()
    assert 0.02 < share < 0.3  # class_dropout_prob = 0.1
    assert not d.training


def test_cosine_schedule_runs_from_lr_to_its_floor(monkeypatch):
    from lantern.pipeline.train_drafter import learning_rate

    constant = DrafterParams(lr=1e-3)
    assert [learning_rate(constant, s, 10) for s in (0, 5, 9)] == [1e-3] * 3
    cosine = DrafterParams(lr=1e-3, lr_schedule="cosine", lr_floor=0.1)
    curve = [learning_rate(cosine, s, 11) for s in range(11)]
    assert curve[0] == pytest.approx(1e-3) and curve[5] == pytest.approx(0.55e-3) and curve[-1] == pytest.approx(1e-4)
    assert all(a > b for a, b in zip(curve, curve[1:]))

    seen = []  # the lr each optimizer step was taken with
    real_step = torch.optim.AdamW.step

    def spy(opt, *a, **kw):
        seen.append(opt.param_groups[0]["lr"])
        return real_step(opt, *a, **kw)

    monkeypatch.setattr(torch.optim.AdamW, "step", spy)
    target = tiny_target()
    tokens, labels = self_data(target, n=40)
    params = DrafterParams(epochs=2, batch_size=16, lr=2e-3, lr_schedule="cosine", val_frac=0.1)
    train_drafter(target, tokens, labels, params)
    assert len(seen) == 6  # 2 epochs of ceil(36 / 16) = 3 batches
    assert seen == pytest.approx([learning_rate(params, s, 6) for s in range(6)]) and seen[-1] == 0.0


def test_losses_are_the_eagle_objective():
    target = tiny_target()
    d = Drafter.from_target(target)
    cond, tokens = torch.tensor([0, 1]), torch.randint(0, 16, (2, 15))
    out = drafter_losses(d, target, cond, tokens)
    x, h, logits = target_states(target, cond, tokens)
    pred = d(x[:, 1:], h[:, :-1])
    want_reg = torch.nn.functional.smooth_l1_loss(pred, h[:, 1:])
    want_ce = -(logits[:, 1:].softmax(-1) * d.head(pred).log_softmax(-1)).sum(-1).mean()
    torch.testing.assert_close(out["reg"], want_reg)
    torch.testing.assert_close(out["ce"], want_ce)


def test_save_load_roundtrip_and_wrong_target(tmp_path):
    target = tiny_target()
    d = Drafter.from_target(target)
    torch.nn.init.normal_(d.fc.weight)
    save_drafter(tmp_path / "d.pt", d, DrafterParams(epochs=1))
    back = load_drafter(tmp_path / "d.pt", target)
    x, h = torch.randn(1, 5, 32), torch.randn(1, 5, 32)
    torch.testing.assert_close(back(x, h), d.eval()(x, h))
    assert "tok_embeddings.weight" not in torch.load(tmp_path / "d.pt", weights_only=True)["drafter"]
    for other in (tiny_target(dim=64, n_head=4), tiny_target(vocab_size=20), tiny_target(image_tokens=9)):
        with pytest.raises(UserError, match="trained for a target"):
            load_drafter(tmp_path / "d.pt", other)
    torch.save({"model": {}}, tmp_path / "gpt.pt")
    with pytest.raises(UserError, match="not a drafter checkpoint"):
        load_drafter(tmp_path / "gpt.pt", target)


@pytest.mark.parametrize("kw, needle", [
    (dict(data="synthetic"), "real, self or both"),
    (dict(data="self"), "n_self"),
    (dict(val_frac=1.5), "val_frac"),
    (dict(epochs=0), "positive"),
    (dict(lr_schedule="linear"), "constant or cosine"),
    (dict(lr_floor=1.5), "lr_floor"),
    (dict(unroll=0), "unroll=0 must be an integer >= 1"),
    (dict(unroll=1.5), "unroll=1.5 must be"),
])
def test_bad_params(kw, needle):
    with pytest.raises(UserError, match=needle):
        DrafterParams(**kw)


def test_cli(tmp_path, capsys):
    from lantern.engine.models.checkpoint import save_checkpoint

    target = tiny_target()
    save_checkpoint(tmp_path / "gpt.pt", target, args=target.args.to_dict())
    tokens, labels = self_data(target, n=40)
    torch.save({"tokens": tokens, "labels": labels, "captions": [""] * 40}, tmp_path / "tok.pt")
    out = tmp_path / "drafter.pt"
    main(["--target", str(tmp_path / "gpt.pt"), "--tokens", str(tmp_path / "tok.pt"), "--out", str(out),
          "--device", "cpu", "--params", '{"epochs": 1, "batch_size": 16, "checkpoint_every": 1}'])
    assert "val top-1 agreement" in capsys.readouterr().out
    assert not (tmp_path / "drafter.pt.resume.pt").exists()  # checkpoints were written, and dropped once done
    obj = torch.load(out, weights_only=True)
    assert obj["params"]["epochs"] == 1 and obj["target_args"]["dim"] == 32 and len(obj["metrics"]["history"]) == 1
    load_drafter(out, target)

    base = ["--target", str(tmp_path / "gpt.pt"), "--out", str(tmp_path / "x.pt"), "--device", "cpu"]
    with pytest.raises(UserError, match="unknown"):
        main(base + ["--tokens", str(tmp_path / "tok.pt"), "--params", '{"epoch": 1}'])
    with pytest.raises(UserError, match="needs --tokens"):
        main(base)
    torch.save({"tokens": tokens[:, :9], "labels": labels}, tmp_path / "short.pt")
    with pytest.raises(UserError, match="target makes 16"):
        main(base + ["--tokens", str(tmp_path / "short.pt")])
    assert not (tmp_path / "x.pt").exists()
    main(base + ["--params", '{"data": "self", "n_self": 24, "epochs": 1, "unroll": 2}'])
    history = torch.load(tmp_path / "x.pt", weights_only=True)["metrics"]["history"]
    assert 0 < history[0]["val_accept_2"] < 1 and history[0]["val_loss"] > history[0]["val_reg"]


@pytest.mark.parametrize("kind", ["c2i", "t2i"])
@torch.no_grad()
def test_unrolled_steps_match_cached_chain_drafting(kind):
    """Training's unrolled chain steps compute what decoding computes: a catch-up over the true states up to c,
    then steps fed the drafter's own predictions at c + 1, c + 2 through the cache."""
    from lantern.engine.models.drafter import drafter_mask
    from lantern.pipeline.train_drafter import unrolled

    d, T, mask, x, h = drafting_case(kind)
    emb, S = x[:, 1:], x.shape[1] - 1
    preds = unrolled(d, emb, h[:, :-1], drafter_mask(mask, S), 3)
    assert [p.shape[1] for p in preds] == [S, S - 1, S - 2]
    for c in (T - 1, T + 3, S - 3):
        d.setup_cache(1, cond_mask=mask)
        last = d.step(emb[:, : c + 1], h[:, : c + 1], 0)[:, -1:]
        for s in (1, 2):  # step s + 1 at position c + s: stream s's index c
            last = d.step(emb[:, c + s : c + s + 1], last, c + s)
            torch.testing.assert_close(last[:, 0], preds[s][:, c], atol=1e-5, rtol=1e-5)
        d.clear_cache()
    # a second step never sees a true state past its catch-up: the state at position 8 moves the step at 9 (index
    # 8, fed the catch-up's prediction there), none before it
    h2 = h.clone()
    h2[:, 8] += 1.0
    moved = unrolled(d, emb, h2[:, :-1], drafter_mask(mask, S), 2)[1]
    torch.testing.assert_close(moved[:, :8], preds[1][:, :8])
    assert not torch.allclose(moved[:, 8], preds[1][:, 8])


def test_unrolled_training_reports_each_step():
    from lantern.pipeline.train_drafter import total_loss

    target = tiny_target()
    d = Drafter.from_target(target)
    tokens = torch.randint(0, 16, (3, 15))
    one = drafter_losses(d, target, torch.tensor([0, 1, 2]), tokens)
    two = drafter_losses(d, target, torch.tensor([0, 1, 2]), tokens, unroll=2)
    assert set(two) == set(one) | {"reg_2", "ce_2", "top1_2", "accept_2"}
    for k in one:
        torch.testing.assert_close(two[k], one[k])  # step 1 is the EAGLE-1 objective either way
    torch.testing.assert_close(total_loss(two, 0.1), one["reg"] + 0.1 * one["ce"] + two["reg_2"] + 0.1 * two["ce_2"])
