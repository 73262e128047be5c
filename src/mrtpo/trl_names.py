"""TRL's setting names and knobs on mrtpo's config: aliases, refusals with their reason, suggestions.

A TRL script's settings (``TrlParser``'s ``ScriptArguments`` / ``ModelConfig`` / ``GRPOConfig``)
mostly carry over: every ``GRPOConfig`` field is an ``MRTPOConfig`` field, and the ``ModelConfig``
names below are aliases of mrtpo's run settings. The names mrtpo does not take get a message that
says what to use instead, never a did-you-mean to an unrelated key (``use_peft`` is not
``use_cpu``). Pure functions of the given mappings (no import of the config itself).
"""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Iterable, Mapping
from typing import Any

#: TRL name -> mrtpo key with the same meaning.
ALIASES: dict[str, str] = {"model_name_or_path": "model", "torch_dtype": "dtype"}
#: LoRA rank ``use_peft: true`` gives when no layer sets ``lora_r`` (TRL ModelConfig's default ``lora_r``).
PEFT_DEFAULT_R = 16

_TASK_FILE = ("mrtpo trains on a task: put the dataset in a task file (dataset: <file, folder or hub id>, "
              "prompt: <column>, rewards: [...]) and give --task task.yaml (docs/training.md, 'Your own task')")
_QUANTIZED = ("4-/8-bit (QLoRA) training is not supported: mrtpo loads the policy itself, in float32 or bfloat16 "
              "(the update, the evidence replays and the export all read those weights), and no quantized load is "
              "wired or tested; use LoRA (lora_r: 16) on bfloat16 weights (dtype: bfloat16)")
#: TRL / transformers names mrtpo does not take -> what to do instead.
NOT_TAKEN: dict[str, str] = {
    "dataset_name": _TASK_FILE,
    "dataset_config": "the dataset's configuration is the task file's subset key; " + _TASK_FILE,
    "dataset_train_split": "the task file's train_split key; " + _TASK_FILE,
    "dataset_test_split": "the task file's eval_split key; " + _TASK_FILE,
    "dataset_streaming": "task files load the dataset whole (streaming datasets are not supported)",
    "reward_funcs": "rewards are the task's: a task file's rewards: list (file.py:fn, pkg.module:fn or pkg.module.fn), "
                    "or a built-in task's verifiers; " + _TASK_FILE,
    "reward_model_name_or_path": "reward models are not taken from the command line; pass one to MRTPOTrainer in a "
                                 "script (reward_funcs=[model]) or write a reward function",
    "model_revision": "give model_init_kwargs={revision: <branch, tag or commit>} (hub ids only)",
    "attn_implementation": "give model_init_kwargs={attn_implementation: sdpa}",
    "load_in_4bit": _QUANTIZED, "load_in_8bit": _QUANTIZED, "bnb_4bit_quant_type": _QUANTIZED,
    "use_bnb_nested_quant": _QUANTIZED, "bnb_4bit_quant_storage": _QUANTIZED,
    "quantization_config": _QUANTIZED,
    "lora_task_type": "mrtpo's adapters are CAUSAL_LM (the only task type a policy has)",
    "lora_target_parameters": "not supported; name modules with lora_target_modules",
    "lora_modules_to_save": "not supported; mrtpo's LoRA trains the adapters only",
    "use_rslora": "not supported; set lora_alpha instead (rsLoRA scales by lora_alpha / sqrt(r))",
    "use_dora": "not supported (DoRA is untested with the evidence replays)",
}


def translate(layer: Mapping[str, Any], merged: Mapping[str, Any]) -> dict[str, Any]:
    """``layer`` with TRL's names as mrtpo's: :data:`ALIASES`, and ``use_peft`` as a LoRA rank.

    ``use_peft: true`` turns LoRA on at rank :data:`PEFT_DEFAULT_R` unless this layer or an earlier one
    (``merged``) already sets ``lora_r`` > 0; ``use_peft: false`` is ``lora_r: 0``. An alias and its
    target in one layer: the target wins, as for transformers' deprecated names.
    """
    out: dict[str, Any] = {}
    for key, value in layer.items():
        if key == "use_peft":
            on = value if isinstance(value, bool) else str(value).lower() in ("true", "yes", "1")
            if not on and "lora_r" not in layer:
                out["lora_r"] = 0
            elif on and "lora_r" not in layer and not (merged.get("lora_r") or 0) > 0:
                out["lora_r"] = PEFT_DEFAULT_R
            continue
        name = ALIASES.get(key, key)
        if name != key and name in layer:
            continue
        out[name] = value
    return out


def unknown_key_message(key: str, known: Iterable[str]) -> str:
    """What to say about a config key mrtpo does not know: :data:`NOT_TAKEN`'s reason, or the closest
    known key where it is close (a typo), or nothing."""
    if key in NOT_TAKEN:
        return f"; {NOT_TAKEN[key]}"
    close = suggest(key, known)
    return f" (did you mean {close!r}?)" if close else ""


def suggest(key: str, known: Iterable[str]) -> str | None:
    """The known key ``key`` is a typo of, or None. Close by spelling (difflib ratio >= 0.75) and, word by
    word, each word close to the known key's word in its place (``learnig_rate`` -> ``learning_rate``),
    so a shared word alone suggests nothing (``use_peft`` is not ``use_cpu``, ``lora_rank`` not
    ``local_rank``); a key with another number of words must be closer (ratio >= 0.85)."""
    known = list(known)
    spelled = key.replace("-", "_")
    if spelled in known:
        return spelled
    words = spelled.split("_")
    for close in difflib.get_close_matches(spelled, known, n=5, cutoff=0.75):
        theirs = close.split("_")
        if len(theirs) == len(words):
            if all(_ratio(a, b) >= 0.75 for a, b in zip(words, theirs)):
                return close
        elif _ratio(spelled, close) >= 0.85:
            return close
    return None


def _ratio(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def optional_dependency_problem(settings: Mapping[str, Any]) -> str | None:
    """Why a trainer setting needs a package that is not installed (TRL would raise an ImportError
    once the model had loaded), or None."""
    needs = [("use_vllm", "vllm", "vllm generation (use_vllm) needs the 'vllm' package and a CUDA GPU: "
                                  "`pip install vllm`, or use_vllm=false (transformers generation)"),
             ("use_liger_kernel", "liger_kernel", "use_liger_kernel needs the 'liger-kernel' package: "
                                                  "`pip install liger-kernel`; TRL 1.16 prefers "
                                                  "model_init_kwargs={use_kernels: true}")]
    for key, package, message in needs:
        if settings.get(key) and importlib.util.find_spec(package) is None:
            return message
    return None


__all__ = ["ALIASES", "NOT_TAKEN", "PEFT_DEFAULT_R", "optional_dependency_problem", "suggest", "translate",
           "unknown_key_message"]
