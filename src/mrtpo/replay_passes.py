"""How replays are batched into forward calls: pure bookkeeping, no model.

A replay pass (:func:`mrtpo.replay.pass_context_logits`) scores several prompt groups' completions
under each of their contexts in at most three forward calls; :func:`plan_passes` packs groups into
passes, :func:`shared_lengths` says how much of each context it reads from the original prompt's
cache, and :func:`replay_forward_calls` counts the calls a replay will make *before* it makes them (every
rank must make the same number under FSDP / ZeRO-3). A new way to batch replays changes this module
and the pass that carries it out.
"""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix of all ``sequences``."""
    shortest = min(len(s) for s in sequences)
    for i in range(shortest):
        token = sequences[0][i]
        if any(s[i] != token for s in sequences[1:]):
            return i
    return shortest


def shared_lengths(contexts: Sequence[Sequence[int]]) -> list[int]:
    """Per context, how many of its leading tokens it reads from the original's cache.

    The original ``contexts[0]`` but its last token is the trunk, run once; every context shares
    the trunk up to where it departs from the original (its common prefix with it) and keeps at
    least its last token to run with the completions. A removed span or an appended reference
    departs late, so a counterfactual costs only its tokens after the departure, not its whole
    prompt again.
    """
    original = contexts[0]
    return [min(common_prefix_length([ctx, original]), len(ctx) - 1, len(original) - 1) for ctx in contexts]


def pass_forward_calls(member_contexts: Sequence[Sequence[Sequence[int]]]) -> int:
    """Forward calls :func:`mrtpo.replay.pass_context_logits` makes for these groups' contexts, whatever their
    number and the completions' shape: the trunks (if some original has more than one token), the
    contexts' tokens after their departure but the last (if any context has some), the completions."""
    trunk = any(len(contexts[0]) > 1 for contexts in member_contexts)
    heads = any(len(ctx) - 1 > s for contexts in member_contexts for ctx, s in zip(contexts, shared_lengths(contexts)))
    return int(trunk) + int(heads) + 1


def group_forward_calls(contexts: Sequence[Sequence[int]]) -> int:
    """:func:`pass_forward_calls` for one group."""
    return pass_forward_calls([contexts])


def plan_passes(
    sizes: Sequence[int], micro_batch: int | None = None, groups_per_pass: int | None = 1
) -> list[list[tuple[int, slice]]]:
    """Pack groups of ``sizes[i]`` completions into replay passes: a list of passes, each a list of
    ``(group index, completion rows)``.

    A pass holds at most ``groups_per_pass`` groups (``None``: any number) and at most
    ``micro_batch`` completions (``None``: any number); a group that does not fit in what is left of
    a pass continues in the next one. Groups and rows keep their order; empty groups take no room.
    """
    if micro_batch is not None and micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1 or None, got {micro_batch}")
    if groups_per_pass is not None and groups_per_pass < 1:
        raise ValueError(f"groups_per_pass must be >= 1 or None, got {groups_per_pass}")
    passes: list[list[tuple[int, slice]]] = []
    current: list[tuple[int, slice]] = []
    room = micro_batch
    for group, size in enumerate(sizes):
        first = 0
        while first < size:
            if current and (room == 0 or (groups_per_pass is not None and len(current) == groups_per_pass)):
                passes.append(current)
                current, room = [], micro_batch
            take = size - first if room is None else min(size - first, room)
            current.append((group, slice(first, first + take)))
            first += take
            room = None if room is None else room - take
    if current:
        passes.append(current)
    return passes


def replay_forward_calls(
    group_contexts: Sequence[Sequence[Sequence[int]]],
    sizes: Sequence[int],
    micro_batch: int | None = None,
    groups_per_pass: int | None = 1,
    packed: bool = False,
) -> int:
    """Forward calls :func:`mrtpo.replay.batch_relevance` makes for these groups (contexts, completion counts)."""
    return sum(
        1 if packed else pass_forward_calls([group_contexts[group] for group, _ in members])
        for members in plan_passes(sizes, micro_batch, groups_per_pass)
    )


__all__ = [
    "common_prefix_length",
    "group_forward_calls",
    "pass_forward_calls",
    "plan_passes",
    "replay_forward_calls",
    "shared_lengths",
]
