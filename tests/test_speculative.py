import pytest
import torch

from lantern.engine.rules.acceptance import AcceptRule
from lantern.engine.models.drafter import Drafter, save_drafter
from lantern.errors import UserError
from lantern.engine.decoding.generate import generate
from lantern.engine.decoding.sampling import SamplingParams, image_generator
from lantern.engine import methods
from lantern.engine.decoding.chain import Chain
from lantern.engine.decoding.speculative import decode
from tiny import chi_square_pvalue, decode_one, exact_joint, gens, one_thread, tiny_target, trained, trained_fused  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("pair", ["trained", "trained_fused"])  # EAGLE-1, and a drafter reading target layers
@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_greedy_speculative_equals_greedy_ar(pair, cfg, request):
    target, drafter = request.getfixturevalue(pair)
    params = SamplingParams(cfg_scale=cfg, greedy=True, top_k=8)
    cond = torch.arange(4)
    ar, _ = generate(target, cond, params, gens(4))
    accepted = 0
    for gamma in (1, 3, 6):
        sd, stats = decode(target, drafter, cond, params, AcceptRule(), Chain(gamma), gens(4))
        assert torch.equal(sd, ar)
        accepted += sum(s.accepted_total for s in stats)
    assert accepted > 20  # the accepted-prefix and bonus paths were exercised, not only corrections


def test_greedy_speculative_equals_greedy_ar_t2i():
    target = tiny_target("t2i")
    drafter = Drafter.from_target(target).eval()
    cond = torch.randn(2, 5, 12)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    params = SamplingParams(cfg_scale=2.0, greedy=True)
    ar, _ = generate(target, cond, params, gens(2), cond_mask=mask)
    sd, _ = decode(target, drafter, cond, params, AcceptRule(), Chain(3), gens(2), cond_mask=mask)
    assert torch.equal(sd, ar)


def test_stats_account_for_every_token(trained):
    target, drafter = trained
    params = SamplingParams(cfg_scale=2.0)
    for gamma in (2, 5):
        tokens, s = decode_one(target, drafter, torch.tensor([1]), params, AcceptRule(), Chain(gamma), gens(1)[0])
        assert tokens.shape == (16,) and s.n_tokens == 16
        assert s.target_forwards == 1 + len(s.accepted_per_step)
        assert s.accepted_total == sum(s.accepted_per_step)
        # prefill gives 1 token, a round a + 1 (the last round may end on its drafts, without a bonus)
        made = 1 + sum(a + 1 for a in s.accepted_per_step)
        assert made in (16, 17) and s.tau == 16 / s.target_forwards
        assert s.drafter_forwards >= len(s.accepted_per_step) and all(0 <= a <= gamma for a in s.accepted_per_step)
        assert s.time_draft_s > 0 and s.time_verify_s > 0 and s.time_other_s > 0


@pytest.mark.parametrize("V, top_k, n", [
    (3, 2, 700),
    pytest.param(4, 3, 3000, marks=pytest.mark.slow),
])
def test_exact_sampling_reproduces_the_target_distribution(V, top_k, n):
    N = 4
    target = tiny_target(scale=4.0, vocab_size=V, image_tokens=N, num_classes=2)
    drafter = Drafter.from_target(target).eval()
    torch.nn.init.normal_(drafter.fc.weight, std=0.3)  # a poor drafter: plenty of rejections too
    params = SamplingParams(cfg_scale=2.0, top_k=top_k)
    seqs, joint = exact_joint(target, 1, params, V, N)
    index = {tuple(s): i for i, s in enumerate(seqs.tolist())}
    counts = torch.zeros(len(seqs), dtype=torch.float64)
    accepted = rejected = 0
    for i in range(n):
        tokens, s = decode_one(target, drafter, torch.tensor([1]), params, AcceptRule(), Chain(3),
                                       image_generator(11, i))
        counts[index[tuple(tokens.tolist())]] += 1
        accepted += s.accepted_total
        rejected += sum(a < 3 for a in s.accepted_per_step)
    assert accepted > n / 6 and rejected > n / 6  # both paths ran often
    assert chi_square_pvalue(joint, counts, n) > 1e-3  # and nothing outside the top-k support


@pytest.mark.parametrize("greedy", [True, False])
def test_degenerate_relaxations_equal_exact(trained, greedy):
    target, drafter = trained
    params = SamplingParams(cfg_scale=2.0, greedy=greedy)
    table = torch.stack([torch.cat([torch.arange(i), torch.arange(i + 1, 16)]) for i in range(16)])
    cond = torch.arange(3)
    want, want_stats = decode(target, drafter, cond, params, AcceptRule(), Chain(4), gens(3))
    for rule in (AcceptRule("lantern", delta=0.0, k=5), AcceptRule("lantern", delta=0.3, k=0),
                 AcceptRule("lanternpp", lam=1.0, k=5)):
        got, stats = decode(target, drafter, cond, params, rule, Chain(4), gens(3), table=table)
        assert torch.equal(got, want)
        assert [s.accepted_per_step for s in stats] == [s.accepted_per_step for s in want_stats]


@pytest.mark.parametrize("greedy", [True, False])
def test_relaxation_lengthens_accepted_runs(trained, greedy):
    target, drafter = trained
    params = SamplingParams(cfg_scale=2.0, greedy=greedy)
    table = torch.stack([torch.roll(torch.arange(16), -i)[1:] for i in range(16)])
    cond = torch.arange(4).repeat(2)
    _, exact = decode(target, drafter, cond, params, AcceptRule(), Chain(4), gens(8))
    tau = lambda stats: sum(s.tau for s in stats) / len(stats)  # noqa: E731
    for rule in (AcceptRule("lantern", delta=0.4, k=15), AcceptRule("lantern", delta=0.4, k=14, residual="reference"),
                 AcceptRule("lanternpp", lam=20.0, k=15)):
        tokens, relaxed = decode(target, drafter, cond, params, rule, Chain(4), gens(8), table=table)
        assert tokens.shape == (8, 16) and tokens.min() >= 0 and tokens.max() < 16
        assert tau(relaxed) > tau(exact)


def test_relaxed_rule_needs_a_table(trained):
    target, drafter = trained
    with pytest.raises(UserError, match="neighbour table"):
        decode_one(target, drafter, torch.tensor([0]), SamplingParams(), AcceptRule("lantern", delta=0.1, k=3),
                           Chain(4), gens(1)[0])
    with pytest.raises(UserError, match="gamma"):
        Chain(0)


def test_rules_from_the_registry():
    assert methods.rule(methods.normalize({"name": "exact", "gamma": 4})) == AcceptRule()
    assert methods.rule(methods.normalize({"name": "lantern", "delta": 0.2, "k": 10, "residual": "reference"})) == \
        AcceptRule("lantern", delta=0.2, k=10, residual="reference")
    assert methods.rule(methods.normalize({"name": "lanternpp", "lam": 5, "k": 3})) == AcceptRule("lanternpp", lam=5.0, k=3)


def test_build_decoder(tmp_path, trained):
    from lantern.engine.rules.neighbours import build_table, NeighbourParams

    target, drafter = trained
    save_drafter(tmp_path / "d.pt", drafter)
    codebook = torch.randn(16, 4)
    torch.save({"model": {"quantize.embedding.weight": codebook}}, tmp_path / "vq.pt")
    torch.save(build_table(codebook, NeighbourParams(k=15)), tmp_path / "nb.pt")
    paths = dict(drafter_path=str(tmp_path / "d.pt"), neighbours_path=str(tmp_path / "nb.pt"),
                 vq_path=str(tmp_path / "vq.pt"), device=torch.device("cpu"))
    params = SamplingParams(cfg_scale=2.0)
    method = {"name": "lantern", "drafting": "chain", "gamma": 4, "delta": 0.1, "k": 10, "residual": "reference"}
    run = methods.build_decoder(method, params, target, **paths)
    tokens, (stats,) = run(torch.tensor([2]), [image_generator(0, 0)])
    assert tokens.shape == (1, 16) and stats.n_tokens == 16 and len(stats.tree_depth) == len(stats.accepted_per_step)
    # a batch goes through the chain's batched decoder: each image as decoded alone, batch size recorded
    batch, batch_stats = run(torch.tensor([2, 0, 1]), [image_generator(0, i) for i in range(3)])
    for i, c in enumerate((2, 0, 1)):
        assert torch.equal(batch[i], run(torch.tensor([c]), [image_generator(0, i)])[0][0])
    assert [s.batch_size for s in batch_stats] == [3, 3, 3] and stats.batch_size == 1
    with pytest.raises(UserError, match="drafting = 'zigzag' is not allowed"):
        methods.build_decoder({**method, "drafting": "zigzag"}, params, target, **paths)
    with pytest.raises(UserError, match="gamma = 0 must be >= 1"):
        methods.build_decoder({**method, "gamma": 0}, params, target, **paths)
    with pytest.raises(UserError, match="drafter"):
        methods.build_decoder(method, params, target, **{**paths, "drafter_path": None})
    with pytest.raises(UserError, match="stores k=15"):
        methods.build_decoder({**method, "k": 15}, params, target, **paths)  # the reference residual reads k + 1
