"""Evidence replays on a tiny random model: counterfactual prompts, alignment, exact zeros."""

import pytest
import torch

from mrtpo.counterfactual import (
    EvidenceNotFoundError,
    append_privileged,
    counterfactual_prompt,
    default_render_prompt,
    prompt_renderer,
    remove_span,
)
from mrtpo.model_calls import completion_logits
from mrtpo.replay import replay_completion
from mrtpo.testing import tiny_policy
from mrtpo.verifiers import Evidence, Example

FORMAT = "Answer in one line."
KEYWORD = "Mention the word river."


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(seed=0)


def example():
    return Example(
        id="ex-1",
        split="train",
        messages=[
            {"role": "system", "content": f"You are helpful. {FORMAT}"},
            {"role": "user", "content": f"Describe a city. {KEYWORD} Keep it short."},
        ],
    )


def test_remove_span_exactly_once_and_tidy():
    assert remove_span("Be brief. Answer in one line. Thanks", FORMAT) == "Be brief. Thanks"
    assert remove_span("Intro\nAnswer in one line.\nEnd", FORMAT) == "Intro\nEnd"
    assert remove_span("Be brief. Answer in one line.", FORMAT) == "Be brief."
    with pytest.raises(EvidenceNotFoundError, match="verifier 'format' for example 'e7' does not occur"):
        remove_span("nothing here", FORMAT, verifier="format", example_id="e7")
    with pytest.raises(EvidenceNotFoundError, match="occurs 2 times"):
        remove_span(f"{FORMAT} {FORMAT}", FORMAT)


def test_privileged_goes_to_the_last_user_turn_only():
    msgs = example().messages
    out = append_privileged(msgs, "gold: 42", header="REF:")
    assert out[1]["content"].endswith("Keep it short.\n\nREF:\ngold: 42")
    assert out[0] == msgs[0] and msgs[1]["content"].endswith("Keep it short.")  # input untouched
    with pytest.raises(ValueError, match="user message"):
        append_privileged([{"role": "system", "content": "x"}], "gold")


def test_counterfactual_prompts(policy):
    _, tok = policy
    ex = example()
    render = prompt_renderer(object(), tok)
    original = render(ex)
    assert original == default_render_prompt(ex, tok) and FORMAT in original
    without_format = counterfactual_prompt(ex, [Evidence(FORMAT, "in_prompt")], render)
    assert FORMAT not in without_format and KEYWORD in without_format
    assert without_format == original.replace(" " + FORMAT, "")
    with_gold = counterfactual_prompt(ex, [Evidence("SELECT 1", "privileged")], render, header="REF:")
    assert with_gold.startswith(original.split("Keep it short.")[0]) and "REF:\nSELECT 1" in with_gold
    joint = counterfactual_prompt(ex, [Evidence(FORMAT, "in_prompt"), Evidence(KEYWORD, "in_prompt")], render)
    assert FORMAT not in joint and KEYWORD not in joint and "Describe a city. Keep it short." in joint


def test_completion_logits_align_with_a_full_forward(policy):
    model, tok = policy
    prompt = torch.tensor(tok("hello there", add_special_tokens=False)["input_ids"])
    completion = torch.tensor(tok(" general kenobi", add_special_tokens=False)["input_ids"])
    logits = completion_logits(model, prompt, completion)
    full = model(input_ids=torch.cat([prompt, completion]).unsqueeze(0)).logits[0]
    p = prompt.numel()
    assert logits.shape == (completion.numel(), model.config.vocab_size)
    torch.testing.assert_close(logits, full[p - 1 : p - 1 + completion.numel()])


def test_replay_relevance_shapes_zero_rows_and_exact_zero_for_identical_contexts(policy):
    model, tok = policy
    ex = example()
    completion = torch.tensor(tok("A river runs through it.", add_special_tokens=False)["input_ids"])
    evidences = [Evidence(FORMAT, "in_prompt"), None, Evidence("river", "privileged")]
    result = replay_completion(model, tok, ex, completion, evidences, needs=("per_reward", "joint", "entropy"))
    t = completion.numel()
    assert result.relevance.shape == (3, t) and result.has_evidence == [True, False, True]
    assert torch.equal(result.relevance[1], torch.zeros(t))
    assert (result.relevance[0] > 0).all() and (result.relevance[2] > 0).all()
    assert result.joint.shape == (t,) and result.entropy.shape == (t,)
    # A renderer that ignores the evidence makes both contexts identical: relevance exactly 0.
    same = replay_completion(
        model,
        tok,
        ex,
        completion,
        [Evidence("privileged", "privileged")],
        render=lambda e: default_render_prompt(example(), tok),
    )
    assert torch.equal(same.relevance, torch.zeros(1, t))


def test_replay_names_the_verifier_when_evidence_is_missing(policy):
    model, tok = policy
    completion = torch.tensor(tok("ok", add_special_tokens=False)["input_ids"])
    with pytest.raises(EvidenceNotFoundError, match="'keyword'.*'ex-1'"):
        replay_completion(
            model, tok, example(), completion, [Evidence("not in prompt", "in_prompt")], verifiers=["keyword"]
        )


def test_group_context_logits_match_plain_forwards(policy):
    """Shared-prefix KV reuse + batched right-padded completions = one plain forward per pair."""
    from mrtpo.model_calls import ForwardCounter
    from mrtpo.replay import group_context_logits

    model, tok = policy
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    contexts = [
        enc("The rules: be brief. Question: why?"),
        enc("The rules: Question: why?"),
        enc("The rules: be brief. Question: why? Reference: 42"),
    ]
    completions = [enc(" Because it rains."), enc(" No.")]
    t = max(map(len, completions))
    padded = torch.full((2, t), tok.pad_token_id)
    for i, c in enumerate(completions):
        padded[i, : len(c)] = torch.tensor(c)
    counter = ForwardCounter()
    got = dict(group_context_logits(model, contexts, padded, counter))
    assert counter.calls == 3  # the shared prefix, the contexts' own tokens, the completions: one batch each
    for c_idx, ctx in enumerate(contexts):
        for g, comp in enumerate(completions):
            expected = completion_logits(model, torch.tensor(ctx), torch.tensor(comp))
            torch.testing.assert_close(got[c_idx][g, : len(comp)], expected, atol=2e-5, rtol=1e-4)


def test_identical_contexts_give_identical_logits_through_the_cache_path(policy):
    from mrtpo.replay import group_context_logits

    model, tok = policy
    ctx = tok("Same prompt twice.", add_special_tokens=False)["input_ids"]
    comp = torch.tensor([tok(" an answer", add_special_tokens=False)["input_ids"]])
    logits = dict(group_context_logits(model, [ctx, list(ctx)], comp))
    assert torch.equal(logits[0], logits[1])


@pytest.mark.parametrize("micro_batch", [1, 2])
def test_group_relevance_in_micro_batches_equals_one_pass(policy, micro_batch):
    """Replaying a group a few completions at a time changes the memory, not the maps."""
    from mrtpo.model_calls import ForwardCounter
    from mrtpo.replay import group_relevance
    from mrtpo.replay_passes import plan_passes

    model, tok = policy
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    contexts = [enc("Rules: be brief. Q: why?"), enc("Rules: Q: why?"), enc("Rules: be brief. Q: why? Ref: 42")]
    texts = [" Because it rains.", " No.", " Maybe so, later."]
    t = max(len(enc(x)) for x in texts)
    padded = torch.full((3, t), tok.pad_token_id)
    lengths = torch.tensor([len(enc(x)) for x in texts])
    for i, x in enumerate(texts):
        padded[i, : len(enc(x))] = torch.tensor(enc(x))
    placements = ["in_prompt", "privileged"]
    whole = group_relevance(model, contexts, placements, padded, lengths, with_entropy=True)
    counter = ForwardCounter()
    parts = group_relevance(
        model, contexts, placements, padded, lengths, with_entropy=True, micro_batch=micro_batch, counter=counter
    )
    torch.testing.assert_close(parts.maps, whole.maps, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(parts.entropy, whole.entropy, atol=1e-5, rtol=1e-4)
    assert len(plan_passes([3], micro_batch)) == (3 if micro_batch == 1 else 2)
    assert counter.calls == len(plan_passes([3], micro_batch)) * 3
    assert parts.maps[:, 1, int(lengths[1]) :].abs().sum() == 0


def lora_policy_refusing_past_key_values():
    """The tiny policy under a LoRA adapter with non-zero weights, whose base model refuses the
    deprecated ``past_key_values=`` keyword (as transformers will once its alias is removed)."""
    import functools

    from peft import LoraConfig, get_peft_model

    model, tok = tiny_policy(seed=0)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    base = peft_model.get_base_model()
    forward = base.forward

    @functools.wraps(forward)
    def strict_forward(*args, **kwargs):
        if "past_key_values" in kwargs:
            raise TypeError("forward() got an unexpected keyword argument 'past_key_values'")
        return forward(*args, **kwargs)

    base.forward = strict_forward
    peft_model.eval()
    return peft_model, tok


def test_grouped_replay_through_a_lora_model_matches_plain_forwards():
    """The KV-shared replay through PEFT (and a DDP-style ``.module`` wrapper) passes the cache under
    the model's own keyword: its logits and relevance equal plain forwards of each pair."""
    from mrtpo.credit import js_distance
    from mrtpo.model_calls import cache_keyword
    from mrtpo.replay import group_context_logits, group_relevance

    peft_model, tok = lora_policy_refusing_past_key_values()
    plain_base, _ = tiny_policy(seed=0)
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    contexts = [enc("Rules: be brief. Q: why?"), enc("Rules: Q: why?")]
    texts = [" Because it rains.", " No."]
    lengths = torch.tensor([len(enc(x)) for x in texts])
    padded = torch.full((2, int(lengths.max())), tok.pad_token_id)
    for i, x in enumerate(texts):
        padded[i, : len(enc(x))] = torch.tensor(enc(x))

    class DDPLike(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *args, **kwargs):
            return self.module(*args, **kwargs)

    for wrapped in (peft_model, DDPLike(peft_model)):
        assert cache_keyword(wrapped) == "cache"
        got = dict(group_context_logits(wrapped, contexts, padded))
        for c, ctx in enumerate(contexts):
            for g, text in enumerate(texts):
                expected = completion_logits(peft_model, torch.tensor(ctx), torch.tensor(enc(text)))
                torch.testing.assert_close(got[c][g, : len(enc(text))], expected, atol=2e-5, rtol=1e-4)
                # the adapter is live: the base model alone predicts differently
                base_only = completion_logits(plain_base, torch.tensor(ctx), torch.tensor(enc(text)))
                assert (expected - base_only).abs().max() > 1e-2
    maps = group_relevance(peft_model, contexts, ["in_prompt"], padded, lengths).maps
    for g, text in enumerate(texts):
        n = len(enc(text))
        with_ev = completion_logits(peft_model, torch.tensor(contexts[0]), torch.tensor(enc(text)))
        without = completion_logits(peft_model, torch.tensor(contexts[1]), torch.tensor(enc(text)))
        torch.testing.assert_close(maps[0, g, :n], js_distance(with_ev[None], without[None])[0], atol=1e-5, rtol=1e-4)
    with pytest.raises(TypeError, match="past_key_values"):  # the guard is real
        peft_model(input_ids=padded[:1], past_key_values=None)


@pytest.mark.parametrize(
    "texts,completion_length",
    [
        (["Rules: be brief. Q: why?", "Rules: Q: why?"], 3),  # a shared prefix, two suffixes
        (["Same prompt.", "Same prompt."], 1),  # one-token completions
        (["A", "B"], 2),  # one-token contexts, nothing shared
    ],
)
def test_group_forward_calls_counts_what_the_replay_makes(policy, texts, completion_length):
    """The trainer agrees on forward calls across ranks before replaying: the count must be exact."""
    from mrtpo.model_calls import ForwardCounter
    from mrtpo.replay import group_context_logits
    from mrtpo.replay_passes import group_forward_calls

    model, tok = policy
    contexts = [tok(x, add_special_tokens=False)["input_ids"] for x in texts]
    if texts == ["A", "B"]:
        contexts = [c[:1] for c in contexts]
    completions = torch.full((2, completion_length), 7)
    counter = ForwardCounter()
    got = dict(group_context_logits(model, contexts, completions, counter))
    assert counter.calls == group_forward_calls(contexts)
    for c_idx, ctx in enumerate(contexts):
        expected = completion_logits(model, torch.tensor(ctx), completions[0])
        torch.testing.assert_close(got[c_idx][0], expected, atol=2e-5, rtol=1e-4)


def test_shared_lengths_read_the_original_up_to_each_departure():
    """Hand-made token ids: a late removal shares the original up to the cut, an appended reference
    shares it all but the last token, an early departure shares nothing, and every context keeps
    its last token for the completions."""
    from mrtpo.replay_passes import group_forward_calls, shared_lengths

    original = [1, 2, 3, 4, 5, 6]
    removed_late = [1, 2, 3, 5, 6]  # departs at index 3
    appended = [1, 2, 3, 4, 5, 9, 9, 6]  # departs at index 5 (the original's last token differs)
    early = [8, 2, 3, 4, 5, 6]  # departs at index 0
    prefix_of_original = [1, 2, 3]  # a prefix: keeps its own last token
    assert shared_lengths([original, removed_late, appended, early, prefix_of_original]) == [5, 3, 5, 0, 2]
    assert group_forward_calls([original, list(original)]) == 2  # the trunk, the completions
    assert group_forward_calls([original, removed_late]) == 3  # + the departed tokens
    assert group_forward_calls([original, [1, 2, 3, 4, 6]]) == 2  # departs at its last token
    assert group_forward_calls([[7], [8]]) == 1  # one-token contexts: the completions only


@pytest.mark.parametrize(
    "texts",
    [
        [
            "Rules: be brief. Question: why? Keep it short.",
            "Question: why? Keep it short.",  # departs at once
            "Rules: be brief. Question: why?",
            "Rules: be brief. Question: why? Keep it short. Reference: 42",
        ],
        ["Rules: be brief. Question: why?", "Q"],  # a one-token context departing at once
        [
            "Rules: be brief. Question: why?",
            "Question: why?",  # pads that see no shared token
            "Keep it short. Rules: be brief. Question: why? Keep it short.",
        ],
    ],
)
def test_replay_masks_the_trunk_after_each_departure(policy, texts):
    """Contexts departing from the original early, late or after its end each see exactly their own
    tokens: the logits equal one plain forward per (context, completion) pair, and the contexts'
    call runs only the departed tokens, never the whole prompt again."""
    from mrtpo.model_calls import ForwardCounter
    from mrtpo.replay import group_context_logits
    from mrtpo.replay_passes import shared_lengths

    model, tok = policy
    contexts = [tok(x, add_special_tokens=False)["input_ids"] for x in texts]
    completions = [tok(text, add_special_tokens=False)["input_ids"] for text in (" Because it rains.", " No.")]
    padded = torch.full((2, max(map(len, completions))), tok.pad_token_id)
    for i, comp in enumerate(completions):
        padded[i, : len(comp)] = torch.tensor(comp)
    widths = []
    hook = model.register_forward_pre_hook(
        lambda _m, args, kwargs: widths.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    try:
        got = dict(group_context_logits(model, contexts, padded, ForwardCounter()))
    finally:
        hook.remove()
    departed = [len(ctx) - 1 - s for ctx, s in zip(contexts, shared_lengths(contexts))]
    assert widths[0] == (1, len(contexts[0]) - 1)  # the trunk, once
    if max(departed) > 0:
        assert widths[1] == (len(contexts), max(departed))  # only the departed tokens
    for c_idx, ctx in enumerate(contexts):
        for g, comp in enumerate(completions):
            expected = completion_logits(model, torch.tensor(ctx), torch.tensor(comp))
            torch.testing.assert_close(got[c_idx][g, : len(comp)], expected, atol=2e-5, rtol=1e-4)


def test_plan_passes_packs_groups_by_count_and_completions():
    """Hand-made sizes: one group per pass by default, a group split by the micro-batch continues in
    the next pass, any number of groups when ``groups_per_pass`` is None, empty groups take no room."""
    from mrtpo.replay_passes import plan_passes

    s = slice
    assert plan_passes([4, 4]) == [[(0, s(0, 4))], [(1, s(0, 4))]]
    assert plan_passes([3], micro_batch=2) == [[(0, s(0, 2))], [(0, s(2, 3))]]
    assert plan_passes([4, 4, 4], groups_per_pass=None) == [[(0, s(0, 4)), (1, s(0, 4)), (2, s(0, 4))]]
    assert plan_passes([4, 4, 4], groups_per_pass=2) == [[(0, s(0, 4)), (1, s(0, 4))], [(2, s(0, 4))]]
    assert plan_passes([3, 3], micro_batch=4, groups_per_pass=None) == [[(0, s(0, 3)), (1, s(0, 1))], [(1, s(1, 3))]]
    assert plan_passes([2, 0, 2], groups_per_pass=None) == [[(0, s(0, 2)), (2, s(0, 2))]]
    assert plan_passes([]) == []
    with pytest.raises(ValueError, match="groups_per_pass"):
        plan_passes([2], groups_per_pass=0)


def replay_groups(tok):
    """Three groups unlike each other: prompts of different lengths and departures, 3 / 2 / 1
    completions of different widths, a repeated context, and a one-token original."""
    from mrtpo.replay import ReplayGroup

    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731

    def padded(texts):
        ids = [enc(x) for x in texts]
        out = torch.full((len(ids), max(map(len, ids))), tok.pad_token_id)
        for i, x in enumerate(ids):
            out[i, : len(x)] = torch.tensor(x)
        return out, torch.tensor([len(x) for x in ids])

    first = ReplayGroup(
        [enc("Rules: be brief. Q: why?"), enc("Rules: Q: why?"), enc("Rules: be brief. Q: why? Ref: 42")],
        ["in_prompt", "privileged"],
        *padded([" Because it rains.", " No.", " Maybe so, later."]),
    )
    second = ReplayGroup(
        [
            enc("A much longer prompt with several rules. Be kind. Answer in French. Q: who?"),
            enc("A much longer prompt with several rules. Answer in French. Q: who?"),
            enc("A much longer prompt with several rules. Be kind. Answer in French. Q: who?"),
        ],
        ["in_prompt", "in_prompt"],
        *padded([" Nobody at all, I think.", " Oui."]),
    )
    third = ReplayGroup(
        [enc("Q")[:1], enc("Q: hi")], ["privileged"], *padded([" Hello there friend, it has been long."])
    )
    return [first, second, third]


@pytest.mark.parametrize("micro_batch,groups_per_pass", [(None, None), (None, 2), (2, None)])
def test_groups_sharing_a_pass_give_each_groups_own_maps(policy, micro_batch, groups_per_pass):
    """Several groups in one pass of three forward calls (left-padded trunks, each row masked to its
    own group) give the maps of replaying each group alone, and the planned call count is exact."""
    from mrtpo.model_calls import ForwardCounter
    from mrtpo.replay import batch_relevance, group_relevance
    from mrtpo.replay_passes import replay_forward_calls

    model, tok = policy
    groups = replay_groups(tok)
    counter = ForwardCounter()
    together = batch_relevance(
        model, groups, with_entropy=True, micro_batch=micro_batch, groups_per_pass=groups_per_pass, counter=counter
    )
    contexts, sizes = [g.contexts for g in groups], [g.completions.shape[0] for g in groups]
    assert counter.calls == replay_forward_calls(contexts, sizes, micro_batch, groups_per_pass)
    assert replay_forward_calls(contexts, sizes, None, None) == 3  # all groups, one pass
    assert replay_forward_calls(contexts, sizes, None, 1) == 3 + 3 + 2  # the third: a one-token trunk
    for group, got in zip(groups, together):
        alone = group_relevance(
            model, group.contexts, group.placements, group.completions, group.lengths, with_entropy=True
        )
        assert got.maps.shape == alone.maps.shape
        torch.testing.assert_close(got.maps, alone.maps, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got.entropy, alone.entropy, atol=1e-5, rtol=1e-4)
    assert together[1].maps[1].abs().sum() == 0  # its second counterfactual repeats the original
    assert together[0].maps.abs().sum() > 0 and together[2].maps.abs().sum() > 0


def test_a_shared_pass_equals_plain_forwards(policy):
    """Every (group, context, completion) logit of one shared pass equals one plain forward of that
    pair alone: no row sees another group's prompt or its pads."""
    from mrtpo.model_calls import ForwardCounter
    from mrtpo.replay import pass_context_logits

    model, tok = policy
    groups = replay_groups(tok)
    counter = ForwardCounter()
    got = pass_context_logits(model, [(g.contexts, g.completions) for g in groups], counter)
    assert counter.calls == 3
    assert got.blocks[1][0] == got.blocks[1][2]  # the second group's repeated context: run once, rows shared
    assert got.logits.shape[0] == 3 * 3 + 2 * 2 + 2 * 1  # distinct contexts x completions
    for m, group in enumerate(groups):
        for c in range(len(group.contexts)):
            logits = got.of(m, c)
            assert logits.shape[:2] == group.completions.shape
            for row, n in enumerate(group.lengths.tolist()):
                expected = completion_logits(model, torch.tensor(group.contexts[c]), group.completions[row, :n])
                torch.testing.assert_close(logits[row, :n], expected, atol=2e-5, rtol=1e-4)


def test_a_shared_pass_in_bfloat16_stays_within_bfloat16_noise():
    """In bf16, replaying the groups together instead of one by one moves the maps by no more than
    bf16 itself does against fp32 (the padding and batch shapes change the rounding, nothing else)."""
    from mrtpo.replay import batch_relevance, group_relevance

    model32, tok = tiny_policy(seed=0)
    model16 = tiny_policy(seed=0)[0].to(torch.bfloat16)
    groups = replay_groups(tok)
    together = batch_relevance(model16, groups, groups_per_pass=None)
    for group, got in zip(groups, together):
        args = (group.contexts, group.placements, group.completions, group.lengths)
        alone, exact = group_relevance(model16, *args), group_relevance(model32, *args)
        noise = (alone.maps - exact.maps).abs().max()
        assert 0 < noise < 0.05
        assert (got.maps - alone.maps).abs().max() <= noise


def test_autocast_outputs_drops_the_fp32_copy_of_mixed_precision_logits():
    """accelerate's bf16 mixed precision returns fp32 copies of autocast's bf16 outputs; inside
    ``autocast_outputs`` the forward returns the bf16 tensor itself (same values), and the wrapper is
    back afterwards. A model not prepared for mixed precision is left as it is."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from mrtpo.model_calls import autocast_outputs

    model, _ = tiny_policy(seed=0)
    AcceleratorState._reset_state(True)  # a process-wide singleton: earlier tests set no mixed precision
    try:
        prepared = Accelerator(mixed_precision="bf16", cpu=True).prepare(model)
    finally:
        AcceleratorState._reset_state(True)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        upcast = prepared(input_ids=ids).logits
        with autocast_outputs(prepared):
            native = prepared(input_ids=ids).logits
        after = prepared(input_ids=ids).logits
    assert upcast.dtype == after.dtype == torch.float32 and native.dtype == torch.bfloat16
    assert torch.equal(native.float(), upcast) and torch.equal(after, upcast)
    plain, _ = tiny_policy(seed=0)
    forward = plain.forward
    with autocast_outputs(plain), torch.no_grad():
        assert plain(input_ids=ids).logits.dtype == torch.float32
    assert plain.forward == forward and "forward" not in plain.__dict__


def test_bf16_trainer_replays_on_bf16_logits_with_the_same_maps(tmp_path, monkeypatch):
    """A bf16 mixed-precision trainer (CPU autocast) replays on autocast's bf16 logits, and its
    relevance maps are bit-identical to the replay on accelerate's fp32 copies."""
    import contextlib

    import mrtpo.replay as replay_module
    import mrtpo.trainer.replay_step as trainer_module
    from tests.test_trainer import char_code, has_letter_e, make_trainer, plain_length

    dtypes, maps = [], {}
    original = replay_module.pass_context_logits

    def recording(*args, **kwargs):
        result = original(*args, **kwargs)
        dtypes.append(result.logits.dtype)
        return result

    monkeypatch.setattr(replay_module, "pass_context_logits", recording)
    for name, context in (("native", trainer_module.autocast_outputs), ("upcast", lambda _m: contextlib.nullcontext())):
        monkeypatch.setattr(trainer_module, "autocast_outputs", context)
        # every group replayed, whatever the sampled rewards' spread
        trainer = make_trainer(
            tmp_path / name, [has_letter_e, char_code, plain_length], max_steps=1, bf16=True, skip_zero_advantage=False
        )
        original_replay = trainer._replay_eval_mode

        def keep(*args, _original=original_replay, _name=name, **kwargs):
            result = _original(*args, **kwargs)
            maps[_name] = result["relevance"].clone()
            return result

        trainer._replay_eval_mode = keep
        trainer.train()
        dtypes.append(name)
    assert torch.bfloat16 in dtypes[: dtypes.index("native")]
    assert torch.float32 in dtypes[dtypes.index("native") + 1 :]
    assert maps["native"].abs().sum() > 0
    assert torch.equal(maps["native"], maps["upcast"])
