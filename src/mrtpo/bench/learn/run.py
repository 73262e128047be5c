"""Running one planned benchmark run: train with held-out evaluation, record what was sampled.

:func:`run_one` takes one :class:`~mrtpo.config.RunConfig` (from :func:`~.plan.plan_configs`) and
the evaluation settings, trains it in this process and writes ``finished.json``. Alongside the
usual run folder it writes ``eval.jsonl`` / ``eval_outputs.jsonl`` (:class:`EvalCallback`) and
``prompts.jsonl``: per generation batch, its step, example ids and a digest of every sampled
completion (:func:`completion_digests`), so that "same prompts, same samples" can be checked.
"""

from __future__ import annotations

import datetime as _dt
import gc
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from mrtpo.bench.learn.plan import EVAL_KEYS, FINISHED, BenchError, stable_settings
from mrtpo.bench.learn.stats import finite

logger = logging.getLogger(__name__)

__all__ = ["EvalCallback", "completion_digests", "run_one"]


def _eval_callback_class():
    from transformers import TrainerCallback

    class _EvalCallback(TrainerCallback):
        """Held-out evaluation of the current policy at step 0, every ``every`` steps and at the end.

        Greedy, deterministic (:func:`mrtpo.evaluate.evaluate_model`) on ``examples``; the policy is
        put in eval mode under ``torch.no_grad`` and its train mode restored, inside a forked RNG so
        the training run is the same with or without evaluation. Appends one line per evaluation to
        ``eval.jsonl`` (step, the task's scalar metrics, mean new tokens, seconds) and the outputs to
        ``eval_outputs.jsonl``.

        ``start_cache`` (a JSON file) shares the step-0 evaluation between the runs of one benchmark:
        every run starts from the same policy (the same base weights; a fresh LoRA adapter adds
        exactly zero), so its greedy step-0 outputs are the same. The first run writes the file with
        ``signature`` (the settings the runs share); a later run with the same signature copies it,
        marked ``"shared_from"``, instead of generating again.
        """

        def __init__(
            self,
            trainer,
            task,
            examples,
            every: int,
            folder: Path,
            batch_size: int = 8,
            max_new_tokens: int | None = None,
            at_start: bool = True,
            start_cache: Path | None = None,
            signature: str = "",
        ):
            self.trainer, self.task, self.examples = trainer, task, list(examples)
            self.every, self.folder = int(every), Path(folder)
            self.batch_size, self.max_new_tokens, self.at_start = batch_size, max_new_tokens, at_start
            self.start_cache, self.signature = (Path(start_cache) if start_cache else None), signature
            self.last_step: int | None = None
            self.seconds = 0.0

        def _write(self, record: dict[str, Any], outputs: list[dict[str, Any]]) -> None:
            self.folder.mkdir(parents=True, exist_ok=True)
            with (self.folder / "eval.jsonl").open("a") as f:
                f.write(json.dumps(record) + "\n")
            with (self.folder / "eval_outputs.jsonl").open("a") as f:
                for o in outputs:
                    f.write(json.dumps(o, ensure_ascii=False) + "\n")
            self.last_step = record["step"]

        def _shared_start(self) -> bool:
            """Copy the cached step-0 evaluation if it was made under the same settings."""
            if self.start_cache is None or not self.start_cache.is_file():
                return False
            cached = json.loads(self.start_cache.read_text())
            if cached.get("signature") != self.signature:
                return False
            self._write({**cached["record"], "shared_from": cached["run"]}, cached["outputs"])
            return True

        def evaluate(self, step: int) -> dict[str, Any]:
            import torch

            from mrtpo.evaluate import evaluate_model

            model = self.trainer.accelerator.unwrap_model(self.trainer.model)
            was_training = model.training
            devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
            start = time.perf_counter()
            with torch.random.fork_rng(devices=devices):
                model.eval()
                try:
                    with torch.no_grad():
                        metrics, gens = evaluate_model(
                            model,
                            self.trainer.processing_class,
                            self.task,
                            self.examples,
                            batch_size=self.batch_size,
                            max_new_tokens=self.max_new_tokens,
                            progress=False,
                        )
                finally:
                    model.train(was_training)
            seconds = time.perf_counter() - start
            self.seconds += seconds
            record = {
                "step": step,
                "metrics": {k: v for k, v in metrics.items() if finite(v)},
                "n": len(gens),
                "mean_new_tokens": sum(g.new_tokens for g in gens) / max(len(gens), 1),
                "truncated": sum(not g.stopped for g in gens),
                "seconds": round(seconds, 3),
            }
            outputs = [{"step": step, **{k: v for k, v in g.record().items() if k != "prompt"}} for g in gens]
            self._write(record, outputs)
            if step == 0 and self.start_cache is not None:  # written whole, then renamed: parallel runs read it
                tmp = self.start_cache.with_name(f".{self.start_cache.name}.{os.getpid()}")
                tmp.write_text(
                    json.dumps(
                        {"signature": self.signature, "run": self.folder.name, "record": record, "outputs": outputs}
                    )
                    + "\n"
                )
                tmp.replace(self.start_cache)
            return record

        def on_train_begin(self, args, state, control, **kwargs):
            if self.at_start and state.global_step == 0 and not self._shared_start():
                self.evaluate(0)

        def on_step_end(self, args, state, control, **kwargs):
            if self.every > 0 and state.global_step % self.every == 0 and state.global_step != self.last_step:
                self.evaluate(state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            if state.global_step != self.last_step:
                self.evaluate(state.global_step)

    return _EvalCallback


def EvalCallback(*args, **kwargs):  # a factory that reads like the class it returns
    """Build the held-out evaluation callback (see ``_EvalCallback``; transformers imported lazily)."""
    return _eval_callback_class()(*args, **kwargs)


def completion_digests(completion_ids, completion_mask) -> list[str]:
    """A 16-hex-digit hash of each completion's tokens: ``(B, T)`` ids and mask -> B strings.

    Padding (mask 0) is left out, so two completions hash alike iff their tokens are the same.
    """
    digests = []
    for ids, mask in zip(completion_ids.tolist(), completion_mask.tolist()):
        tokens = [t for t, m in zip(ids, mask) if m]
        digests.append(hashlib.sha1(json.dumps(tokens).encode()).hexdigest()[:16])
    return digests


def _record_batches(trainer, path: Path) -> None:
    """Log every generation batch (in order) to ``prompts.jsonl``: the step, its example ids and a
    digest of each sampled completion (:func:`completion_digests`).

    Observes the trainer without changing it: the batch passed to TRL's
    ``_generate_and_score_completions`` and the completions it returns are recorded, the
    returned dict handed on untouched.
    """
    inner = trainer._generate_and_score_completions

    def recording(inputs):
        record = {
            "step": trainer.state.global_step,
            "training": bool(trainer.model.training),
            "example_ids": [str(row.get("example_id", "")) for row in inputs],
        }
        out = inner(inputs)
        record["completions"] = completion_digests(out["completion_ids"].cpu(), out["completion_mask"].cpu())
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        return out

    trainer._generate_and_score_completions = recording


def _looks_like_run_folder(folder: Path) -> bool:
    names = {p.name for p in folder.iterdir()}
    return not names or bool(names & {"config.yaml", "metrics.jsonl", "eval.jsonl", "prompts.jsonl"})


def run_one(
    config, eval_settings: dict[str, Any], log=logger.info, start_eval: str = "start_eval.json"
) -> dict[str, Any]:
    """Train one planned (method, policy, seed) run with held-out evaluation; write ``finished.json``.

    ``config`` is a :class:`~mrtpo.config.RunConfig` whose ``output_dir`` is the run folder (an
    unfinished one there is removed first); ``eval_settings`` holds :data:`~.plan.EVAL_KEYS` and
    ``share_start_eval``; ``start_eval`` names the shared step-0 evaluation's file next to the run
    folder (one per starting policy, :func:`~.plan.start_eval_file`). Returns what
    ``finished.json`` holds (steps, seconds, settings).
    """
    import torch

    from mrtpo.saved_config import write_config
    from mrtpo.train import build_trainer

    folder = Path(config.args.output_dir)
    if folder.exists():
        if not _looks_like_run_folder(folder):
            raise BenchError(
                f"{folder} exists and is not a run folder of this benchmark; move it or choose another --output-dir"
            )
        log(f"  {folder.name}: unfinished run found, starting it again from scratch")
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    write_config(config, folder / "config.yaml")
    t0 = time.perf_counter()
    trainer = build_trainer(config)
    if trainer.accelerator.num_processes != 1:
        raise BenchError(
            "mrtpo bench learn runs in one process; start it with plain `mrtpo bench learn`, "
            "not torchrun / accelerate launch"
        )
    task = trainer.mrtpo_task
    examples = task.load("eval", eval_settings["eval_size"]) if eval_settings["eval_size"] else []
    callback = None
    if examples:
        share = eval_settings.get("share_start_eval", True)
        signature = json.dumps(
            {
                "settings": stable_settings(config),
                "eval": {k: eval_settings[k] for k in EVAL_KEYS if k != "eval_every"},
            },
            sort_keys=True,
        )
        callback = EvalCallback(
            trainer,
            task,
            examples,
            eval_settings["eval_every"],
            folder,
            batch_size=eval_settings["eval_batch_size"],
            max_new_tokens=eval_settings["eval_max_new_tokens"],
            start_cache=folder.parent / start_eval if share else None,
            signature=signature,
        )
        trainer.add_callback(callback)
    _record_batches(trainer, folder / "prompts.jsonl")
    ready = time.perf_counter()
    trainer.train()
    trained = time.perf_counter()
    if config.run.report:
        from mrtpo.report.build import make_report

        make_report(folder, samples=config.run.report_samples)
    eval_s = callback.seconds if callback else 0.0
    info = {
        "method": config.args.method,
        "seed": config.args.seed,
        "steps": trainer.state.global_step,
        "wall_s": round(time.perf_counter() - t0, 1),
        "setup_s": round(ready - t0, 1),
        "train_s": round(trained - ready - eval_s, 1),
        "eval_s": round(eval_s, 1),
        "date": _dt.datetime.now(_dt.UTC).astimezone().isoformat(timespec="seconds"),
        "settings": stable_settings(config),
        "eval": {k: eval_settings[k] for k in EVAL_KEYS},
    }
    (folder / FINISHED).write_text(json.dumps(info, indent=1) + "\n")
    del trainer, callback
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return info
