"""Which side of a replay is p and which is q (issue 42): under ``relevance: kl`` the map is
``KL(p_with ‖ p_without)``, so the evidence placement decides the direction. ``in_prompt``: the original
prompt carries the evidence (p), the prompt with the span cut is q; ``privileged``: the prompt with the
evidence appended is p, the original is q. Checked against plain forwards of each context (one unpadded
sequence, no cache), at a temperature other than 1, for both placements in one group and in one pass of
two groups; the reverse direction differs by far more than the tolerance on this model."""

import pytest
import torch

from credit_reference import plain_logits, relevance, render_ids, with_appended, without_span
from mrtpo.replay import ReplayGroup, batch_relevance, replay_completion
from mrtpo.testing import tiny_policy
from mrtpo.verifiers import Evidence, Example

SPAN, GOLD, HEADER = "Use the letter e.", "about cats", "Reference information for checking the answer:"
TEMPERATURE = 0.7


def messages(topic="cats"):
    return [
        {"role": "system", "content": f"Answer briefly. {SPAN}"},
        {"role": "user", "content": f"Tell me about {topic}."},
    ]


def completions(n=3, t=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(32, 127, (n, t), generator=generator)


def expected_maps(model, tok, msgs, rows, lengths, kind="kl"):
    """Per counterfactual (in_prompt, then privileged) and completion: the map from plain forwards, and
    the same map with p and q swapped."""
    original = msgs
    sides = {
        "in_prompt": (original, without_span(msgs, SPAN)),  # (with, without)
        "privileged": (with_appended(msgs, GOLD, HEADER), original),
    }
    out, reverse = torch.zeros(2, *rows.shape, dtype=torch.float64), torch.zeros(2, *rows.shape, dtype=torch.float64)
    for c, (with_msgs, without_msgs) in enumerate(sides.values()):
        for g, (ids, n) in enumerate(zip(rows.tolist(), lengths.tolist())):
            p = plain_logits(model, render_ids(tok, with_msgs), ids[:n])
            q = plain_logits(model, render_ids(tok, without_msgs), ids[:n])
            out[c, g, :n] = relevance(kind, p, q, ids[:n], TEMPERATURE)
            reverse[c, g, :n] = relevance(kind, q, p, ids[:n], TEMPERATURE)
    return out, reverse


@pytest.mark.parametrize("packed", [False, True])
def test_kl_direction_for_both_placements(packed):
    model, tok = tiny_policy(seed=0)
    rows, lengths = completions(), torch.tensor([6, 4, 5])
    msgs = messages()
    contexts = [
        render_ids(tok, msgs),
        render_ids(tok, without_span(msgs, SPAN)),
        render_ids(tok, with_appended(msgs, GOLD, HEADER)),
    ]
    result = batch_relevance(
        model,
        [ReplayGroup(contexts, ["in_prompt", "privileged"], rows, lengths)],
        kind="kl",
        temperature=TEMPERATURE,
        packed=packed,
    )[0]
    expected, reverse = expected_maps(model, tok, msgs, rows, lengths)
    torch.testing.assert_close(result.maps.double(), expected, atol=1e-5, rtol=1e-4)
    assert (expected - reverse).abs().amax(dim=(1, 2)).min() > 1e-2  # both placements: direction matters here


def test_kl_direction_when_two_groups_share_a_pass():
    """Groups in one pass keep their own sides: group 0 has the privileged evidence first, group 1 the
    in-prompt one first (the placements are read per counterfactual, not per pass)."""
    model, tok = tiny_policy(seed=0)
    a, b = messages("cats"), messages("rain")
    rows_a, rows_b = completions(2, 5, seed=1), completions(3, 6, seed=2)
    lengths_a, lengths_b = torch.tensor([5, 3]), torch.tensor([6, 6, 2])
    groups = [
        ReplayGroup(
            [
                render_ids(tok, a),
                render_ids(tok, with_appended(a, GOLD, HEADER)),
                render_ids(tok, without_span(a, SPAN)),
            ],
            ["privileged", "in_prompt"],
            rows_a,
            lengths_a,
        ),
        ReplayGroup(
            [
                render_ids(tok, b),
                render_ids(tok, without_span(b, SPAN)),
                render_ids(tok, with_appended(b, GOLD, HEADER)),
            ],
            ["in_prompt", "privileged"],
            rows_b,
            lengths_b,
        ),
    ]
    results = batch_relevance(model, groups, kind="kl", temperature=TEMPERATURE, groups_per_pass=None)
    expected_a, _ = expected_maps(model, tok, a, rows_a, lengths_a)
    expected_b, _ = expected_maps(model, tok, b, rows_b, lengths_b)
    torch.testing.assert_close(results[0].maps.double(), expected_a.flip(0), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(results[1].maps.double(), expected_b, atol=1e-5, rtol=1e-4)


def test_replay_completion_sides_follow_the_evidence():
    """The public one-completion replay (what ``mrtpo explain`` uses): the same directions, per reward."""
    model, tok = tiny_policy(seed=0)
    msgs = messages()
    example = Example(id="ex0", split="train", messages=msgs)
    ids = completions(1, 6)[0]
    result = replay_completion(
        model,
        tok,
        example,
        ids,
        [Evidence(SPAN, "in_prompt"), Evidence(GOLD, "privileged")],
        kind="kl",
        temperature=TEMPERATURE,
        header=HEADER,
    )
    expected, _ = expected_maps(model, tok, msgs, ids.unsqueeze(0), torch.tensor([6]))
    torch.testing.assert_close(result.relevance.double(), expected[:, 0], atol=1e-5, rtol=1e-4)
