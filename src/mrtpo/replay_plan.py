"""One replay plan: which contexts a batch of completions is replayed under, and where the maps go.

Every caller that replays (the trainer, :func:`mrtpo.replay.replay_completion`, ``mrtpo demo``,
``mrtpo explain``, the benchmarks) plans here, so they all replay the same contexts for the same
credit method:

1. :func:`group_rows` groups the ``B`` completions by prompt;
2. :func:`plan_replays` decides, per group, the counterfactual contexts each ``needs`` kind of the
   methods asks for (:data:`CONTEXT_RULES`), leaving out a reward whose coefficient is 0 for every
   member of the group (its map would only multiply zeros);
3. :func:`group_contexts` turns a group's plan into token ids: the original prompt, then each
   counterfactual (:func:`mrtpo.counterfactual.counterfactual_text`, the one context builder);
4. :meth:`ReplayPlan.scatter` puts the replayed groups' maps back into ``(B, K, T)`` / ``(B, T)``
   under the names of :class:`mrtpo.credit.CreditBatch`'s fields.

Pure bookkeeping: no model, no trainer. A new ``needs`` kind is a row of :data:`CONTEXT_RULES`
next to its entry in :data:`mrtpo.credit.NEEDS`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from mrtpo.counterfactual import DEFAULT_PRIVILEGED_HEADER, PromptRenderer, counterfactual_text, decoy_text
from mrtpo.verifiers import Evidence, Example

#: One counterfactual per reward with evidence; its map fills that reward's row of ``relevance`` ``(B, K, T)``.
EACH = "each"
#: One counterfactual with every reward's evidence at once; its map fills ``joint_relevance`` ``(B, T)``.
ALL = "all"
#: A reward's evidence replaced by a decoy (another prompt's evidence for that reward); its map, measured
#: against the context without any evidence, fills ``decoy_relevance`` ``(B, K, T)``.
DECOY = "decoy"


@dataclass(frozen=True)
class ContextRule:
    """What one credit ``needs`` kind replays: ``counterfactuals`` (``None``, :data:`EACH` or
    :data:`ALL`) next to the original prompt, whether each :data:`EACH` counterfactual gets a
    :data:`DECOY` beside it (``decoys``), and whether the original's ``entropy`` ``(B, T)`` is read.
    ``known``: no replay; the caller fills ``known_positions`` ``(B, K, T)`` from what the task knows
    each reward reads (:func:`mrtpo.known_positions.known_position_mask`)."""

    counterfactuals: str | None = None
    decoys: bool = False
    entropy: bool = False
    known: bool = False

    @property
    def replays(self) -> bool:
        return self.counterfactuals is not None or self.entropy


#: ``needs`` kind (:data:`mrtpo.credit.NEEDS`) -> what it replays. Order: the order of a group's contexts.
CONTEXT_RULES: dict[str, ContextRule] = {
    "none": ContextRule(),
    "per_reward": ContextRule(counterfactuals=EACH),
    "joint": ContextRule(counterfactuals=ALL),
    "contrastive": ContextRule(counterfactuals=EACH, decoys=True),
    "entropy": ContextRule(entropy=True),
    "oracle": ContextRule(known=True),
}

#: The :class:`mrtpo.credit.CreditBatch` fields a plan fills (:meth:`ReplayPlan.scatter`); a ``known`` kind's
#: ``known_positions`` come from the task instead (:mod:`mrtpo.known_positions`).
CREDIT_FIELDS = ("relevance", "joint_relevance", "decoy_relevance", "entropy", "has_evidence")


def context_rule(needs: str) -> ContextRule:
    """The :class:`ContextRule` of ``needs``; an unknown kind lists the known ones."""
    try:
        return CONTEXT_RULES[needs]
    except KeyError:
        raise KeyError(f"no replay rule for needs {needs!r}; known: {', '.join(CONTEXT_RULES)}") from None


def needs_evidence(needs: str) -> bool:
    """Whether ``needs`` replays counterfactuals, i.e. needs rewards that declare evidence."""
    return context_rule(needs).counterfactuals is not None


def _ordered(needs: str | Sequence[str]) -> tuple[str, ...]:
    """``needs`` kinds, deduplicated, in :data:`CONTEXT_RULES` order (so contexts come in one order)."""
    kinds = {needs} if isinstance(needs, str) else set(needs)
    for kind in kinds:
        context_rule(kind)
    return tuple(kind for kind in CONTEXT_RULES if kind in kinds)


@dataclass(frozen=True)
class Counterfactual:
    """One counterfactual context: the rewards whose evidence it removes or appends (``rule``
    :data:`EACH`: one reward; :data:`ALL`: every reward with evidence), that evidence, and the side
    that carries it (``placement``: ``in_prompt`` = the context its map is measured against,
    ``privileged`` = this context). A :data:`DECOY` puts ``decoy`` where its reward's evidence was and
    is measured against context ``base`` (0: the original; else the reward's own counterfactual)."""

    rule: str
    rewards: tuple[int, ...]
    evidences: tuple[Evidence, ...]
    placement: str
    decoy: Evidence | None = None
    base: int = 0


@dataclass
class GroupPlan:
    """The replay of one prompt group. ``rows``: its completions' indices in the batch; ``width``:
    its longest completion; ``skipped``: rewards whose map the method uses but is not computed (zero
    coefficient for every member); ``contexts_skipped``: counterfactual contexts left out for it."""

    rows: list[int]
    width: int
    counterfactuals: list[Counterfactual]
    entropy: bool
    skipped: list[int]
    contexts_skipped: int

    @property
    def replayed(self) -> bool:
        """Whether the group is replayed: it has something to compute and a non-empty completion."""
        return self.width > 0 and (bool(self.counterfactuals) or self.entropy)

    @property
    def placements(self) -> list[str]:
        """One placement per counterfactual, for :class:`mrtpo.replay.ReplayGroup`."""
        return [cf.placement for cf in self.counterfactuals]

    @property
    def bases(self) -> list[int]:
        """The context each counterfactual's map is measured against, for :class:`mrtpo.replay.ReplayGroup`."""
        return [cf.base for cf in self.counterfactuals]


def group_rows(keys: Sequence[Hashable]) -> list[list[int]]:
    """Row indices grouped by ``keys[j]`` (a completion's prompt), groups and rows in first-seen order."""
    groups: dict[Hashable, list[int]] = {}
    for j, key in enumerate(keys):
        groups.setdefault(key, []).append(j)
    return list(groups.values())


def plan_group(
    rows: list[int],
    evidences: Sequence[Evidence | None],
    active: Sequence[bool],
    needs: str | Sequence[str],
    width: int = 1,
    decoys: Sequence[Evidence | None] | None = None,
) -> GroupPlan:
    """The contexts one group is replayed under.

    ``evidences`` ``K``: each reward's evidence for this prompt (``None``: none); ``active`` ``K``
    bools: rewards with a non-zero coefficient for some member (:func:`mrtpo.credit.reward_coefficients`).
    :data:`EACH` replays an active reward's counterfactual (once, however many kinds ask for it),
    followed, for kinds with ``decoys``, by a :data:`DECOY` per reward with a decoy in ``decoys``
    (``K``, :func:`choose_decoys`); :data:`ALL` and the entropy replay their one map where any reward
    is active. What is left out goes to ``skipped`` / ``contexts_skipped``.
    """
    k = len(evidences)
    present = [i for i, ev in enumerate(evidences) if ev is not None]
    counterfactuals: list[Counterfactual] = []
    skipped: set[int] = set()
    contexts_skipped, entropy = 0, False
    rules = [CONTEXT_RULES[kind] for kind in _ordered(needs)]
    if any(rule.counterfactuals == EACH for rule in rules):
        counterfactuals += [
            Counterfactual(EACH, (i,), (evidences[i],), evidences[i].placement) for i in present if active[i]
        ]
        inactive = [i for i in present if not active[i]]
        skipped.update(inactive)
        contexts_skipped += len(inactive)
        if any(rule.decoys for rule in rules) and decoys is not None:
            for c, own in enumerate(list(counterfactuals)):
                decoy = decoys[own.rewards[0]]
                if decoy is not None:  # measured against the context without the evidence
                    base = 0 if own.placement == "privileged" else c + 1
                    counterfactuals.append(replace(own, rule=DECOY, placement="privileged", decoy=decoy, base=base))
            contexts_skipped += sum(decoys[i] is not None for i in inactive)
    for rule in rules:
        if rule.counterfactuals == ALL and present:
            if any(active):
                counterfactuals.append(
                    Counterfactual(ALL, tuple(present), tuple(evidences[i] for i in present), "in_prompt")
                )
            else:
                skipped.update(range(k))
                contexts_skipped += 1
        if rule.entropy:
            entropy = entropy or any(active)
            if not any(active):
                skipped.update(range(k))
    return GroupPlan(list(rows), width, counterfactuals, entropy, sorted(skipped), contexts_skipped)


@dataclass
class ReplayPlan:
    """The replay of a batch of ``size`` completions and ``rewards`` rewards, group by group."""

    needs: tuple[str, ...]
    groups: list[GroupPlan]
    size: int
    rewards: int

    @property
    def replayed(self) -> list[GroupPlan]:
        """The groups that are replayed, in order: :meth:`scatter` takes one result per group."""
        return [g for g in self.groups if g.replayed]

    @property
    def entropy(self) -> bool:
        """Whether the replay reads the original context's entropy."""
        return any(CONTEXT_RULES[kind].entropy for kind in self.needs)

    def counts(self) -> dict[str, int]:
        """The ``skip/*`` metrics: completions and counterfactual contexts replayed and skipped."""
        replayed = self.replayed
        rows = sum(len(g.rows) for g in replayed)
        return {
            "completions_replayed": rows,
            "completions_skipped": self.size - rows,
            "contexts_replayed": sum(len(g.counterfactuals) for g in replayed),
            "contexts_skipped": sum(g.contexts_skipped for g in self.groups),
        }

    def skipped(self) -> Tensor:
        """``(B, K)`` bool: maps the method uses that were not computed (zero coefficient)."""
        mask = torch.zeros(self.size, self.rewards, dtype=torch.bool)
        for group in self.groups:
            if group.skipped:
                mask[torch.tensor(group.rows).unsqueeze(1), torch.tensor(group.skipped)] = True
        return mask

    def scatter(self, results: Sequence[Any], width: int, device: Any = None) -> dict[str, Tensor | None]:
        """The replayed groups' maps in the batch's shape, keyed by :data:`CREDIT_FIELDS`.

        ``results``: one per :attr:`replayed` group, with ``maps`` ``(C − 1, G, T_g)`` (one per
        counterfactual, in plan order) and ``entropy`` ``(G, T_g)`` (:class:`mrtpo.replay.GroupRelevance`).
        Returns ``relevance`` / ``decoy_relevance`` ``(B, K, T)``, ``joint_relevance`` / ``entropy``
        ``(B, T)`` (on ``device``, 0 where not replayed; ``None`` where no ``needs`` kind asks for
        them) and ``has_evidence``
        ``(B, K)`` bool (on the host: the rewards whose own map was computed). ``T`` = ``width``.
        """
        rules = [CONTEXT_RULES[kind] for kind in self.needs]
        b, k = self.size, self.rewards

        def wanted(yes: bool, *shape: int) -> Tensor | None:
            return torch.zeros(*shape, device=device) if yes else None

        relevance = wanted(any(r.counterfactuals == EACH for r in rules), b, k, width)
        decoy = wanted(any(r.decoys for r in rules), b, k, width)
        joint = wanted(any(r.counterfactuals == ALL for r in rules), b, width)
        entropy = wanted(self.entropy, b, width)
        has_evidence = torch.zeros(b, k, dtype=torch.bool)
        replayed = self.replayed
        if len(results) != len(replayed):
            raise ValueError(f"need one result per replayed group: {len(replayed)}, got {len(results)}")
        for group, result in zip(replayed, results):
            rows, n = torch.tensor(group.rows), group.width
            if group.entropy:
                entropy[rows, :n] = result.entropy
            for c, cf in enumerate(group.counterfactuals):
                if cf.rule == EACH:
                    relevance[rows, cf.rewards[0], :n] = result.maps[c]
                    has_evidence[rows, cf.rewards[0]] = True
                elif cf.rule == DECOY:
                    decoy[rows, cf.rewards[0], :n] = result.maps[c]
                else:
                    joint[rows, :n] = result.maps[c]
        return {
            "relevance": relevance,
            "joint_relevance": joint,
            "decoy_relevance": decoy,
            "entropy": entropy,
            "has_evidence": has_evidence,
        }


def choose_decoys(evidences: Sequence[Sequence[Evidence | None]]) -> list[list[Evidence | None]]:
    """Per group (``evidences``: one ``K`` list per group) and reward, its decoy: that reward's evidence
    in the next group of the batch (cyclically) whose evidence has the same placement and a different
    text. ``None`` where no other group has one (one prompt, or an evidence every prompt shares, such
    as a fixed format rule): that reward's contrastive map is then its own map."""
    decoys = []
    for g, own in enumerate(evidences):
        row: list[Evidence | None] = []
        for i, evidence in enumerate(own):
            others = (evidences[(g + step) % len(evidences)][i] for step in range(1, len(evidences)))
            row.append(
                None
                if evidence is None
                else next(
                    (
                        o
                        for o in others
                        if o is not None and o.placement == evidence.placement and o.text != evidence.text
                    ),
                    None,
                )
            )
        decoys.append(row)
    return decoys


def plan_replays(
    groups: Sequence[list[int]],
    evidences: Sequence[Sequence[Evidence | None]],
    lengths: Sequence[int],
    needs: str | Sequence[str],
    nonzero: Sequence[Sequence[bool]] | None = None,
    decoys: Sequence[Sequence[Evidence | None]] | None = None,
) -> ReplayPlan:
    """The plan of a batch: ``groups`` (:func:`group_rows`), ``evidences`` one ``K`` list per group,
    ``lengths`` ``(B,)`` completion lengths, ``nonzero`` ``(B, K)`` whether each completion's reward
    coefficient ``ω_k Â[j,k]`` is non-zero (``None``: all are, every map is computed). Kinds with
    ``decoys`` take each group's decoys from the batch's other groups (:func:`choose_decoys`), or
    from ``decoys`` (one ``K`` list per group) where the caller replays one prompt at a time."""
    size = len(lengths)
    k = len(evidences[0]) if evidences else 0
    kinds = _ordered(needs)
    if not any(CONTEXT_RULES[kind].decoys for kind in kinds):
        decoys = [None] * len(groups)
    elif decoys is None:
        decoys = choose_decoys(evidences)
    plans = []
    for rows, group_evidences, group_decoys in zip(groups, evidences, decoys):
        active = [True] * k if nonzero is None else [any(nonzero[j][i] for j in rows) for i in range(k)]
        width = max((lengths[j] for j in rows), default=0)
        plans.append(plan_group(rows, group_evidences, active, needs, width, group_decoys))
    return ReplayPlan(kinds, plans, size, k)


def counterfactual_texts(
    group: GroupPlan,
    prompt: str | list[dict[str, Any]],
    names: Sequence[str],
    render: Callable[[list[dict[str, Any]]], str],
    *,
    header: str = DEFAULT_PRIVILEGED_HEADER,
    example_id: str = "?",
) -> list[str]:
    """The prompt string of each of the group's counterfactuals (:func:`mrtpo.counterfactual.counterfactual_text`;
    a :data:`DECOY`'s: :func:`mrtpo.counterfactual.decoy_text`)."""
    return [
        decoy_text(
            prompt, cf.evidences[0], cf.decoy, render, header, verifier=names[cf.rewards[0]], example_id=example_id
        )
        if cf.rule == DECOY
        else counterfactual_text(
            prompt, list(cf.evidences), render, header, verifiers=[names[i] for i in cf.rewards], example_id=example_id
        )
        for cf in group.counterfactuals
    ]


def group_contexts(
    group: GroupPlan,
    original_ids: list[int],
    prompt: str | list[dict[str, Any]],
    names: Sequence[str],
    render: Callable[[list[dict[str, Any]]], str],
    ids_of: Callable[[str], list[int]],
    *,
    header: str = DEFAULT_PRIVILEGED_HEADER,
    example_id: str = "?",
) -> list[list[int]]:
    """Token ids of the group's contexts: ``original_ids``, then each counterfactual's."""
    texts = counterfactual_texts(group, prompt, names, render, header=header, example_id=example_id)
    return [list(original_ids)] + [ids_of(text) for text in texts]


def example_contexts(
    group: GroupPlan,
    example: Example,
    names: Sequence[str],
    render: PromptRenderer,
    ids_of: Callable[[str], list[int]],
    *,
    header: str = DEFAULT_PRIVILEGED_HEADER,
) -> list[list[int]]:
    """:func:`group_contexts` of a task example, rendered by the task's ``render`` (as for generation)."""
    return group_contexts(
        group,
        ids_of(render(example)),
        example.messages,
        names,
        lambda messages: render(replace(example, messages=messages)),
        ids_of,
        header=header,
        example_id=example.id,
    )


__all__ = [
    "ALL",
    "CONTEXT_RULES",
    "CREDIT_FIELDS",
    "DECOY",
    "EACH",
    "ContextRule",
    "Counterfactual",
    "GroupPlan",
    "ReplayPlan",
    "choose_decoys",
    "context_rule",
    "counterfactual_texts",
    "example_contexts",
    "group_contexts",
    "group_rows",
    "needs_evidence",
    "plan_group",
    "plan_replays",
]
