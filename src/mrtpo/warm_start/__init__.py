"""A short supervised warm start ("cold start") before RL: LoRA fine-tuning with TRL's ``SFTTrainer``.

Why: a reward that is the same for every completion of a group gives no advantage. The default
model never writes the instructed ``<tool_call>`` form on its own (docs/tasks/toolcall.md), so the
tool-calling ``format`` reward starts at a constant 0. A few SFT steps on the task's *training*
split, prompts rendered exactly as RL renders them and answers in the instructed form, move the
format rate off 0; the default dose is the one that left most sampled groups with format spread
(docs/results/2026-12-04-toolcall-warm-start.md), not 100 % format.

What is trained: LoRA adapters (peft) on all linear layers, constant learning rate (so the model
after ``k`` steps of a longer run is the model of a ``k``-step run), completion-only loss; then the
adapters are merged and the result is saved as an ordinary model folder (float32 safetensors),
which ``mrtpo train``, ``mrtpo eval`` and :func:`mrtpo.models.load_policy` all load.

Cache: like the model cache, built on first use: ``<model cache root>/warm-start/<model>-<task or
data>-<key>``, the key a hash of the settings, the base model's identity and the data's identity
(task name, categories and prompt text, or the data file's sha256). Written atomically.

Data (:mod:`mrtpo.warm_start.data`): a task's own pairs (``task.warm_start_pairs()``: ``(Example,
answer text)``, training split only) or a JSONL file of the user's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrtpo.task_base import implements
from mrtpo.warm_start.data import (
    WarmStartError,
    completion_for,
    file_rows,
    fit_rows,
    task_rows,
    text_token_ids,
)

logger = logging.getLogger(__name__)

__all__ = [
    "TASK_DEFAULTS",
    "WarmStartError",
    "WarmStartSettings",
    "build_warm_start",
    "completion_for",
    "file_rows",
    "fit_rows",
    "load_warm_start",
    "parse_warm_start",
    "resolve_for_run",
    "run_sft",
    "task_rows",
    "text_token_ids",
    "warm_start_dir",
]

_MARKER = "mrtpo_warm_start.json"
CACHE_FORMAT = 1


@dataclass(frozen=True)
class WarmStartSettings:
    """Every setting of one warm start (all of them go into the cache key)."""

    steps: int = 16
    """optimizer steps (0: no warm start; the base model as it is)"""
    learning_rate: float = 1e-4
    """constant learning rate of the LoRA adapters (no warm-up, no decay)"""
    batch_size: int = 4
    """pairs per optimizer step"""
    lora_r: int = 16
    """LoRA rank"""
    lora_alpha: float = 32.0
    """LoRA scaling alpha"""
    lora_dropout: float = 0.0
    """dropout on the LoRA branch"""
    target_modules: str | tuple[str, ...] = "all-linear"
    """modules that get adapters"""
    max_length: int = 1024
    """longest prompt + answer in tokens; longer pairs are left out"""
    text_tags: tuple[str, ...] = ()
    """strings of the answers written with ordinary text tokens even where the tokenizer has an added
    token for them. Qwen's added <tool_call> token starts at log-probability ~ -22 and LoRA raised it
    by only ~13 nats in 16 steps (measured); the same text spelled with ordinary tokens starts near
    the model's usual "<" and is learned in a few steps. The text, which the rewards read, is the same"""
    seed: int = 0
    """seed of the data order and the adapters' initialisation"""
    data: str | None = None
    """a JSONL file of the user's pairs (None: the task's own training pairs)"""
    limit: int | None = None
    """use only the first N pairs (None: all)"""

    def __post_init__(self) -> None:
        checks = [
            (isinstance(self.steps, int) and self.steps >= 0, "steps must be an integer >= 0"),
            (self.learning_rate > 0, "learning_rate must be > 0"),
            (isinstance(self.batch_size, int) and self.batch_size >= 1, "batch_size must be an integer >= 1"),
            (isinstance(self.lora_r, int) and self.lora_r >= 1, "lora_r must be an integer >= 1"),
            (self.lora_alpha > 0, "lora_alpha must be > 0"),
            (0 <= self.lora_dropout < 1, "lora_dropout must lie in [0, 1)"),
            (isinstance(self.max_length, int) and self.max_length >= 8, "max_length must be an integer >= 8"),
            (self.limit is None or (isinstance(self.limit, int) and self.limit >= 1), "limit must be >= 1 or null"),
        ]
        for ok, message in checks:
            if not ok:
                raise WarmStartError(f"warm_start: {message}")
        if isinstance(self.target_modules, list):
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
        if isinstance(self.text_tags, (list, str)):
            tags = [self.text_tags] if isinstance(self.text_tags, str) else self.text_tags
            object.__setattr__(self, "text_tags", tuple(tags))

    def record(self) -> dict[str, Any]:
        """The settings as plain JSON values."""
        out = dataclasses.asdict(self)
        for key in ("target_modules", "text_tags"):
            if isinstance(out[key], tuple):
                out[key] = list(out[key])
        return out


#: Tasks whose RL runs start from a warm start by default, with their settings (the dose table's pick).
TASK_DEFAULTS: dict[str, WarmStartSettings] = {
    # 7 steps: format rate 0.65 at T = 1 and 24/32 sampled groups with format spread (5 / 6 / 8 steps:
    # 0.08, 9/32 / 0.33, 25/32 / 0.84, 17/32; docs/results/2026-12-04-toolcall-warm-start.md)
    "toolcall": WarmStartSettings(steps=7, text_tags=("<tool_call>", "</tool_call>")),
}

_OFF = {"none", "off", "no", "false", "0"}
_ON = {"auto", "on", "yes", "true", "1", "default"}


def parse_warm_start(value: Any, task: str) -> tuple[WarmStartSettings | None, bool]:
    """``(settings or None, explicit)`` for a ``warm_start`` config value.

    ``auto`` (the default): the task's default warm start (:data:`TASK_DEFAULTS`), for the default
    model only, on which its dose was measured (``explicit`` False); ``none``/``off``/``false``: none;
    ``true``/``on``: the task's default for any model; a mapping: the task's defaults (or the plain
    defaults) with these keys replaced.
    """
    if value is None or (isinstance(value, bool) and not value):
        return None, True
    if isinstance(value, bool) or (isinstance(value, str) and value.strip().lower() in _ON):
        if task not in TASK_DEFAULTS:
            if isinstance(value, str) and value.strip().lower() == "auto":
                return None, False
            raise WarmStartError(
                f"warm_start: task {task!r} has no default warm start data; give a mapping "
                "with data: <file.jsonl> (or warm_start: none)"
            )
        explicit = not (isinstance(value, str) and value.strip().lower() == "auto")
        return TASK_DEFAULTS[task], explicit
    if isinstance(value, str):
        if value.strip().lower() in _OFF:
            return None, True
        raise WarmStartError(f"warm_start must be auto, none, true or a mapping of settings, got {value!r}")
    if isinstance(value, dict):
        known = {f.name for f in dataclasses.fields(WarmStartSettings)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise WarmStartError(f"warm_start: unknown setting(s) {unknown}; known: {sorted(known)}")
        base = TASK_DEFAULTS.get(task, WarmStartSettings())
        values = dict(value)
        for key in ("learning_rate", "lora_alpha", "lora_dropout"):
            if isinstance(values.get(key), str):
                try:
                    values[key] = float(values[key])
                except ValueError:
                    raise WarmStartError(f"warm_start: {key} must be a number, got {values[key]!r}") from None
        if task not in TASK_DEFAULTS and not values.get("data"):
            raise WarmStartError(
                f"warm_start: task {task!r} has no warm start data of its own; give data: <file.jsonl>"
            )
        try:
            return dataclasses.replace(base, **values), True
        except TypeError as exc:
            raise WarmStartError(f"warm_start: {exc}") from None
    raise WarmStartError(f"warm_start must be auto, none, true or a mapping of settings, got {type(value).__name__}")


def resolve_for_run(value: Any, task: str, model: str) -> tuple[WarmStartSettings | None, str]:
    """The warm start a training run starts from, and one line saying why (printed by ``mrtpo train``)."""
    from mrtpo.models import DEFAULT_MODEL

    settings, explicit = parse_warm_start(value, task)
    if settings is None:
        if explicit:
            return None, "warm start: off (warm_start: none)"
        return None, ""
    if not explicit and model != DEFAULT_MODEL:
        return None, (
            f"warm start: off for model {model!r} (the default dose was measured on {DEFAULT_MODEL}); "
            "warm_start: true or a mapping of settings builds one for it"
        )
    if settings.steps == 0:
        return None, "warm start: steps 0, the base model as it is"
    return settings, (
        f"warm start: {settings.steps} LoRA SFT steps on "
        f"{settings.data or task + ' training pairs'} (built and cached on first use; warm_start: none "
        "turns it off)"
    )


# --------------------------------------------------------------------------------------------
# Training.
# --------------------------------------------------------------------------------------------
def run_sft(
    model: Any,
    tokenizer: Any,
    rows: list[dict[str, str]],
    settings: WarmStartSettings,
    output_dir: str | os.PathLike,
    *,
    save_steps: int | None = None,
    log=logger.info,
) -> tuple[Any, dict[str, Any]]:
    """LoRA SFT of ``model`` on ``rows`` with TRL's ``SFTTrainer``; returns ``(merged model, stats)``.

    One pair per forward, ``batch_size`` of them accumulated per optimizer step: the same update as a
    batch of ``batch_size`` (TRL normalises by the step's completion tokens), without holding a
    batch's full-vocabulary logits at once (4 x 1,024 tokens x 152k vocabulary x fp32 went past 17 GB).

    ``save_steps``: also save the adapters every that many steps (``checkpoint-N`` folders under
    ``output_dir``, for dose measurements); by default nothing is saved there. The returned model is
    a plain transformers model with the adapters merged into its weights.
    """
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    if settings.steps == 0:
        return model, {"steps": 0, "seconds": 0.0, "pairs": len(rows)}
    cpu = not torch.cuda.is_available()
    config = SFTConfig(
        output_dir=str(output_dir),
        max_steps=settings.steps,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=settings.batch_size,
        learning_rate=settings.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_length=settings.max_length,
        completion_only_loss=True,
        packing=False,
        logging_steps=1,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        report_to="none",
        seed=settings.seed,
        data_seed=settings.seed,
        use_cpu=cpu,
        bf16=False if cpu else None,
        activation_checkpointing=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    lora = LoraConfig(
        r=settings.lora_r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.lora_dropout,
        target_modules=list(settings.target_modules)
        if isinstance(settings.target_modules, tuple)
        else settings.target_modules,
        task_type="CAUSAL_LM",
    )
    if settings.text_tags:  # tokenized here (TRL takes tokenized rows as they are): tags as ordinary tokens
        dataset = Dataset.from_list(
            [
                {"input_ids": p + c, "completion_mask": [0] * len(p) + [1] * len(c)}
                for r in rows
                for p, c in [
                    (
                        tokenizer(r["prompt"], add_special_tokens=False)["input_ids"],
                        text_token_ids(tokenizer, r["completion"], settings.text_tags),
                    )
                ]
            ]
        )
    else:
        dataset = Dataset.from_list([{"prompt": r["prompt"], "completion": r["completion"]} for r in rows])
    model.train()
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer, peft_config=lora)
    t0 = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - t0
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    merged = trainer.model.merge_and_unload()
    merged.eval()
    stats = {
        "steps": int(result.global_step),
        "seconds": round(seconds, 1),
        "pairs": len(rows),
        "seconds_per_step": round(seconds / max(result.global_step, 1), 2),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "losses": losses,
    }
    log(
        f"warm start: {stats['steps']} steps in {seconds:.0f} s ({stats['seconds_per_step']} s/step), loss "
        f"{stats['first_loss']} -> {stats['last_loss']}"
    )
    return merged, stats


# --------------------------------------------------------------------------------------------
# Cache.
# --------------------------------------------------------------------------------------------
def _base_identity(model: str) -> dict[str, Any]:
    from mrtpo.models import resolve_model

    src = resolve_model(model)
    if src.kind == "preset":
        return {"preset": src.name, "sha256": src.preset.sha256}
    if src.kind == "hub":
        return {"hub": src.hub_id}
    st = src.path.stat()
    return {"path": str(src.path), "mtime_ns": st.st_mtime_ns}


def _data_identity(settings: WarmStartSettings, task: Any) -> dict[str, Any]:
    if settings.data:
        path = Path(settings.data)
        if not path.is_file():
            raise WarmStartError(f"warm start data {path} does not exist")
        return {"file_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    if not implements(task, "warm_start_identity"):
        raise WarmStartError(f"task {getattr(task, 'name', task)!r} has no warm start pairs of its own; give data")
    return {"task": task.name, **task.warm_start_identity()}


def warm_start_dir(
    model: str, settings: WarmStartSettings, task: Any = None, cache_dir: str | os.PathLike | None = None
) -> Path:
    """The cache folder of this warm start (it may not exist yet)."""
    from mrtpo.models import cache_root, resolve_model

    blob = json.dumps(
        {
            "format": CACHE_FORMAT,
            "base": _base_identity(model),
            "settings": settings.record(),
            "data": _data_identity(settings, task),
        },
        sort_keys=True,
    )
    key = hashlib.sha256(blob.encode()).hexdigest()[:10]
    what = Path(settings.data).stem if settings.data else getattr(task, "name", "task")
    return cache_root(cache_dir) / "warm-start" / f"{resolve_model(model).name}-{what}-{settings.steps}steps-{key}"


def _complete(entry: Path) -> dict | None:
    try:
        info = json.loads((entry / _MARKER).read_text())
    except (OSError, ValueError):
        return None
    return info if info.get("format") == CACHE_FORMAT and (entry / "config.json").is_file() else None


def build_warm_start(
    model: str, settings: WarmStartSettings, task: Any = None, out: str | os.PathLike | None = None, *, log=logger.info
) -> Path:
    """Train the warm start and save the merged model folder at ``out`` (written atomically)."""
    import torch

    from mrtpo.models import load_policy

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    try:
        t0 = time.perf_counter()
        base, tokenizer = load_policy(model, dtype=torch.float32)
        rows = (
            file_rows(settings.data, tokenizer, settings.limit)
            if settings.data
            else task_rows(task, tokenizer, settings.limit)
        )
        rows, dropped = fit_rows(rows, tokenizer, settings.max_length)
        log(
            f"warm start: {len(rows)} pairs ({dropped} longer than {settings.max_length} tokens left out), "
            f"{settings.steps} steps x {settings.batch_size}, lr {settings.learning_rate}, LoRA r={settings.lora_r}"
        )
        merged, stats = run_sft(base, tokenizer, rows, settings, tmp / "trainer", log=log)
        staged = tmp / "model"
        merged.save_pretrained(staged, safe_serialization=True)
        tokenizer.save_pretrained(staged)
        record = {
            "format": CACHE_FORMAT,
            "base_model": model,
            "base": _base_identity(model),
            "task": getattr(task, "name", None),
            "data": _data_identity(settings, task),
            "settings": settings.record(),
            "pairs": len(rows),
            "left_out_longer": dropped,
            "train": {k: v for k, v in stats.items() if k != "losses"},
            "losses": stats.get("losses", []),
            "built_s": round(time.perf_counter() - t0, 1),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "torch_threads": torch.get_num_threads(),
        }
        (staged / _MARKER).write_text(json.dumps(record, indent=2) + "\n")
        if out.exists():
            if _complete(out) is not None and out.parent.name == "warm-start":
                return out  # another process finished it meanwhile
            stale = out.with_name(f".stale-{out.name}-{os.getpid()}")
            os.replace(out, stale)
            shutil.rmtree(stale, ignore_errors=True)
        os.replace(staged, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_warm_start(
    model: str,
    settings: WarmStartSettings,
    task: Any = None,
    dtype: Any = None,
    cache_dir: str | os.PathLike | None = None,
    *,
    log=logger.info,
):
    """``(model, tokenizer, folder)``: the warm-started policy, built and cached on first use."""
    import torch

    from mrtpo.models import load_policy

    entry = warm_start_dir(model, settings, task, cache_dir)
    if _complete(entry) is None:
        log(f"warm start: building {entry} (once; later runs load it)")
        build_warm_start(model, settings, task, entry, log=log)
    policy, tokenizer = load_policy(entry, dtype=dtype or torch.float32)
    return policy, tokenizer, entry
