import dataclasses
import math

import pytest
import torch
from PIL import Image

from lantern.metrics.ambiguity import AmbiguityParams, save_grid, step_stats, summarise
from lantern.engine.models.checkpoint import save_checkpoint
from lantern.errors import UserError
from lantern.engine.decoding.generate import cfg_rows, decode_one_token, duplicate_for_cfg, generate, prefill
from lantern.engine.decoding.sampling import SamplingParams, image_generator, logits_to_probs, mix_cfg
from lantern.engine.models.model import GPT, ModelArgs
from lantern.worlds.toy.train_vq import VQParams
from lantern.engine.models.vq import VQModel


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = GPT(ModelArgs(dim=32, n_layer=2, n_head=2, vocab_size=64, num_classes=4, image_tokens=16, multiple_of=32))
    with torch.no_grad():  # sharper than the 0.02-std init, so top-1 varies from step to step
        m.output.weight.mul_(40)
    return m.eval()


def cached_distributions(model, labels, tokens, sp):
    """The sampling distribution at every step along the decoding path the samplers use (KV cache)."""
    rows, _ = cfg_rows(model, labels, sp)
    model.setup_cache(rows.shape[0])
    logits, _ = prefill(model, rows)
    out = []
    for i in range(tokens.shape[1]):
        out.append(logits_to_probs(mix_cfg(logits, sp, i), sp))
        if i < tokens.shape[1] - 1:
            logits, _ = decode_one_token(model, duplicate_for_cfg(tokens[:, i], sp), model.args.cls_token_num + i)
    model.clear_cache()
    return torch.stack(out, 1)


@pytest.mark.parametrize("sp", [SamplingParams(), SamplingParams(cfg_scale=2.5, top_k=10)])
def test_teacher_forced_stats_equal_the_decoding_path(model, sp):
    labels = torch.tensor([0, 3, 1])
    tokens, _ = generate(model, labels, sp, [image_generator(7, i) for i in range(3)])
    top1, entropy = step_stats(model, labels, tokens, sp)
    with torch.no_grad():
        probs = cached_distributions(model, labels, tokens, sp)
    torch.testing.assert_close(top1, probs.max(-1).values, atol=1e-5, rtol=1e-4)
    ref_entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-4, rtol=1e-4)
    assert top1.std() > 0.01  # the check is not vacuous: distributions differ from step to step
    # every sampled token had positive probability under the measured distribution (top-k respected)
    assert (probs.gather(-1, tokens[..., None]) > 0).all()


def test_cfg_changes_the_measured_distribution(model):
    labels = torch.tensor([2, 2])
    tokens = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(0))
    t1, _ = step_stats(model, labels, tokens, SamplingParams())
    t4, _ = step_stats(model, labels, tokens, SamplingParams(cfg_scale=4.0))
    assert not torch.allclose(t1, t4)


def test_summary_numbers():
    top1 = torch.tensor([[0.1, 0.3], [0.15, 0.9]])
    entropy = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    s = summarise("heldout", 2.0, top1, entropy)
    assert s["mean_top1"] == pytest.approx(0.3625) and s["frac_top1_below_0.2"] == 0.5
    assert s["mean_entropy"] == 2.5 and s["steps"] == 4 and s["images"] == 2


def test_uniform_distribution_entropy(model):
    sp = SamplingParams(temperature=1e6)  # flattens every distribution to uniform
    top1, entropy = step_stats(model, torch.tensor([1]), torch.zeros(1, 16, dtype=torch.long), sp)
    torch.testing.assert_close(top1, torch.full_like(top1, 1 / 64), rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(entropy, torch.full_like(entropy, math.log(64)), rtol=1e-4, atol=1e-4)


def test_bad_params():
    with pytest.raises(UserError):
        AmbiguityParams(cfg_scales=[])
    with pytest.raises(UserError):
        AmbiguityParams(n_samples=0, n_heldout=0)


def test_sample_grid_puts_vq_reconstructions_beside_the_samples(tmp_path):
    torch.manual_seed(0)
    args = VQParams().vq_args()
    save_checkpoint(tmp_path / "vq.pt", VQModel(args).eval(), args=dataclasses.asdict(args))
    tokens, labels = torch.randint(0, 512, (6, 64)), torch.tensor([0, 1, 1, 0, 1, 1])
    blocks = {"reconstructions": (tokens, labels), 1.0: (tokens[:3], labels[:3]), 2.0: (tokens[3:], labels[3:])}
    save_grid(str(tmp_path / "vq.pt"), blocks, num_classes=2, path=str(tmp_path / "grid.png"), per_class=4)
    width, height = Image.open(tmp_path / "grid.png").size
    block = 4 * (32 + 1) + 1  # four 32-pixel images per row, 1-pixel padding
    assert height == 2 * (32 + 1) + 1 + 2 * 4 and width == 3 * block + 4 * 4  # three blocks, 4-pixel borders


def test_classifier_reads_every_rows_decoded_images_with_their_labels(tmp_path):
    """--classifier adds class_accuracy to each (source, CFG) row: a classifier that always says class 1 is right
    on exactly the rows' images labelled 1 (samples cycle through the classes; the held-out labels are given)."""
    import pandas as pd

    from lantern.metrics import ambiguity
    from lantern.metrics.classifier import ToyClassifier, save_classifier

    torch.manual_seed(0)
    args = VQParams().vq_args()
    save_checkpoint(tmp_path / "vq.pt", VQModel(args).eval(), args=dataclasses.asdict(args))
    gpt = GPT(ModelArgs(dim=32, n_layer=1, n_head=2, vocab_size=512, num_classes=2, image_tokens=64, multiple_of=32))
    save_checkpoint(tmp_path / "target.pt", gpt.eval(), args=gpt.args.to_dict())
    heldout_labels = torch.tensor([1, 1, 0, 1, 1, 1, 0, 1])  # 6 of 8 are class 1
    torch.save({"tokens": torch.randint(0, 512, (8, 64)), "labels": heldout_labels, "codebook_size": 512},
               tmp_path / "val_tokens.pt")
    net = ToyClassifier(num_classes=2, width=2)
    with torch.no_grad():
        net.head.weight.zero_()
        net.head.bias.copy_(torch.tensor([0.0, 1.0]))
    save_classifier(net, tmp_path / "classifier.pt")
    out = tmp_path / "ambiguity.csv"
    argv = ["--target", str(tmp_path / "target.pt"), "--heldout", str(tmp_path / "val_tokens.pt"), "--out", str(out),
            "--steps-out", str(tmp_path / "steps.csv"), "--vq", str(tmp_path / "vq.pt"),
            "--params", '{"cfg_scales": [1.0, 2.0], "n_samples": 6, "n_heldout": 8, "batch": 4}']
    ambiguity.main(argv + ["--classifier", str(tmp_path / "classifier.pt")])
    rows = pd.read_csv(out).set_index(["source", "cfg_scale"])
    assert rows.loc[("samples", 1.0), "class_accuracy"] == pytest.approx(0.5)  # labels 0 1 0 1 0 1
    assert rows.loc[("samples", 2.0), "class_accuracy"] == pytest.approx(0.5)
    assert rows.loc[("heldout", 1.0), "class_accuracy"] == pytest.approx(0.75)
    assert rows.loc[("heldout", 1.0), "class_accuracy_se"] == pytest.approx(math.sqrt(0.75 * 0.25 / 7))
    with pytest.raises(UserError, match="--vq"):
        ambiguity.main(argv[:-4] + argv[-2:] + ["--classifier", str(tmp_path / "classifier.pt")])
