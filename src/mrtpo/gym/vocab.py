"""The gym's word-level vocabulary, tokenizer and chat template.

Every gym prompt and response is a sequence of words from :data:`WORDS`; a ``tokenizers``
``WordLevel`` model over them (whitespace-split, one token per word, decoded by joining with
spaces) makes token ``t`` of a response exactly its word ``t``, so a verifier's ground-truth word
positions are token positions, and the end-of-turn token sits at index ``len(words)``.
"""

from __future__ import annotations

from mrtpo.counterfactual import DEFAULT_PRIVILEGED_HEADER

#: Content words by category (the ``filter`` operation and the call schemas read the categories).
CATEGORIES: dict[str, tuple[str, ...]] = {
    "animal": ("cat", "dog", "fox", "owl", "bee", "ant", "cow", "pig", "hen", "elk", "yak", "eel"),
    "color": ("red", "blue", "green", "gold", "pink", "gray", "teal", "tan", "jade", "rose", "navy", "lime"),
    "food": ("apple", "bread", "rice", "corn", "plum", "pear", "fig", "kale", "bean", "nut", "pie", "egg"),
    "place": ("paris", "rome", "oslo", "lima", "cairo", "delhi", "tokyo", "quito", "perth", "bern", "doha", "riga"),
}
CONTENT: tuple[str, ...] = tuple(w for words in CATEGORIES.values() for w in words)
#: Words a response may use to fill space between the words its clauses ask for.
FILLERS: tuple[str, ...] = ("the", "a", "and", "of", "to", "in", "on", "with", "so", "then")
MAX_NUMBER = 160
NUMBERS: tuple[str, ...] = tuple(str(i) for i in range(MAX_NUMBER + 1))
#: Words of the prompts' instructions, the wrappers and the call syntax.
SYNTAX: tuple[str, ...] = (
    "user",
    "assistant",
    "system",
    ":",
    ".",
    ",",
    "(",
    ")",
    "=",
    ";",
    "[",
    "]",
    "topic",
    "rules",
    "include",
    "avoid",
    "start",
    "end",
    "with",
    "before",
    "exactly",
    "times",
    "length",
    "words",
    "about",
    "at",
    "least",
    "twice",
    "items",
    "op",
    "reverse",
    "sort",
    "keep",
    "copy",
    "answer",
    "inside",
    "<ans>",
    "</ans>",
    "tools",
    "request",
    "call",
    "set",
    "<call>",
    "</call>",
    "format",
    "wrap",
    "only",
    *DEFAULT_PRIVILEGED_HEADER.split(),
    # function and argument names of the call family
    "find",
    "book",
    "order",
    "send",
    "city",
    "day",
    "food",
    "size",
    "pet",
    "color",
    "name",
    "count",
    "animal",
    "place",
    "mon",
    "tue",
    "wed",
    "thu",
    "fri",
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]")
WORDS: tuple[str, ...] = tuple(dict.fromkeys((*SYNTAX, *CONTENT, *FILLERS, *NUMBERS)))

#: ChatML with words: ``<|im_start|> user : … <|im_end|>``, then the generation prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|> ' + message['role'] + ' : ' + message['content'] + ' <|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|> assistant :' }}{%- endif %}"
)


def gym_tokenizer():
    """A ``PreTrainedTokenizerFast`` over :data:`WORDS`: one id per word, ChatML specials, a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *WORDS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="[UNK]",
        bos_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


__all__ = ["CATEGORIES", "CHAT_TEMPLATE", "CONTENT", "FILLERS", "NUMBERS", "SPECIAL_TOKENS", "WORDS", "gym_tokenizer"]
