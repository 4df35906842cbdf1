"""Drafter training resumes from its last checkpoint with the weights of an uninterrupted run (CPU, one thread in
both runs); a foreign checkpoint is ignored; CUDA trains under bf16 autocast, a CPU in fp32."""
import warnings

import pytest
import torch

from lantern.errors import UserError
from lantern.pipeline import train_drafter as module
from lantern.pipeline.train_drafter import DrafterParams, autocast, self_generate, train_drafter
from tiny import one_thread, tiny_target  # noqa: F401 (fixture)

PARAMS = dict(epochs=3, batch_size=8, lr=3e-3, checkpoint_every=4)  # 40 sequences: 5 steps an epoch, 15 in all


@pytest.fixture(scope="module")
def data(one_thread):
    target = tiny_target()
    labels = torch.arange(42) % 4
    return target, self_generate(target, labels, {"temperature": 1.0}, seed=0), labels


class Killed(Exception):
    pass


def interrupt_at(monkeypatch, step):
    """The job dies inside the step-th optimizer step's loss (after the checkpoints before it)."""
    real, calls = module.drafter_losses, []

    def losses(drafter, target, c, t, noise, m, unroll):
        if noise > 0:  # training batches only (validation runs without noise)
            calls.append(1)
            if len(calls) == step:
                raise Killed
        return real(drafter, target, c, t, noise, m, unroll)

    monkeypatch.setattr(module, "drafter_losses", losses)


def same_weights(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


# checkpoints mid-epoch (every 4 steps: the last one at step 4), or at an epoch's end before its validation (every
# 5 steps: the last one at step 10, the end of epoch 2)
@pytest.mark.parametrize("every, die_at", [(4, 7), (5, 12)])
def test_a_resumed_run_ends_with_the_uninterrupted_weights(data, tmp_path, monkeypatch, capsys, every, die_at):
    target, tokens, labels = data
    params = DrafterParams(**{**PARAMS, "checkpoint_every": every})
    want, want_log = train_drafter(target, tokens, labels, params)
    path = tmp_path / "d.pt.resume.pt"
    with monkeypatch.context() as m:
        interrupt_at(m, die_at)
        with pytest.raises(Killed):
            train_drafter(target, tokens, labels, params, resume=path)
    saved = torch.load(path, weights_only=True)
    assert saved["step"] == (die_at - 1) // every * every
    got, log = train_drafter(target, tokens, labels, params, resume=path)
    assert f"resuming from {path} at step {saved['step']}" in capsys.readouterr().err
    assert same_weights(got, want) and log == want_log


def test_a_checkpoint_of_another_run_is_ignored(data, tmp_path, monkeypatch, capsys):
    target, tokens, labels = data
    path = tmp_path / "d.pt.resume.pt"
    with monkeypatch.context() as m:
        interrupt_at(m, 6)
        with pytest.raises(Killed):
            train_drafter(target, tokens, labels, DrafterParams(**PARAMS), resume=path)
    other = DrafterParams(**{**PARAMS, "lr": 1e-3})
    got, _ = train_drafter(target, tokens, labels, other, resume=path)
    assert "another run's checkpoint" in capsys.readouterr().err
    assert same_weights(got, train_drafter(target, tokens, labels, other)[0])


def test_checkpoint_every_is_checked_and_autocast_is_cuda_only():
    with pytest.raises(UserError, match="checkpoint_every"):
        DrafterParams(checkpoint_every=-1)
    with pytest.raises(UserError, match="checkpoint_every"):
        DrafterParams(checkpoint_every=2.5)
    with autocast(torch.device("cpu")):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float32
    with warnings.catch_warnings():  # "CUDA is not available ... Disabling autocast" on a CPU machine
        warnings.simplefilter("ignore")
        cuda = autocast(torch.device("cuda"))
    assert isinstance(cuda, torch.autocast) and cuda.fast_dtype == torch.bfloat16
