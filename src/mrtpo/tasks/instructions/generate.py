"""Training prompts: a base task plus 1-5 verifiable constraints, deterministic by seed.

**Base tasks** come from our own generator (:data:`TOPICS` × :data:`TEMPLATES`, 40 × 24 = 960
open-ended writing tasks), never from the evaluation prompts (a test checks none occurs in IFEval
or IFBench). No instruction data set with a licence compatible with this Apache-2.0 project ships
in an offline package we found: the instruction sets on PyPI carry Alpaca-derived data (CC BY-NC)
or are evaluation sets. Base tasks contain no comma, so "repeat the request" stays compatible
with "no commas".

**Constraints** are drawn from a pool of IFEval/IFBench classes (:mod:`.pools`) without
replacement, each compatible with those already drawn (:func:`pools.conflicts`). Arguments come
from the library's own ``build_description()`` random choices, run against a private
``random.Random`` (the library's module-level ``random`` is swapped for the duration), so
generation is deterministic by ``(seed, index)`` and touches no global random state. The target
count is uniform in ``[min_constraints, max_constraints]``; when no compatible class is left
(e.g. after "wrap the answer in JSON", which conflicts with most classes) the prompt keeps fewer.

**Anchors** (docs/design.md#measurement: a degenerate output must not satisfy everything): ``anchor`` adds, before
the random draws, a length floor (``"min_words"``: IFEval ``number_words`` "at least N", N uniform
in ``min_words_range``) and/or a content requirement (``"keywords"``: IFEval
``keywords:existence`` with two library-drawn keywords). Anchors count towards the total and are
shuffled in with the others.

**Prompt layout**: ``<base task>\\n\\n<sentence 1>\\n<sentence 2>...``; slot k is the k-th
sentence. Every sentence occurs exactly once in the prompt, so removing one (the in-prompt
evidence) leaves the base task and the other sentences intact.

Each example records per constraint: ``benchmark``, ``id``, ``kwargs`` (complete, as returned by
``get_instruction_args()``), ``sentence`` (exactly as placed in the prompt) and ``anchor``.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

from mrtpo.tasks.instructions import checkers, pools
from mrtpo.verifiers import Example

__all__ = [
    "TOPICS",
    "TEMPLATES",
    "ANCHORS",
    "MAX_SLOTS",
    "GeneratorConfig",
    "base_tasks",
    "build_prompt",
    "generate",
    "generate_one",
]

MAX_SLOTS = 5
ANCHORS = ("min_words", "keywords")

TOPICS: tuple[str, ...] = (
    "urban beekeeping",
    "the history of the bicycle",
    "learning a second language as an adult",
    "working from home",
    "composting in a small apartment",
    "the first moon landing",
    "how volcanoes form",
    "public libraries",
    "saving money on groceries",
    "night sky photography",
    "the invention of the printing press",
    "coral reefs",
    "training for a first marathon",
    "board game nights",
    "electric cars",
    "healthy sleep habits",
    "the origins of jazz",
    "the water cycle",
    "starting a vegetable garden",
    "protecting your privacy online",
    "the pyramids of ancient Egypt",
    "recycling plastic",
    "volunteering in your community",
    "the benefits of daily walks",
    "learning to play chess",
    "life in the desert",
    "the migration of monarch butterflies",
    "the culture of tea",
    "3D printing at home",
    "space telescopes",
    "the Silk Road",
    "street food around the world",
    "minimalist living",
    "tropical rainforests",
    "wind and solar power",
    "learning to code as a teenager",
    "city parks",
    "the Olympic Games",
    "baking bread at home",
    "the life of octopuses",
)

TEMPLATES: tuple[str, ...] = (
    "Write a blog post about {topic}.",
    "Write a short story in which {topic} plays a central role.",
    "Write a letter to a local newspaper about {topic}.",
    "Explain {topic} to a curious ten-year-old.",
    "Write a persuasive essay arguing that more people should care about {topic}.",
    "Give advice to a beginner who wants to learn about {topic}.",
    "Write a speech for a school assembly about {topic}.",
    "Write a review of a book about {topic}.",
    "Write a diary entry by someone who spends a whole day thinking about {topic}.",
    "Write a dialogue between two friends who disagree about {topic}.",
    "Write the introduction a museum guide gives to an exhibit on {topic}.",
    "Write an outline for a podcast episode about {topic}.",
    "Write a poem about {topic}.",
    "Write a news report about a surprising discovery related to {topic}.",
    "Summarize what an ordinary person should know about {topic}.",
    "Write a motivational message for someone who is interested in {topic}.",
    "Write a job advertisement for a position connected to {topic}.",
    "Write the text of a travel brochure for a town that celebrates {topic}.",
    "Answer the question of why {topic} matters today.",
    "Write the opening of a lesson plan for a class on {topic}.",
    "Write a social media post announcing a community event about {topic}.",
    "Write a review of a documentary about {topic}.",
    "Write a short biography of a fictional expert on {topic}.",
    "Describe a perfect weekend centered on {topic}.",
)


def base_tasks() -> list[str]:
    """All 960 base tasks, in a fixed order (topic-major)."""
    return [t.format(topic=topic) for topic in TOPICS for t in TEMPLATES]


@dataclass(frozen=True)
class GeneratorConfig:
    """Options of :func:`generate` (all recorded in every example's ``meta``)."""

    seed: int = 0
    min_constraints: int = 1
    max_constraints: int = MAX_SLOTS
    pool: str = "ifeval"
    anchor: tuple[str, ...] = ()
    min_words_range: tuple[int, int] = (40, 120)
    word_budget: int | None = None
    max_tries: int = 40
    classes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        anchor = (self.anchor,) if isinstance(self.anchor, str) else tuple(self.anchor or ())
        object.__setattr__(self, "anchor", anchor)
        classes = pools.expand_classes(self.classes)
        object.__setattr__(self, "classes", classes)
        if classes:
            missing = [c for c in classes if c not in {cid for _, cid in pools.pool(self.pool)}]
            if missing:
                raise ValueError(f"classes {missing} are not in constraint pool {self.pool!r}")
            if len(classes) + len(anchor) < self.min_constraints:
                raise ValueError(
                    f"{len(classes)} classes and {len(anchor)} anchors cannot make "
                    f"min_constraints={self.min_constraints} constraints"
                )
        object.__setattr__(self, "min_words_range", tuple(self.min_words_range))
        if not 1 <= self.min_constraints <= self.max_constraints <= MAX_SLOTS:
            raise ValueError(
                f"need 1 <= min_constraints <= max_constraints <= 5, got {self.min_constraints}..{self.max_constraints}"
            )
        unknown = [a for a in anchor if a not in ANCHORS]
        if unknown or len(set(anchor)) != len(anchor):
            raise ValueError(f"anchor must be distinct names from {ANCHORS}, got {anchor!r}")
        if len(anchor) > self.max_constraints:
            raise ValueError(f"{len(anchor)} anchors do not fit in {self.max_constraints} slots")
        lo, hi = self.min_words_range
        if not 1 <= lo <= hi:
            raise ValueError(f"min_words_range must satisfy 1 <= lo <= hi, got {(lo, hi)}")
        if self.word_budget is not None and self.word_budget < hi and "min_words" in anchor:
            raise ValueError(f"word_budget={self.word_budget} is below the length floor's upper end {hi}")
        pools.pool(self.pool)  # validates the name


_RNG_LOCK = threading.Lock()


@contextlib.contextmanager
def _library_random(rng: random.Random) -> Iterator[None]:
    """Make the checker modules draw their random arguments from ``rng`` (then restore)."""
    mods = [m for bench in checkers.BENCHMARKS for m in checkers.modules(bench)]
    with _RNG_LOCK:
        saved = [m.random for m in mods]
        for m in mods:
            m.random = rng
        try:
            yield
        finally:
            for m, original in zip(mods, saved):
                m.random = original


def _draw(key: pools.Key, rng: random.Random, base_task: str, kwargs: dict | None = None) -> dict:
    """One constraint: the library builds the sentence, drawing missing arguments from ``rng``."""
    benchmark, cid = key
    checker = checkers.registry(benchmark)[cid](cid)
    given = dict(kwargs or {})
    if cid == "combination:repeat_prompt":
        given["prompt_to_repeat"] = base_task
    with _library_random(rng):
        sentence = checker.build_description(**given)
    args = checker.get_instruction_args() or {}
    return {"benchmark": benchmark, "id": cid, "kwargs": dict(args), "sentence": sentence}


def _min_words_needed(c: dict) -> int:
    """Words a constraint forces at the least (for ``word_budget``; 0 when none)."""
    kw = c["kwargs"]
    if c["id"] == "length_constraints:number_words" and kw.get("relation") == "at least":
        return int(kw["num_words"])
    if c["id"] == "count:word_count_range":
        return int(kw["min_words"])
    if c["id"] == "count:unique_word_count":
        return int(kw["N"])
    return 0


def _acceptable(c: dict, chosen: Sequence[dict], base_task: str, cfg: GeneratorConfig) -> bool:
    if not isinstance(c["sentence"], str) or not c["sentence"].strip():
        return False
    # the recorded kwargs must rebuild the same sentence (what the checker will be built from)
    # without any random redraw: rebuilt under two different random streams. This rejects
    # argument sets the library itself redraws, e.g. IFEval's nth_paragraph_first_word can draw
    # "Paragraph 2" of a 1-paragraph answer (randint(1, num_paragraphs + 1)).
    for probe in (1, 2):
        with _library_random(random.Random(probe)):
            if checkers.describe(c["benchmark"], c["id"], c["kwargs"]) != c["sentence"]:
                return False
    if cfg.word_budget is not None and _min_words_needed(c) > cfg.word_budget:
        return False
    texts = [base_task] + [o["sentence"] for o in chosen]
    if any(c["sentence"] in t or t in c["sentence"] for t in texts):
        return False
    return not any(pools.conflicts(c, o, base_task) for o in chosen)


def build_prompt(base_task: str, sentences: Sequence[str]) -> str:
    """The user message: the base task, a blank line, one constraint sentence per line (the base
    task alone without sentences: what removing every sentence from a prompt leaves)."""
    return "\n\n".join([base_task, "\n".join(sentences)]) if sentences else base_task


def generate_one(index: int, cfg: GeneratorConfig) -> Example:
    """Example ``index`` of the stream defined by ``cfg`` (independent of other indices)."""
    rng = random.Random(f"mrtpo-instructions:{cfg.seed}:{index}")
    topic = rng.choice(TOPICS)
    template = rng.choice(TEMPLATES)
    base_task = template.format(topic=topic)
    target = rng.randint(cfg.min_constraints, cfg.max_constraints)
    chosen: list[dict] = []
    for name in cfg.anchor:
        for _ in range(cfg.max_tries):
            if name == "min_words":
                lo, hi = cfg.min_words_range
                floor = {"relation": "at least", "num_words": rng.randint(lo, hi)}
                c = _draw(("ifeval", "length_constraints:number_words"), rng, base_task, floor)
            else:  # "keywords"
                c = _draw(("ifeval", "keywords:existence"), rng, base_task)
            if _acceptable(c, chosen, base_task, cfg):
                break
        else:
            raise RuntimeError(f"could not place anchor {name!r} in example {index}")
        c["anchor"] = name
        chosen.append(c)
    candidates = [key for key in pools.pool(cfg.pool) if not cfg.classes or key[1] in cfg.classes]
    rng.shuffle(candidates)
    for key in candidates:
        if len(chosen) >= target:
            break
        if any(pools.class_conflict(key, (o["benchmark"], o["id"])) for o in chosen):
            continue
        for _ in range(cfg.max_tries):
            c = _draw(key, rng, base_task)
            if _acceptable(c, chosen, base_task, cfg):
                c["anchor"] = None
                chosen.append(c)
                break
    rng.shuffle(chosen)
    prompt = build_prompt(base_task, [c["sentence"] for c in chosen])
    for c in chosen:  # the evidence contract: each sentence verbatim exactly once
        if prompt.count(c["sentence"]) != 1:
            raise AssertionError(f"sentence not unique in prompt {index}: {c['sentence']!r}")
    return Example(
        id=f"instructions-train-s{cfg.seed}-{index:06d}",
        split="train",
        messages=[{"role": "user", "content": prompt}],
        gold={"prompt": prompt, "constraints": chosen},
        meta={
            "base_task": base_task,
            "topic": topic,
            "template": template,
            "target_constraints": target,
            "generator": asdict(cfg),
        },
    )


def generate(n: int, cfg: GeneratorConfig | None = None, start: int = 0) -> list[Example]:
    """Examples ``start .. start+n-1`` of the stream defined by ``cfg``."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    cfg = cfg or GeneratorConfig()
    return [generate_one(i, cfg) for i in range(start, start + n)]
