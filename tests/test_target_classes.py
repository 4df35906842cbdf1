"""The target as a Bayes classifier over its own likelihoods (lantern ambiguity --stats-out): does it know the
classes apart from sampling?"""

import pytest
import torch

from lantern.engine.decoding.generate import generate
from lantern.engine.models.model import GPT, ModelArgs
from lantern.engine.decoding.sampling import SamplingParams, image_generator
from lantern.metrics.ambiguity import class_log_likelihoods, target_class_stats
from lantern.worlds.toy.train_gpt import validation_loss


def class_bound_model() -> GPT:
    """A random 4-class target with sharp next-token distributions (a scaled-up output layer), so that the class
    token's share of the hidden state gives each class its own token statistics."""
    torch.manual_seed(0)
    model = GPT(ModelArgs(dim=32, n_layer=2, n_head=2, vocab_size=16, num_classes=4, image_tokens=64,
                          multiple_of=32)).eval()
    with torch.no_grad():
        model.output.weight.mul_(20.0)
    return model


def own_samples(model: GPT, per_class: int) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.arange(model.args.num_classes).repeat_interleave(per_class)
    gens = [image_generator(3, i) for i in range(len(labels))]
    tokens, _ = generate(model, labels, SamplingParams(), gens)
    return tokens, labels


def test_the_own_class_column_is_the_validation_loss_per_image():
    model = class_bound_model()
    tokens, labels = own_samples(model, 4)
    ll = class_log_likelihoods(model, tokens, batch=5)
    assert ll.shape == (16, 5)  # 4 classes + the null class
    own = ll[torch.arange(16), labels]
    assert -own.sum().item() / tokens.numel() == pytest.approx(validation_loss(model, tokens, labels, 5), rel=1e-5)


def test_own_samples_are_classified_and_shuffled_labels_fall_to_chance():
    model = class_bound_model()
    tokens, labels = own_samples(model, 16)
    stats = target_class_stats(model, tokens, labels, batch=16)
    assert stats["target_class_probe_images"] == 64
    assert stats["target_class_accuracy"] >= 0.8  # chance 0.25
    assert stats["target_class_nats_over_null"] > 0
    shuffled = labels[torch.randperm(64, generator=torch.Generator().manual_seed(0))]
    wrong = target_class_stats(model, tokens, shuffled, batch=16)
    assert wrong["target_class_accuracy"] <= 0.5  # chance 0.25; the 0.25 expected from the shuffle's own matches
