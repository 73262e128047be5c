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
from pathlib import Path
from typing import Any

#: TRL name -> mrtpo key with the same meaning.
ALIASES: dict[str, str] = {"model_name_or_path": "model", "torch_dtype": "dtype"}
#: LoRA rank ``use_peft: true`` gives when no layer sets ``lora_r`` (TRL ModelConfig's default ``lora_r``).
PEFT_DEFAULT_R = 16

_QUANTIZED = (
    "4-/8-bit (QLoRA) training is not supported: mrtpo loads the policy itself, in float32 or bfloat16 "
    "(the update, the evidence replays and the export all read those weights), and no quantized load is "
    "wired or tested; use LoRA (lora_r: 16) on bfloat16 weights (dtype: bfloat16)"
)
#: TRL / transformers names mrtpo does not take -> what to do instead.
NOT_TAKEN: dict[str, str] = {
    "reward_model_name_or_path": "reward models are not taken from the command line; pass one to MRTPOTrainer in a "
    "script (reward_funcs=[model]) or write a reward function",
    "dataset_streaming": "task files load the dataset whole (streaming datasets are not supported)",
    "model_revision": "give model_init_kwargs={revision: <branch, tag or commit>} (hub ids only)",
    "attn_implementation": "give model_init_kwargs={attn_implementation: sdpa}",
    "load_in_4bit": _QUANTIZED,
    "load_in_8bit": _QUANTIZED,
    "bnb_4bit_quant_type": _QUANTIZED,
    "use_bnb_nested_quant": _QUANTIZED,
    "bnb_4bit_quant_storage": _QUANTIZED,
    "quantization_config": _QUANTIZED,
    "lora_task_type": "mrtpo's adapters are CAUSAL_LM (the only task type a policy has)",
    "lora_target_parameters": "not supported; name modules with lora_target_modules",
    "lora_modules_to_save": "not supported; mrtpo's LoRA trains the adapters only",
    "use_rslora": "not supported; set lora_alpha instead (rsLoRA scales by lora_alpha / sqrt(r))",
    "use_dora": "not supported (DoRA is untested with the evidence replays)",
}


#: TRL script arguments that make a task (:func:`script_task`) -> the task-file key each sets.
SCRIPT_KEYS = {
    "dataset_name": "dataset",
    "dataset_config": "subset",
    "dataset_train_split": "train_split",
    "dataset_test_split": "eval_split",
    "reward_funcs": "rewards",
}
#: The short names TRL's ``grpo`` script takes for its built-in rewards.
TRL_REWARDS = {
    "accuracy_reward": "trl.rewards.accuracy_reward",
    "reasoning_accuracy_reward": "trl.rewards.reasoning_accuracy_reward",
    "think_format_reward": "trl.rewards.think_format_reward",
}


def script_task(script: Mapping[str, Any], cwd: Path, folder: Path) -> Path:
    """A task file for TRL script arguments (``--dataset_name data.jsonl --reward_funcs think_format_reward``),
    written to ``folder`` (named by its content, so the same arguments give the same file) and returned.

    As in TRL's ``grpo`` script: the prompt column is ``prompt``; ``reward_funcs`` are TRL's short names or
    dotted paths (``my_rewards.fn`` imports ``my_rewards.py`` from ``cwd``); a relative dataset path is taken
    from ``cwd``. ``ValueError`` when no dataset or no reward is given.
    """
    import hashlib

    import yaml

    block: dict[str, Any] = {SCRIPT_KEYS[k]: v for k, v in script.items() if v is not None}
    if not block.get("dataset"):
        raise ValueError("reward_funcs needs dataset_name (a data file, a saved dataset folder or a hub id)")
    rewards = block.get("rewards")
    rewards = [rewards] if isinstance(rewards, str) else list(rewards or [])
    if not rewards:
        raise ValueError(
            "dataset_name needs reward_funcs: TRL's think_format_reward, accuracy_reward or "
            "reasoning_accuracy_reward, or dotted paths (my_rewards.fn)"
        )
    block["rewards"] = [_reward_ref(str(r), cwd) for r in rewards]
    local = cwd / str(block["dataset"])
    if local.exists():
        block["dataset"] = str(local.resolve())
    block.setdefault("prompt", "prompt")
    block["name"] = Path(str(script["dataset_name"])).stem.replace("/", "-") or "task"
    text = yaml.safe_dump(block, sort_keys=True)
    path = folder / f"{block['name']}-{hashlib.sha1(text.encode()).hexdigest()[:10]}.yaml"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text("# written by mrtpo train from TRL script arguments (dataset_name, reward_funcs)\n" + text)
    return path


def task_cache() -> Path:
    """Where :func:`script_task` writes its task files: ``$MRTPO_CACHE/tasks``, else ``~/.cache/mrtpo/tasks``."""
    import os

    root = os.environ.get("MRTPO_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "mrtpo") / "tasks"


def _reward_ref(ref: str, cwd: Path) -> str:
    """A ``reward_funcs`` entry as a task file's reward path: TRL's short name, a module in ``cwd`` by its file."""
    if ref in TRL_REWARDS:
        return TRL_REWARDS[ref]
    module, _, fn = ref.rpartition(".")
    local = cwd / (module.replace(".", "/") + ".py")
    if module and ":" not in ref and local.is_file():
        return f"{local.resolve()}:{fn}"
    return ref


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
    needs = [
        (
            "use_vllm",
            "vllm",
            "vllm generation (use_vllm) needs the 'vllm' package and a CUDA GPU: "
            "`pip install vllm`, or use_vllm=false (transformers generation)",
        ),
        (
            "use_liger_kernel",
            "liger_kernel",
            "use_liger_kernel needs the 'liger-kernel' package: "
            "`pip install liger-kernel`; TRL 1.16 prefers "
            "model_init_kwargs={use_kernels: true}",
        ),
    ]
    for key, package, message in needs:
        if settings.get(key) and importlib.util.find_spec(package) is None:
            return message
    return None


__all__ = [
    "ALIASES",
    "NOT_TAKEN",
    "PEFT_DEFAULT_R",
    "SCRIPT_KEYS",
    "TRL_REWARDS",
    "optional_dependency_problem",
    "script_task",
    "suggest",
    "task_cache",
    "translate",
    "unknown_key_message",
]
