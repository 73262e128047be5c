"""Every constraint class a training pool can draw has a hand-written passing and failing response.

Each case was written against the checker's documented rule (the benchmark's definition), not
by running it; the expected booleans are what the rule says. Scored through the adapter path
the slot verifiers use (``checkers.check_strict``).
"""

from __future__ import annotations

import pytest

from mrtpo.tasks.instructions import checkers, pools

PROMPT = "Write a poem about tea."

# (benchmark, id, kwargs, passing response, failing response)
CASES: list[tuple[str, str, dict, str, str]] = [
    # ---------------- IFEval ----------------
    (
        "ifeval",
        "keywords:existence",
        {"keywords": ["river", "lantern"]},
        "The lantern glowed by the river.",
        "The lamp glowed by the lake.",
    ),
    (
        "ifeval",
        "keywords:frequency",
        {"keyword": "tea", "frequency": 3, "relation": "at least"},
        "Tea is good. I drink tea daily. Green tea is best.",
        "Tea is good. I drink tea daily.",
    ),
    (
        "ifeval",
        "keywords:forbidden_words",
        {"forbidden_words": ["cloud", "rain"]},
        "The sky was clear all day.",
        "A dark cloud passed over the town.",
    ),
    (
        "ifeval",
        "keywords:letter_frequency",
        {"letter": "z", "let_frequency": 2, "let_relation": "at least"},
        "The zebra watched the lizard.",
        "The zebra ran home.",
    ),
    (
        "ifeval",
        "language:response_language",
        {"language": "fr"},
        "Bonjour, je m'appelle Marie et j'habite à Paris depuis dix ans. J'aime beaucoup cette ville et ses musées.",
        "Hello, my name is Mary and I have lived in London for ten years. I love this city.",
    ),
    (
        "ifeval",
        "length_constraints:number_sentences",
        {"num_sentences": 3, "relation": "less than"},
        "I like tea. You like coffee.",
        "I like tea. You like coffee. We both like water. They like juice.",
    ),
    (
        "ifeval",
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 2},
        "Tea comes from leaves.\n***\nIt is brewed in hot water.",
        "Tea comes from leaves.",
    ),
    (
        "ifeval",
        "length_constraints:number_words",
        {"num_words": 10, "relation": "at least"},
        "Green tea is brewed with water that is hot but not boiling.",
        "Tea is nice.",
    ),
    (
        "ifeval",
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "finally"},
        "Bees make honey all summer.\n\nFinally they rest in winter.",
        "Bees make honey all summer.\n\nThen they rest in winter.",
    ),
    (
        "ifeval",
        "detectable_content:number_placeholders",
        {"num_placeholders": 2},
        "Send the parcel to [name] at [address].",
        "Send the parcel to [name] at home.",
    ),
    (
        "ifeval",
        "detectable_content:postscript",
        {"postscript_marker": "P.S."},
        "Thanks for reading my letter.\n\nP.S. See you next week.",
        "Thanks for reading my letter.",
    ),
    (
        "ifeval",
        "detectable_format:number_bullet_lists",
        {"num_bullets": 2},
        "* Apples\n* Pears",
        "* Apples\n* Pears\n* Plums",
    ),
    (
        "ifeval",
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 2},
        "Here is *the first part* and *the second part* of it.",
        "Here is *the only part* of it.",
    ),
    (
        "ifeval",
        "detectable_format:multiple_sections",
        {"section_spliter": "Section", "num_sections": 2},
        "Section 1\nTea grows on hills.\nSection 2\nIt is picked by hand.",
        "Section 1\nTea grows on hills and is picked by hand.",
    ),
    (
        "ifeval",
        "detectable_format:json_format",
        {},
        '```json\n{"drink": "tea", "hot": true}\n```',
        "drink: tea, hot: true",
    ),
    (
        "ifeval",
        "detectable_format:title",
        {},
        "<<Ode to Tea>>\nSteam rises from the cup.",
        "Ode to Tea\nSteam rises from the cup.",
    ),
    (
        "ifeval",
        "combination:two_responses",
        {},
        "Tea is calming.\n******\nCoffee is energizing.",
        "Tea is calming.\n******\nTea is calming.",
    ),
    (
        "ifeval",
        "combination:repeat_prompt",
        {"prompt_to_repeat": PROMPT},
        PROMPT + "\nSteam curls above the cup of tea.",
        "Here is a poem: steam curls above the cup.",
    ),
    (
        "ifeval",
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
        "Tea has been drunk for centuries. Any other questions?",
        "Any other questions? Tea has been drunk for centuries.",
    ),
    (
        "ifeval",
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "at least"},
        "The NASA and ESA teams met in Paris.",
        "The NASA team met in Paris.",
    ),
    (
        "ifeval",
        "change_case:english_capital",
        {},
        "THIS ANSWER IS WRITTEN ENTIRELY IN CAPITAL LETTERS AND IN THE ENGLISH LANGUAGE.",
        "This answer is written in ordinary sentence case and in the English language.",
    ),
    (
        "ifeval",
        "change_case:english_lowercase",
        {},
        "this answer is written entirely in lowercase letters and in the english language.",
        "This answer is written in ordinary sentence case and in the English language.",
    ),
    ("ifeval", "punctuation:no_comma", {}, "There is no comma in this sentence.", "Yes, there is a comma in this one."),
    (
        "ifeval",
        "startend:quotation",
        {},
        '"The whole answer is wrapped in double quotes."',
        "The whole answer is not wrapped in quotes.",
    ),
    # ---------------- IFBench ----------------
    (
        "ifbench",
        "count:word_count_range",
        {"min_words": 5, "max_words": 8},
        "one two three four five six",
        "one two three",
    ),
    ("ifbench", "count:unique_word_count", {"N": 5}, "alpha beta gamma delta epsilon", "tea tea tea tea tea tea"),
    (
        "ifbench",
        "ratio:stop_words",
        {"percentage": 30},
        "Bees produce honey daily.",
        "The bees and the flowers are in the garden.",
    ),
    (
        "ifbench",
        "count:conjunctions",
        {"small_n": 3},
        "I came and I saw but I left so it ended.",
        "I came and I saw it.",
    ),
    (
        "ifbench",
        "count:person_names",
        {"N": 3},
        "Emma met Liam and Noah at the station.",
        "Emma met Liam at the station.",
    ),
    ("ifbench", "count:numbers", {"N": 2}, "I have 3 cats and 4 dogs.", "I have 3 cats."),
    ("ifbench", "count:pronouns", {"N": 3}, "I told her that we would come.", "The dog ran home."),
    (
        "ifbench",
        "count:keywords_multiple",
        {"keyword1": "sun", "keyword2": "moon", "keyword3": "star", "keyword4": "rain", "keyword5": "wind"},
        "sun moon moon star star star rain rain rain rain rain wind wind wind wind wind wind wind",
        "sun moon star rain wind",
    ),
    (
        "ifbench",
        "sentence:keyword",
        {"word": "honey", "N": 2},
        "Bees fly far. They make honey. The end.",
        "Bees make honey. They fly far.",
    ),
    ("ifbench", "words:repeats", {"small_n": 2}, "Tea is warm and tea is calm.", "Tea tea tea is warm."),
    ("ifbench", "format:emoji", {}, "I love tea 🍵. Bees are busy 🐝.", "I love tea. Bees are busy 🐝."),
    (
        "ifbench",
        "format:list",
        {"sep": "SEPARATOR"},
        "apples SEPARATOR pears SEPARATOR plums",
        "apples and pears and plums",
    ),
    (
        "ifbench",
        "format:thesis",
        {},
        "<i>Tea shaped trade routes.</i> Merchants carried it across deserts.",
        "Tea shaped trade routes. Merchants carried it across deserts.",
    ),
    ("ifbench", "format:sub-bullets", {}, "* Fruit\n  - apples\n* Vegetables\n  - carrots", "* Fruit\n* Vegetables"),
    (
        "ifbench",
        "format:no_bullets_bullets",
        {},
        "Tea is good. Coffee is fine.\n* green tea\n* black tea",
        "* green tea\n* black tea",
    ),
    (
        "ifbench",
        "format:output_template",
        {},
        "My Answer: yes My Conclusion: tea is good Future Outlook: more tea",
        "My Answer: yes",
    ),
    (
        "ifbench",
        "format:title_case",
        {},
        "The Quick Brown Fox Jumps Over Fences",
        "The quick brown fox jumps over fences",
    ),
    ("ifbench", "format:parentheses", {}, "Look (at [this {nest (of [five])}]) here.", "Look (at [this] one) here."),
    (
        "ifbench",
        "format:quotes",
        {},
        'He said "she wrote \'they said "go now" soon\' today" again.',
        'He said "hello" to me.',
    ),
    ("ifbench", "count:punctuation", {}, "Wait?! Yes. No, maybe; first: second! Really?", "Hello, world."),
    (
        "ifbench",
        "ratio:sentence_type",
        {},
        "I like tea. You like coffee. Do you like water?",
        "I like tea. Do you like coffee?",
    ),
    ("ifbench", "ratio:sentence_balance", {}, "I like tea. Do you? Wow!", "I like tea. Do you?"),
    (
        "ifbench",
        "words:paragraph_last_first",
        {},
        "Tea is lovely tea.\nBees buzz like bees.",
        "Tea is lovely.\nBees buzz.",
    ),
]


def test_every_training_class_has_a_case() -> None:
    covered = {(b, i) for b, i, *_ in CASES}
    assert covered == set(pools.pool("all"))
    assert len(covered) == len(CASES)  # one case per class, no duplicates


@pytest.mark.parametrize("benchmark,cid,kwargs,good,bad", CASES, ids=[f"{b}/{i}" for b, i, *_ in CASES])
def test_pass_and_fail(benchmark: str, cid: str, kwargs: dict, good: str, bad: str) -> None:
    # the kwargs are a complete argument set: the description builds without random draws
    sentence = checkers.describe(benchmark, cid, kwargs)
    assert sentence == checkers.describe(benchmark, cid, kwargs)
    assert checkers.check_strict(benchmark, cid, kwargs, good, PROMPT) is True
    assert checkers.check_strict(benchmark, cid, kwargs, bad, PROMPT) is False
