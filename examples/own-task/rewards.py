"""Rewards of the own-task example: ordinary TRL reward functions, ``fn(prompts, completions, **columns)``.

The prompts are chat messages, so (as in TRL) each completion arrives as one assistant message,
``[{"role": "assistant", "content": text}]``; TRL calls each function once per batch, every dataset
column as a keyword (``last_word``: one entry per completion).

Two declare their evidence with ``@evidence``: the dataset column whose text (shown in the prompt)
the check depends on. MRTPO replays each completion without that text to find the tokens the
reward is about. The third has no evidence: its credit is spread evenly, as in GRPO.
"""

from mrtpo import evidence


@evidence("rule")  # the sentence "Do not use any commas." in the prompt
def no_commas(prompts, completions, **kwargs):
    """1 when the answer has no comma, else 0."""
    return [0.0 if "," in c[0]["content"] else 1.0 for c in completions]


@evidence("last_word")  # the word the answer must end with, as it appears in the prompt
def ends_with_word(prompts, completions, last_word, **kwargs):
    """1 when the answer's last word is the requested one (case and final punctuation ignored)."""
    scores = []
    for c, word in zip(completions, last_word):
        words = c[0]["content"].strip().rstrip(".!?\"'").split()
        scores.append(float(bool(words) and words[-1].lower() == word.lower()))
    return scores


def short(prompts, completions, **kwargs):
    """Prefer one sentence: 1 up to 20 words, falling linearly to 0 at 60."""
    return [max(0.0, min(1.0, (60 - len(c[0]["content"].split())) / 40)) for c in completions]
