"""The saved run config and ``--resume`` carry every setting the trainer hands to the replay or the credit
method (issue 42): a resumed run replays and weighs with the same shape as the first.

Two real ``mrtpo train`` runs on the credit gym (each one step, checkpointed), with every such setting at a
non-default value given as ``key=value``, then ``mrtpo train --resume <folder> --max-steps 2`` with nothing
else on the command line. What the trainer hands on is recorded where it leaves the trainer: the keywords
of the replay call (``batch_relevance``), the ``CreditConfig`` the method is called with, the header of
the counterfactual prompts and the method that runs. ``test_trainer_settings.py`` checks those values
reach the advantages.
"""

import pytest
import torch
import yaml

import mrtpo.replay
import mrtpo.train
import mrtpo.trainer.replay_step
from mrtpo.train import main

GYM = ["--task", "gym-constraints", "--model", "gym"]
SMALL = [
    "task_args={policy: {steps: 3, batch_size: 8}}",
    "num_generations=4",
    "per_device_train_batch_size=8",
    "max_completion_length=16",
    "report=false",
    "save_steps=1",
]
#: run -> the settings it gives (relevance_top_k needs relevance js, so two runs); 3 rewards on gym-constraints
RUNS = {
    "kl": {
        "temperature": 0.7,
        "relevance": "kl",
        "lam": 0.6,
        "reward_lam": [0.9, 0.1, 0.5],
        "w_max": 1.5,
        "reward_weights": [0.5, 2.0, 1.5],
        "credit_batch_norm": False,
        "privileged_header": "Hidden answer:",
        "method": "contrast",
    },
    "top_k": {"relevance_top_k": 5, "method": "mrtpo-contrastive", "temperature": 1.3},
}


class Recorder:
    """What one trainer handed on: replay keywords, credit configs, headers, method names."""

    def __init__(self):
        self.replay, self.credit, self.header, self.method = [], [], [], []
        self.exit_code = None


class RecordingMethod:
    """The trainer's credit method, recording the config and method of every call."""

    def __init__(self, method, recorder):
        self._method, self._recorder = method, recorder

    def __getattr__(self, name):
        return getattr(self._method, name)

    def __call__(self, batch, config):
        self._recorder.credit.append(config)
        self._recorder.method.append(self._method.name)
        return self._method(batch, config)


def train_recorded(monkeypatch, argv) -> Recorder:
    """``mrtpo train argv`` in this process; returns its exit code and what its trainer handed to the replay
    and the credit."""
    recorder = Recorder()
    build, replay, texts = (
        mrtpo.train.build_trainer,
        mrtpo.replay.batch_relevance,
        mrtpo.trainer.replay_step.counterfactual_texts,
    )

    def building(*args, **kwargs):
        trainer = build(*args, **kwargs)
        trainer.credit_method = RecordingMethod(trainer.credit_method, recorder)
        return trainer

    def replaying(model, groups, **kwargs):
        recorder.replay.append({k: kwargs[k] for k in ("kind", "temperature", "top_k")})
        return replay(model, groups, **kwargs)

    def rendering(*args, **kwargs):
        recorder.header.append(kwargs["header"])
        return texts(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(mrtpo.train, "build_trainer", building)
        m.setattr(mrtpo.replay, "batch_relevance", replaying)  # what run_replay_plan calls
        m.setattr(mrtpo.trainer.replay_step, "counterfactual_texts", rendering)
        recorder.exit_code = main(argv)
    return recorder


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Per run: the saved config.yaml, and what the first and the resumed trainer handed on."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MRTPO_CACHE", str(tmp_path_factory.mktemp("gym-cache")))
        for name, settings in RUNS.items():
            folder = tmp_path_factory.mktemp("runs") / name
            keys = [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip()}" for k, v in settings.items()]
            first = train_recorded(mp, [*GYM, "--max-steps", "1", "--output-dir", str(folder), *SMALL, *keys])
            saved = yaml.safe_load((folder / "config.yaml").read_text()) if first.exit_code == 0 else {}
            resumed = train_recorded(mp, ["--resume", str(folder), "--max-steps", "2"])
            out[name] = {"saved": saved, "first": first, "resumed": resumed, "folder": folder}
    torch.set_num_threads(threads)
    return out


def handed_on(recorder: Recorder, key: str) -> list:
    """Every value of setting ``key`` the trainer handed on, one per call."""
    if key in ("temperature",):
        return [r["temperature"] for r in recorder.replay]
    if key in ("relevance", "relevance_top_k"):
        return [r["kind" if key == "relevance" else "top_k"] for r in recorder.replay]
    if key == "privileged_header":
        return recorder.header
    if key == "method":
        return recorder.method
    field = {"credit_batch_norm": "batch_norm"}.get(key, key)
    values = [getattr(c, field) for c in recorder.credit]
    return [list(v) if isinstance(v, (list, tuple)) else v for v in values]


CASES = [(run, key) for run, settings in RUNS.items() for key in settings]


@pytest.mark.parametrize("run,key", CASES, ids=[f"{run}-{key}" for run, key in CASES])
def test_saved_config_and_resume_carry_the_setting(runs, run, key):
    value = RUNS[run][key]
    record = runs[run]
    assert (record["first"].exit_code, record["resumed"].exit_code) == (0, 0), "both commands succeed"
    assert record["saved"][key] == value  # config.yaml holds it
    first, resumed = handed_on(record["first"], key), handed_on(record["resumed"], key)
    assert first and resumed, "the setting was handed on in both runs"
    assert set(map(repr, first)) == set(map(repr, resumed)) == {repr(value)}  # the same, both runs


def test_the_resumed_run_went_on_from_its_checkpoint(runs):
    for record in runs.values():
        steps = [yaml.safe_load(line)["step"] for line in (record["folder"] / "metrics.jsonl").read_text().splitlines()]
        assert steps[0] == 1 and 2 in steps and len(record["resumed"].credit) == 1  # one new generation step
