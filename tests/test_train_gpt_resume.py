"""Target training (lantern train-gpt) resumes from its last checkpoint with the weights of an uninterrupted run
(CPU, one thread in both runs); a foreign checkpoint is ignored; a bad checkpoint_every is refused."""
import pytest
import torch

from lantern.errors import UserError
from lantern.worlds.toy import train_gpt as module
from lantern.worlds.toy.train_gpt import GPTParams, train
from tiny import one_thread  # noqa: F401 (fixture)

PARAMS = dict(dim=32, n_layer=1, n_head=2, num_classes=4, steps=9, batch_size=4, eval_every=3, eval_batch=8,
              warmup_steps=2, checkpoint_every=4)


def tokens(n, seed):
    g = torch.Generator().manual_seed(seed)
    return {"tokens": torch.randint(16, (n, 16), generator=g), "labels": torch.arange(n) % 4, "codebook_size": 16}


class Killed(Exception):
    pass


def same_weights(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@pytest.mark.parametrize("die_at", [6, 9])
def test_a_resumed_run_ends_with_the_uninterrupted_weights(one_thread, tmp_path, monkeypatch, capsys, die_at):
    params, data, val = GPTParams(**PARAMS), tokens(40, 0), tokens(8, 1)
    want, want_log = train(params, data, val)
    path = tmp_path / "target.pt.resume.pt"
    real, calls = module.F.cross_entropy, []

    def dies(*a, **kw):  # the die_at-th training step's loss raises (validation calls pass)
        if kw.get("reduction") != "sum":
            calls.append(1)
            if len(calls) == die_at:
                raise Killed
        return real(*a, **kw)

    with monkeypatch.context() as m:
        m.setattr(module.F, "cross_entropy", dies)
        with pytest.raises(Killed):
            train(params, data, val, path)
    saved = torch.load(path, weights_only=False)
    assert saved["step"] == (die_at - 1) // 4 * 4
    got, log = train(params, data, val, path)
    assert f"resuming from {path} at step {saved['step']}" in capsys.readouterr().err
    assert same_weights(want, got)
    assert [h["val_loss"] for h in log["history"]] == [h["val_loss"] for h in want_log["history"]]


def test_a_foreign_checkpoint_is_ignored(one_thread, tmp_path, capsys):
    data, val, path = tokens(40, 0), tokens(8, 1), tmp_path / "t.resume.pt"
    params = GPTParams(**{**PARAMS, "steps": 5})
    train(params, data, val, path)  # leaves its step-4 checkpoint
    other, _ = train(GPTParams(**{**PARAMS, "steps": 5, "lr": 1e-3}), data, val, path)
    assert "another run's checkpoint" in capsys.readouterr().err
    fresh, _ = train(GPTParams(**{**PARAMS, "steps": 5, "lr": 1e-3}), data, val)
    assert same_weights(other, fresh)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_checkpoint_every_is_refused(bad):
    with pytest.raises(UserError, match="checkpoint_every"):
        GPTParams(checkpoint_every=bad)
