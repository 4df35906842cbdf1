"""The authors' pipeline where it differs from ours (issue #29): greedy tie-breaking on dynamic trees, and the
target states at left-padded caption positions that their drafter reads.

The authors' greedy path (jadohu/LANTERN, EAGLE-2's evaluate_posterior) scores every retrieve row, one per leaf in
node order, by its accepted prefix and takes the first row of the longest; reimplemented here from that rule. Their
HF target's attention (modeling_llamagen_kv) is reimplemented below from its float masks.
"""
import math

import pytest
import torch

from lantern.engine.rules.acceptance import AcceptRule, greedy_accept
from lantern.engine.models.checkpoint import save_checkpoint
from lantern.engine.models.drafter import load_drafter
from lantern.engine.decoding.generate import cfg_rows
from lantern.engine.models.model import apply_rope
from lantern.engine.decoding.sampling import SamplingParams
from lantern.engine.decoding.tree_rounds import greedy_paths
from lantern.engine.decoding.trees import Draft, _block
from lantern.worlds.llamagen.convert import main as convert
from test_convert import authors_drafter, reference_logits, write_drafter_folder
from tiny import one_thread, tiny_target  # noqa: F401 (fixture)


def make_draft(tokens, parent, leaf_order=True):
    n = len(tokens)
    parent = torch.tensor(parent)
    depth = torch.ones(n, dtype=torch.long)
    anc = torch.eye(n, dtype=torch.bool)
    for i in range(n):
        if parent[i] >= 0:
            depth[i] = depth[parent[i]] + 1
            anc[i] |= anc[parent[i]]
    children = [[] for _ in range(n + 1)]
    for i, p in enumerate(parent.tolist()):
        children[p + 1].append(i)
    return Draft(tokens=torch.tensor(tokens), depth=depth, parent=parent, block=_block(anc), children=children,
                 leaf_order=leaf_order)


def authors_greedy(P, draft, table, rule):
    """evaluate_posterior's greedy branch over leaf-ordered retrieve rows: (accepted nodes, next distribution)."""
    n = len(draft.tokens)
    ok = greedy_accept(P[draft.parent + 1], draft.tokens, table, rule).tolist()
    noleaf = {p for p in draft.parent.tolist()}
    rows = []
    for i in range(n):  # leaves in node order, each row its path from y
        if i in noleaf:
            continue
        path, c = [], i
        while c >= 0:
            path.insert(0, c)
            c = int(draft.parent[c])
        rows.append(path)
    lengths = []
    for path in rows:
        a = 0
        while a < len(path) and ok[path[a]]:
            a += 1
        lengths.append(a)
    best = max(lengths)
    if best == 0:
        return [], P[0]
    row = rows[lengths.index(best)]  # argmax: the first row of the longest accepted prefix
    return row[:best], P[row[best - 1] + 1]


def ours_greedy(P, draft, table, rule):
    """The project's rule: the first node, in node order, among the deepest accepted."""
    ok = greedy_accept(P[draft.parent + 1], draft.tokens, table, rule).tolist()
    best, path = 0, []
    for i in range(len(draft.tokens)):
        chain, c = [], i
        while c >= 0:
            chain.insert(0, c)
            c = int(draft.parent[c])
        if all(ok[j] for j in chain) and len(chain) > best:
            best, path = len(chain), chain
    return path, (P[path[-1] + 1] if path else P[0])


def accept_greedy(P, draft, table, rule):
    """greedy_paths for one tree (a batch of one): (accepted nodes, next distribution)."""
    path, nxt = greedy_paths(P[None], [draft], table, rule)
    return path[0][path[0] >= 0].tolist(), nxt[0]


def four_node_case():
    """Two accepted first drafts (tokens 1 and 2) whose children (8 under 1, 9 under 2) are both rejected; the
    leaf under token 2 comes first in node order. After 1 the target's argmax is 6, after 2 it is 7."""
    V = 10
    table = torch.tensor([[(x + j) % V for j in range(1, V)] for x in range(V)])
    table[1, 0] = table[2, 0] = 3  # both borrow code 3's mass at the root
    table[1, 1], table[2, 1] = 2, 1  # (keep every row a permutation of the other codes)
    table[1, 2:] = torch.tensor([c for c in range(V) if c not in (1, 3, 2)])
    table[2, 2:] = torch.tensor([c for c in range(V) if c not in (2, 3, 1)])
    P = torch.full((5, V), 0.05)
    P[0] = torch.tensor([0.05, 0.2, 0.2, 0.25, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05])
    P[1, 6] = 0.55  # after node 0 (token 1)
    P[2, 7] = 0.55  # after node 1 (token 2)
    P = P / P.sum(-1, keepdim=True)
    draft = make_draft([1, 2, 9, 8], [-1, -1, 1, 0])
    return P, draft, table


@pytest.mark.parametrize("residual, want", [("reference", [2, 7]), ("bounded", [1, 6])])
def test_four_node_tie_break(residual, want):
    """The issue's case: the authors emit 2 -> 7, the project 1 -> 6; the same accepted length."""
    P, draft, table = four_node_case()
    rule = AcceptRule("lantern", delta=0.3, k=1, residual=residual)
    path, nxt = accept_greedy(P, draft, table, rule)
    assert draft.tokens[path].tolist() + [int(nxt.argmax())] == want
    a_path, a_next = authors_greedy(P, draft, table, rule)
    assert draft.tokens[a_path].tolist() + [int(a_next.argmax())] == [2, 7]
    # a static tree's rows are sorted paths: its ties stay ours under either residual
    static = make_draft([1, 2, 9, 8], [-1, -1, 1, 0], leaf_order=False)
    path, nxt = accept_greedy(P, static, table, rule)
    assert static.tokens[path].tolist() + [int(nxt.argmax())] == [1, 6]


def random_case(g, V=6, n=10):
    parent = [-1] + [int(torch.randint(-1, min(i, 4), (), generator=g)) for i in range(1, n)]  # bushy, shallow
    draft = make_draft(torch.randint(0, V, (n,), generator=g).tolist(), parent)
    P = torch.distributions.Dirichlet(torch.full((V,), 1.0)).sample((n + 1,))
    table = torch.stack([torch.tensor([c for c in torch.randperm(V, generator=g).tolist() if c != x])
                         for x in range(V)])
    return P, draft, table


def test_random_trees_follow_the_authors_rows_under_reference():
    """On random trees: `reference` picks exactly the authors' row, `bounded` the first deepest node; they differ
    in some cases (so the test could fail) and never in the accepted length."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    differ = 0
    for _ in range(400):
        P, draft, table = random_case(g)
        ref = AcceptRule("lantern", delta=0.5, k=3, residual="reference")
        bnd = AcceptRule("lantern", delta=0.5, k=3, residual="bounded")
        got, nxt = accept_greedy(P, draft, table, ref)
        want, want_next = authors_greedy(P, draft, table, ref)
        assert got == want and torch.equal(nxt, want_next)
        ours, ours_next = accept_greedy(P, draft, table, bnd)
        o_path, o_next = ours_greedy(P, draft, table, bnd)
        assert ours == o_path and torch.equal(ours_next, o_next)
        assert len(ours) == len(got)
        differ += ours != got
    assert 20 <= differ < 400


# -- padded caption positions ---------------------------------------------------------------------------------------
def authors_prefill(target, x, cond_mask):
    """Their HF target over the condition positions: a causal float mask built in fp32 and a padding float mask in
    the model's dtype, each finfo.min where a key is hidden, added to the scores; softmax in fp32, cast back."""
    B, T, D = x.shape
    H, hd, dtype = target.args.n_head, target.args.head_dim, x.dtype
    causal = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)
    inverted = 1.0 - cond_mask[:, None, None, :].to(dtype)
    padding = inverted.masked_fill(inverted.bool(), torch.finfo(dtype).min)
    float_mask = padding + causal  # promoted to fp32
    rope = target.rope[:T]
    h = x
    for layer in target.layers:
        q, k, v = layer.attention.wqkv(layer.attention_norm(h)).split(D, dim=-1)
        q = apply_rope(q.view(B, T, H, hd), rope).transpose(1, 2)
        k = apply_rope(k.view(B, T, H, hd), rope).transpose(1, 2)
        v = v.view(B, T, H, hd).transpose(1, 2)
        scores = q @ k.transpose(2, 3) / math.sqrt(hd)
        weights = torch.softmax(scores + float_mask, dim=-1, dtype=torch.float32).to(dtype)
        h = h + layer.attention.wo((weights @ v).transpose(1, 2).reshape(B, T, D))
        h = h + layer.feed_forward(layer.ffn_norm(h))
    return target.norm(h)


MASK = torch.tensor([[0, 0, 0, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)  # left-padded captions


def ours_prefill(target, semantics, cond, cond_mask, params):
    rows, rows_mask = cfg_rows(target, cond, params, cond_mask)
    target.pad_semantics = semantics
    target.setup_cache(rows.shape[0])
    target.set_cond_mask(rows_mask)
    cond_emb = target.embed_cond(rows)
    _, hidden = target.prefill_cond(cond_emb, rows_mask)
    target.clear_cache()
    return cond_emb, hidden, rows_mask


def captions(target, dtype):
    """Caption features as LlamaGen's T5 gives them: zero at padded positions."""
    g = torch.Generator().manual_seed(4)
    feats = torch.randn(len(MASK), target.args.cls_token_num, target.args.caption_dim, generator=g)
    return (feats * MASK[..., None]).to(dtype)


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@torch.no_grad()
def test_padded_positions_get_the_authors_states(dtype, atol):
    """Under pad_semantics authors the target states at every condition position (cond and uncond rows, padded or
    not) equal their HF target's; upstream's differ at padded positions of the uncond row (and in fp32 the cond
    row's too), and nowhere else."""
    target = tiny_target("t2i", seed=2).to(dtype)
    target.cls_embedding.uncond_embedding.normal_(generator=torch.Generator().manual_seed(5))
    params = SamplingParams(cfg_scale=4.0)
    cond_emb, got, rows_mask = ours_prefill(target, "authors", captions(target, dtype), MASK, params)
    want = authors_prefill(target, cond_emb, rows_mask)
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=atol)
    _, upstream, _ = ours_prefill(target, "upstream", captions(target, dtype), MASK, params)
    valid = rows_mask[..., None].expand_as(got)
    torch.testing.assert_close(upstream[valid].float(), want[valid].float(), atol=atol, rtol=atol)  # as upstream
    uncond_padded = (~rows_mask)[len(MASK):].clone()
    if dtype == torch.bfloat16:  # position 0 sees only itself under both rules
        uncond_padded[:, 0] = False
    gap = (upstream[len(MASK):] - want[len(MASK):]).float().abs().amax(-1)[uncond_padded]
    assert len(gap) >= 2 and gap.min() > 20 * atol, gap  # the padded uncond states do differ (this could fail)
    cond_gap = (upstream[: len(MASK)] - want[: len(MASK)]).float().abs().amax(-1)[~rows_mask[: len(MASK)]]
    if dtype == torch.bfloat16:  # zero captions average to zero: the cond rows agree
        assert cond_gap.max() == 0
    else:  # fp32: their padded rows also take in the later valid keys
        assert cond_gap.min() > 20 * atol


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-4), (torch.bfloat16, 0.3)])
@torch.no_grad()
def test_converted_drafter_drafts_what_it_drafts_on_the_authors_side(tmp_path, dtype, atol):
    """The authors' drafter (their layout, converted) fed our target's states under pad_semantics authors gives
    the logits their drafter gives on their target's states, at every condition position and the first image
    token, cond and uncond rows, and the same CFG-mixed draft; fed upstream's states it does not. The states come
    from a target in `dtype` (the mask rule is the dtype's); the drafter runs in fp32 on both sides."""
    import copy

    target = tiny_target("t2i", seed=1)
    target.cls_embedding.uncond_embedding.normal_(generator=torch.Generator().manual_seed(5))
    save_checkpoint(tmp_path / "gpt.pt", target, args=target.args.to_dict())
    weights = authors_drafter(target)
    src = write_drafter_folder(tmp_path / "eagle", weights, target)
    convert(["--kind", "drafter", "--src", str(src), "--out", str(tmp_path / "d.pt"), "--target", str(tmp_path / "gpt.pt")])
    drafter = load_drafter(tmp_path / "d.pt", target)
    states = copy.deepcopy(target).to(dtype)
    params = SamplingParams(cfg_scale=4.0)
    first = torch.tensor([7])

    def drafts(semantics):
        cond_emb, hidden, rows_mask = ours_prefill(states, semantics, captions(states, dtype), MASK, params)
        R = cond_emb.shape[0]
        drafter.setup_cache(R, cond_mask=rows_mask)  # as speculative_prefill does
        emb = torch.cat([drafter.cond_inputs(cond_emb.float()), drafter.embed_tokens(first.expand(R))[:, None]], 1)
        out = drafter.head(drafter.step(emb, hidden.float(), 0))
        drafter.clear_cache()
        return out, cond_emb, rows_mask

    got, cond_emb, rows_mask = drafts("authors")
    h = authors_prefill(states, cond_emb, rows_mask).float()
    want = reference_logits(weights, target, h, first.expand(h.shape[0])[:, None])
    torch.testing.assert_close(got, want, atol=atol, rtol=atol)
    n = len(MASK)
    mixed = lambda lg: lg[n:] + (lg[:n] - lg[n:]) * params.cfg_scale  # noqa: E731 - the CFG mix of drafting
    assert torch.equal(mixed(got)[:, -1].argmax(-1), mixed(want)[:, -1].argmax(-1))
    upstream, _, _ = drafts("upstream")
    print(f"{dtype}: max |logit| gap authors-side vs ours {float((got - want).abs().amax()):.3g}, "
          f"vs upstream states {float((upstream - want).abs().amax()):.3g}")
    assert (upstream - want).abs().amax() > 10 * atol


def test_pad_semantics_default_follows_the_drafter(tmp_path):
    """auto: the authors' semantics with a drafter converted from theirs, upstream's with ours or none."""
    from lantern.engine.models.drafter import Drafter, save_drafter
    from lantern.pipeline.sample import resolve_pad_semantics

    target = tiny_target("t2i")
    save_checkpoint(tmp_path / "gpt.pt", target, args=target.args.to_dict())
    src = write_drafter_folder(tmp_path / "eagle", authors_drafter(target), target)
    convert(["--kind", "drafter", "--src", str(src), "--out", str(tmp_path / "theirs.pt"), "--target",
             str(tmp_path / "gpt.pt")])
    save_drafter(tmp_path / "ours.pt", Drafter.from_target(target))
    assert resolve_pad_semantics("auto", str(tmp_path / "theirs.pt")) == "authors"
    assert resolve_pad_semantics("auto", str(tmp_path / "ours.pt")) == "upstream"
    assert resolve_pad_semantics("auto", None) == "upstream"
    assert resolve_pad_semantics("upstream", str(tmp_path / "theirs.pt")) == "upstream"


def test_batched_greedy_follows_the_references_tree_by_tree():
    """greedy_paths over a ragged batch of random trees (float64, padded to the largest) gives every tree the path
    and next distribution of the pure references, under both tie-breaks and on static (sorted-row) trees too."""
    torch.manual_seed(2)
    g = torch.Generator().manual_seed(2)
    for trial in range(60):
        cases = [random_case(g, n=int(torch.randint(1, 12, (), generator=g))) for _ in range(5)]
        table = cases[0][2]
        leaf_order = trial % 3 != 0
        drafts = [Draft(**{**d.__dict__, "leaf_order": leaf_order}) for _, d, _ in cases]
        M = max(len(d.tokens) for d in drafts)
        P = torch.stack([torch.cat([p, torch.full((M - len(d.tokens), p.shape[1]), 0.5)])
                         for (p, _, _), d in zip(cases, drafts)]).double()
        for residual in ("reference", "bounded"):
            rule = AcceptRule("lantern", delta=0.5, k=3, residual=residual)
            paths, nxt = greedy_paths(P, drafts, table, rule)
            for i, d in enumerate(drafts):
                ref = authors_greedy if residual == "reference" and leaf_order else ours_greedy
                want, want_next = ref(P[i, : 1 + len(d.tokens)], d, table, rule)
                assert paths[i][paths[i] >= 0].tolist() == want and torch.equal(nxt[i], want_next)
