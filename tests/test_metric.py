"""Eq. 3 on hand-built attention maps (docs/method.md section 2)."""

import torch

from lm_eval_sinkmask.metric import (column_mass, find_sinks, select_sinks, sink_scores,
                                     top_k_sinks, visible_rows)


def rows_to(weights):
    """An attention map whose every row is ``weights`` (normalised)."""
    w = torch.tensor(weights, dtype=torch.float32)
    return (w / w.sum()).expand(len(weights), -1).clone()


def scores_of(attn, query_valid=None, key_valid=None, visible=None):
    sq, sk = attn.shape[-2:]
    key_valid = torch.ones(sk, dtype=torch.bool) if key_valid is None else key_valid
    visible = torch.ones(sq, sk, dtype=torch.bool) if visible is None else visible
    return sink_scores(column_mass(attn, query_valid), visible_rows(visible, query_valid), key_valid)


def test_uniform_attention_scores_one_everywhere_and_has_no_sink():
    attn = torch.full((5, 5), 0.2)
    s = scores_of(attn)
    torch.testing.assert_close(s, torch.ones(5))
    assert not find_sinks(s, torch.ones(5, dtype=torch.bool), eps=0.0).any()


def test_scores_are_in_uniform_share_units_and_average_one():
    attn = rows_to([6, 1, 1, 1, 1])  # key 0 gets 0.6 of every row
    s = scores_of(attn)
    torch.testing.assert_close(s[0], torch.tensor(3.0))  # 5 keys * 0.6
    torch.testing.assert_close(s.mean(), torch.tensor(1.0))


def test_eps_threshold_is_strict_against_the_mean_of_the_others():
    s = torch.tensor([4.0, 1.0, 1.0, 1.0, 1.0])
    valid = torch.ones(5, dtype=torch.bool)
    assert find_sinks(s, valid, eps=2.9)[0]
    assert not find_sinks(s, valid, eps=3.0)[0]  # 4 > 1 + 3 is false
    assert find_sinks(s, valid, eps=0.0).tolist() == [True, False, False, False, False]


def test_eps_zero_flags_every_key_above_the_others_mean():
    s = torch.tensor([2.0, 1.5, 1.0, 0.5])  # others' means: 1.0, 1.17, 1.33, 1.5
    assert find_sinks(s, torch.ones(4, dtype=torch.bool), eps=0.0).tolist() == [
        True, True, False, False]


def test_negative_eps_admits_keys_just_below_the_others_mean_but_never_padding():
    s = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0])  # others' means over the four valid keys
    valid = torch.tensor([True, True, True, True, False])
    assert find_sinks(s, valid, eps=-0.5).tolist() == [True, True, True, False, False]


def test_padding_keys_and_queries_are_excluded():
    # keys 3, 4 are padding: rows never attend them; query rows 3, 4 are padding rows that
    # (as in LLaDA's bias-only masking) attend key 2 heavily: they must not count.
    attn = torch.zeros(5, 5)
    attn[:3, :3] = rows_to([4, 1, 1])
    attn[3:, 2] = 1.0
    key_valid = torch.tensor([True, True, True, False, False])
    query_valid = key_valid.clone()
    s = scores_of(attn, query_valid, key_valid)
    torch.testing.assert_close(s, torch.tensor([2.0, 0.5, 0.5, 0.0, 0.0]))  # |K| = 3
    sinks = find_sinks(s, key_valid, eps=1.0)
    assert sinks.tolist() == [True, False, False, False, False]


def test_fewer_sinks_than_k_selects_only_the_sinks():
    s = torch.tensor([[5.0, 0.5, 0.5, 2.9, 0.1]])
    sinks = torch.tensor([[True, False, False, True, False]])
    assert top_k_sinks(s, sinks, k=10).tolist() == sinks.tolist()
    assert top_k_sinks(s, sinks, k=1).tolist() == [[True, False, False, False, False]]
    assert not top_k_sinks(s, sinks, k=0).any()


def test_a_higher_scoring_key_that_is_not_a_sink_takes_no_slot():
    """Under sink_token=exclude the excluded token is the highest-scoring key but no
    candidate: it must not take one of the k slots (and leave a sink unmasked)."""
    s = torch.tensor([9.0, 4.0, 1.0])
    assert top_k_sinks(s, torch.tensor([False, True, True]), k=1).tolist() == [False, True, False]


def test_ties_go_to_the_lower_position():
    s = torch.tensor([1.0, 4.0, 0.5, 4.0, 4.0])
    sinks = torch.tensor([False, True, False, True, True])
    assert top_k_sinks(s, sinks, k=2).tolist() == [False, True, False, True, False]
    # many ties (an unstable sort keeps a short row's order by luck, not a long one's)
    many = top_k_sinks(torch.full((3, 128), 2.0), torch.ones(3, 128, dtype=torch.bool), k=3)
    assert many.nonzero()[:, 1].tolist() == [0, 1, 2] * 3


def test_the_others_mean_runs_over_the_valid_keys_only():
    """Key 0's others are the three valid keys (mean 0.8): counting the padding key as a
    zero would give 0.6, and its score left in, 3.8."""
    s = torch.tensor([2.0, 1.0, 1.0, 0.4, 9.0])
    valid = torch.tensor([True, True, True, True, False])
    assert not find_sinks(s, valid, eps=1.3)[0]  # 2 > 0.8 + 1.3 is false; with 0.6 it is true
    assert find_sinks(s, valid, eps=-0.2).tolist() == [True, True, True, False, False]


def test_single_causal_row_scores_its_own_attention():
    # ARM last_row rule: one query row over 4 keys
    attn = torch.tensor([[0.7, 0.1, 0.1, 0.1]])
    s = scores_of(attn)
    torch.testing.assert_close(s, torch.tensor([2.8, 0.4, 0.4, 0.4]))
    assert find_sinks(s, torch.ones(4, dtype=torch.bool), eps=2.0).tolist() == [
        True, False, False, False]


def test_single_key_is_never_a_sink():
    assert not find_sinks(torch.tensor([1.0]), torch.tensor([True]), eps=0.0).any()


def test_all_rows_rule_normalises_each_key_by_the_rows_that_see_it():
    # causal 3x3: key 2 is seen by one row only; its one-row attention must not be diluted
    attn = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.2, 0.6]])
    visible = torch.ones(3, 3).tril().bool()
    s = scores_of(attn, visible=visible)
    expected = 3 * torch.tensor([(1.0 + 0.5 + 0.2) / 3, (0.5 + 0.2) / 2, 0.6])
    torch.testing.assert_close(s, expected)


def test_batch_elements_and_heads_find_their_own_sinks():
    b0h0 = rows_to([8, 1, 1, 1])
    b0h1 = rows_to([1, 1, 8, 1])
    b1h0 = rows_to([1, 8, 1, 1])
    b1h1 = rows_to([1, 1, 1, 1])
    attn = torch.stack([torch.stack([b0h0, b0h1]), torch.stack([b1h0, b1h1])])  # [2, 2, 4, 4]
    mass = column_mass(attn)
    rows = torch.full_like(mass, 4.0)
    key_valid = torch.ones(2, 4, dtype=torch.bool)
    _, sinks, chosen = select_sinks(mass, rows, key_valid, eps=1.0, k=1, per_layer=False)
    assert chosen[0, 0].tolist() == [True, False, False, False]
    assert chosen[0, 1].tolist() == [False, False, True, False]
    assert chosen[1, 0].tolist() == [False, True, False, False]
    assert not chosen[1, 1].any()  # uniform head: no sink
    # granularity=layer averages heads first: one decision per (batch element, layer)
    scores, _, per_layer = select_sinks(mass, rows, key_valid, eps=0.5, k=2, per_layer=True)
    assert per_layer.shape == (2, 1, 4)
    assert per_layer[0, 0].tolist() == [True, False, True, False]
    torch.testing.assert_close(scores.mean(-1), torch.ones(2, 1))


def test_padding_keys_are_never_sinks_however_low_eps_goes():
    # a padding key scores 0; an eps far enough below 0 admits every real key, never it
    s = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0])
    valid = torch.tensor([True, True, True, True, False])
    assert find_sinks(s, valid, eps=-100.0).tolist() == [True, True, True, True, False]


def test_select_sinks_is_bit_for_bit_the_public_functions_composed():
    """select_sinks skips work the public functions would redo (|K| counted twice, scores
    zeroed twice) and takes rows shared by the heads unexpanded (the mask's, counted once per
    pass by the intercept); what it returns must not change by a bit, padding and unseen keys
    included, at both granularities."""
    g = torch.Generator().manual_seed(0)
    B, H, S = 3, 4, 40
    mass = torch.rand(B, H, S, generator=g) * 3
    key_valid = torch.rand(B, S, generator=g) > 0.2
    key_valid[2] = False
    key_valid[2, 7] = True  # a single valid key: never a sink
    per_head = torch.randint(0, 6, (B, H, S), generator=g)  # 0: a key no row of Q sees
    shared = torch.randint(0, 6, (B, 1, S), generator=g)
    for rows in (per_head, shared):
        for per_layer in (False, True):
            full = rows.expand(B, H, S)
            m, r = (mass.mean(1, keepdim=True), full.amax(1, keepdim=True)) if per_layer else (mass, full)
            scores = sink_scores(m, r, key_valid[:, None])
            sinks = find_sinks(scores, key_valid[:, None], 0.1)
            got = select_sinks(mass, rows, key_valid, eps=0.1, k=3, per_layer=per_layer)
            want = (scores, sinks, top_k_sinks(scores, sinks, 3))
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
            assert got[1].any() and not got[1][2].any()
