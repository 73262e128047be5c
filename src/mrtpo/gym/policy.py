"""The gym's tiny policy: a ~1 M-parameter Qwen2 model over the word vocabulary, warm-started from
the noisy demonstrator and cached by its settings.

The warm start is a plain supervised pass (next-token loss on the response words and the end-of-turn
token) over fresh demonstrations of the task (:meth:`GymTask.demonstration`). Because the
demonstrator meets each reward with probability ``p_follow``, the warm-started policy starts with
reward spread inside groups; because some demonstrations hide an in-prompt clause or show the
privileged reference, it conditions on the evidence the replays add or remove. Built once per
(task settings, :class:`PolicySpec`) under ``<model cache>/gym/`` and reloaded in well under a second.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from mrtpo.gym.vocab import gym_tokenizer

logger = logging.getLogger(__name__)

#: Bump when the demonstrations or the training recipe change, so stale caches are not reused.
RECIPE_VERSION = 3


@dataclass(frozen=True)
class PolicySpec:
    """Model shape and warm-start recipe (one-line docs: what each knob is)."""

    hidden_size: int = 96
    """width of the residual stream"""
    num_layers: int = 3
    """transformer blocks"""
    num_heads: int = 4
    """attention heads (2 key/value heads)"""
    intermediate_size: int = 256
    """MLP width"""
    seed: int = 0
    """initialisation and demonstration seed"""
    steps: int = 1000
    """warm-start optimizer steps (each family sets its own: GymTask.warm_start_steps)"""
    batch_size: int = 32
    """demonstrations per warm-start step"""
    learning_rate: float = 3e-3
    """peak AdamW learning rate (cosine decay to 10 %)"""


def build_model(spec: PolicySpec, tokenizer):
    """A randomly initialised Qwen2 causal LM of ``spec``'s shape over ``tokenizer``'s vocabulary."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return model


def demonstration_batch(
    task, tokenizer, rng: random.Random, size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``size`` fresh demonstrations as ``(input_ids, attention_mask, labels)``, each ``(B, L)``,
    right-padded; labels are -100 except on the response words and the end-of-turn token."""
    rows = []
    for _ in range(size):
        example = task.warm_example(rng)
        messages, words = task.demonstration(example, rng)
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        r_ids = tokenizer(" ".join(words), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((p_ids, r_ids))
    length = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((size, length), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((size, length), -100, dtype=torch.long)
    mask = torch.zeros(size, length, dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        n = len(p) + len(r)
        ids[i, :n] = torch.tensor(p + r)
        labels[i, len(p) : n] = torch.tensor(r)
        mask[i, :n] = 1
    return ids, mask, labels


def warm_start(task, spec: PolicySpec, out: Path, log=logger.info) -> dict[str, Any]:
    """Train ``spec``'s model on the task's demonstrations and save it (with its tokenizer) to ``out``."""
    tokenizer = gym_tokenizer()
    model = build_model(spec, tokenizer)
    task.warm_init(model, spec)  # gym-long starts from another family's warm start
    model.train()
    rng = random.Random(f"warm/{spec.seed}")
    opt = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=0.01)
    start, losses = time.perf_counter(), []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        for step in range(spec.steps):
            lr = spec.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / spec.steps)))
            for group in opt.param_groups:
                group["lr"] = lr
            ids, mask, labels = demonstration_batch(task, tokenizer, rng, spec.batch_size)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.detach().item())
            if (step + 1) % 200 == 0:
                log(f"[gym] warm start {task.name}: step {step + 1}/{spec.steps}, loss {sum(losses[-200:]) / 200:.3f}")
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    record = {
        "task": task.cache_key(),
        "spec": asdict(spec),
        "recipe": RECIPE_VERSION,
        "seconds": round(time.perf_counter() - start, 1),
        "final_loss": sum(losses[-50:]) / min(50, len(losses)),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    (out / "gym_warm_start.json").write_text(json.dumps(record, indent=2))
    return record


def policy_spec(task) -> PolicySpec:
    """The task's :class:`PolicySpec`: its family's warm-start length, then its ``policy`` settings."""
    return PolicySpec(**{"steps": task.warm_start_steps, **task.settings.policy})


def warm_start_dir(task, spec: PolicySpec, cache_dir: str | Path | None = None) -> Path:
    """Cache folder of a task's warm start: ``<model cache>/gym/<task>-<hash of settings and spec>``."""
    from mrtpo.models import cache_root

    # the task's settings but its ``policy`` overrides, which ``spec`` holds resolved: ``policy={seed: 0}``
    # and no override name the same warm start
    settings = {k: v for k, v in task.cache_key().items() if k != "policy"}
    key = json.dumps({"task": settings, "spec": asdict(spec), "recipe": RECIPE_VERSION}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_root(cache_dir) / "gym" / f"{task.name}-{digest}"


def ensure_warm_start(task, cache_dir: str | Path | None = None, log=logger.info) -> Path:
    """The task's warm-start folder, built on first use (one builder at a time, by a file lock)."""
    spec = policy_spec(task)
    entry = warm_start_dir(task, spec, cache_dir)
    if (entry / "gym_warm_start.json").exists():
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.parent / f".{entry.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (entry / "gym_warm_start.json").exists():  # another process built it meanwhile
            return entry
        log(f"[gym] building the warm-started policy for {task.name} (once; cached in {entry})")
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{entry.name}-", dir=entry.parent))
        try:
            record = warm_start(task, spec, tmp, log=log)
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(entry)
            tmp.rename(entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log(
            f"[gym] warm start done in {record['seconds']} s ({record['parameters'] / 1e6:.2f} M parameters, "
            f"final loss {record['final_loss']:.3f})"
        )
    return entry


def load_warm_start(task, dtype: torch.dtype | None = None, cache_dir: str | Path | None = None):
    """``(model, tokenizer)`` of the task's warm-started policy, in eval mode."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    entry = ensure_warm_start(task, cache_dir)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(entry, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(entry, dtype=dtype or torch.float32, local_files_only=True)
    model.eval()
    return model, tokenizer


__all__ = [
    "RECIPE_VERSION",
    "PolicySpec",
    "build_model",
    "demonstration_batch",
    "ensure_warm_start",
    "load_warm_start",
    "policy_spec",
    "warm_start",
    "warm_start_dir",
]
