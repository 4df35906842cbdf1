import pytest
import torch

from lantern.errors import UserError
from lantern.engine.decoding.generate import generate
from lantern.engine.decoding.sampling import SamplingParams, image_generator, image_seed, logits_to_probs
from tiny import sample_index
from lantern.engine.models.model import GPT, ModelArgs


def tiny_model(model_type="c2i"):
    kw = dict(dim=64, n_layer=2, n_head=4, vocab_size=50, num_classes=4, image_tokens=16, multiple_of=32)
    if model_type == "t2i":
        kw.update(model_type="t2i", cls_token_num=5, caption_dim=16)
    torch.manual_seed(0)
    return GPT(ModelArgs(**kw)).eval()


def gens(indices, seed=7):
    return [image_generator(seed, i) for i in indices]


@pytest.mark.parametrize("params", [
    SamplingParams(cfg_scale=2.0, temperature=1.0, top_k=20, top_p=0.9),
    SamplingParams(cfg_scale=1.0),
    SamplingParams(cfg_scale=3.0, cfg_interval=5),
])
def test_batch_of_four_equals_four_single_runs(params):
    model = tiny_model()
    cond = torch.tensor([0, 1, 2, 3])
    batch, stats = generate(model, cond, params, gens(range(4)))
    singles = [generate(model, cond[i : i + 1], params, gens([i]))[0] for i in range(4)]
    assert torch.equal(batch, torch.cat(singles))
    assert len(stats) == 4 and stats[0].target_forwards == 16 and stats[0].tau == 1.0


def test_t2i_generation_runs_and_is_deterministic():
    model = tiny_model("t2i")
    cond = torch.randn(2, 5, 16)
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    params = SamplingParams(cfg_scale=4.0)
    a, _ = generate(model, cond, params, gens(range(2)), cond_mask=mask)
    b, _ = generate(model, cond, params, gens(range(2)), cond_mask=mask)
    assert torch.equal(a, b) and a.shape == (2, 16)


def test_greedy_is_deterministic_and_ignores_seed():
    model = tiny_model()
    cond = torch.tensor([1, 2])
    params = SamplingParams(cfg_scale=2.0, greedy=True)
    a, _ = generate(model, cond, params, gens(range(2), seed=1))
    b, _ = generate(model, cond, params, gens(range(2), seed=2))
    assert torch.equal(a, b)


def test_seeds_depend_on_global_seed_and_index_only():
    assert image_seed(0, 5) == image_seed(0, 5)
    assert len({image_seed(0, i) for i in range(100)} | {image_seed(1, i) for i in range(100)}) == 200


def test_sample_index_follows_distribution_and_skips_zero_mass():
    p = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2])
    g = torch.Generator().manual_seed(0)
    draws = torch.tensor([sample_index(p, g) for _ in range(20000)])
    freq = torch.bincount(draws, minlength=5).float() / len(draws)
    assert freq[0] == 0 and freq[2] == 0
    torch.testing.assert_close(freq, p, atol=0.015, rtol=0)


def test_top_k_top_p_filtering():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    assert torch.count_nonzero(logits_to_probs(logits, SamplingParams(top_k=2))) == 2
    # top-p 0.5: keeps 0.4 and the token crossing the threshold (0.3)
    probs = logits_to_probs(logits, SamplingParams(top_p=0.5))
    torch.testing.assert_close(probs, torch.tensor([[4 / 7, 3 / 7, 0.0, 0.0]]))


def test_bad_sampling_params():
    with pytest.raises(UserError, match="cfg_scale"):
        SamplingParams(cfg_scale=0.5)
    with pytest.raises(UserError, match="temperature"):
        SamplingParams(temperature=0)
