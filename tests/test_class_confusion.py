"""benchmarks/class_confusion.py: the restricted Bayes accuracy and the most-separable class order behind the toy
world's CLASS_NAMES order."""

import torch

from conftest import benchmark_script

class_confusion = benchmark_script("class_confusion")


def confusable_scores() -> tuple[torch.Tensor, torch.Tensor]:
    """Four classes, 10 images each: 0 and 1 are told apart half of the time, 2 and 3 always."""
    labels = torch.arange(4).repeat_interleave(10)
    ll = torch.full((40, 4), -10.0)
    ll[torch.arange(40), labels] = 0.0
    swap = (labels < 2) & (torch.arange(40) % 2 == 1)
    ll[swap, 1 - labels[swap]] = 1.0  # the other of the confusable pair wins for every second image
    return ll, labels


def test_restricted_accuracy_counts_only_the_chosen_classes():
    ll, labels = confusable_scores()
    assert class_confusion.restricted_accuracy(ll, labels, [0, 1, 2, 3]) == 0.75
    assert class_confusion.restricted_accuracy(ll, labels, [2, 3]) == 1.0
    assert class_confusion.restricted_accuracy(ll, labels, [0, 2]) == 1.0  # 1 is not a guess any more
    assert class_confusion.restricted_accuracy(ll, labels, [0, 1]) == 0.5


def test_separable_order_puts_the_confusable_pair_last():
    ll, labels = confusable_scores()
    order = class_confusion.separable_order(ll, labels, subset=2)
    assert {c for c, _ in order[:2]} != {0, 1}
    assert [acc for _, acc in order[1:]] == sorted((acc for _, acc in order[1:]), reverse=True)
    assert order[-1][1] == 0.75 and sorted(c for c, _ in order) == [0, 1, 2, 3]
