"""Reward functions of a task file are called as TRL 1.16's GRPOTrainer calls them (mrtpo.reward_calls).

The reference is TRL itself: a probe reward records each call it gets from a plain ``trl.GRPOTrainer``
and from a ``mrtpo train`` task file (tiny random model), and the two must agree. TRL's own rewards
(``trl.rewards.*``) run unchanged from a task file, each checked against values computed by hand.
"""

import importlib.util
import json
import textwrap
from pathlib import Path

import pytest
import torch

from mrtpo.config import ConfigError, load_config
from mrtpo.reward_calls import call_problem, call_reward, check_reward_calls
from mrtpo.tasks.from_config import TaskFileError, load_task_file

PROBE = '''
CALLS = []

def probe(prompts, completions, completion_ids, trainer_state, log_metric, log_extra, **columns):
    """Records its calls; needs trainer_state (a reward shaped by training progress)."""
    CALLS.append({"n": len(completions), "step": trainer_state.global_step, "prompt": prompts[0],
                  "completion": completions[0], "ids": [list(i) for i in completion_ids],
                  "keys": sorted(["prompts", "completions", "completion_ids", "trainer_state", "log_metric",
                                  "log_extra", *columns]),
                  "columns": {k: list(v) for k, v in columns.items()}})
    log_metric("probe_calls", float(len(CALLS)))
    return [float(len(i)) for i in completion_ids]
'''


def _task(folder: Path, rows: list[dict], rewards: str, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "rewards.py").write_text(PROBE)
    path = folder / "task.yaml"
    path.write_text(
        "dataset: data.jsonl\nprompt: question\nrewards:"
        + ("\n" if ": " in rewards else " ")
        + textwrap.indent(textwrap.dedent(rewards), "  ")
        + "\n"
        + extra
    )
    return path


def _chat_rows(n=4):
    return [
        {"question": [{"role": "user", "content": f"Say {w}."}], "answer": w, "n": i}
        for i, w in enumerate(["yes", "no", "up", "down"][:n])
    ]


# --------------------------------------------------------------------------------------------
# The call, compared with TRL's own.
# --------------------------------------------------------------------------------------------
def _settings(tmp_path):
    return dict(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to=[],
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=6,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        learning_rate=1e-3,
        seed=0,
    )


def _calls(task_path):
    import sys

    return next(
        m
        for n, m in sys.modules.items()
        if n.startswith("mrtpo_task_rewards_") and getattr(m, "__file__", None) == str(task_path.parent / "rewards.py")
    ).CALLS


def test_a_task_files_rewards_get_the_same_calls_as_from_trl(tmp_path, tiny_dir, one_thread):
    from trl import GRPOConfig, GRPOTrainer

    from mrtpo.testing import tiny_policy
    from mrtpo.train import build_trainer

    path = _task(tmp_path / "t", _chat_rows(), "rewards.py:probe: 1.0\ntrl.rewards.think_format_reward: 0.5")
    config = load_config(
        [],
        {
            "task": str(path),
            "model": str(tiny_dir),
            "method": "gdpo",
            "report": False,
            **{k: v for k, v in _settings(tmp_path).items() if k != "report_to"},
        },
    )
    trainer = build_trainer(config)
    trainer.train()
    ours = list(_calls(path))
    task = trainer.mrtpo_task
    # TRL itself, on the dataset the task hands the trainer, with the same function object
    model, tok = tiny_policy(seed=0)
    args = GRPOConfig(**{**_settings(tmp_path / "trl"), "report_to": []})
    from datasets import Dataset

    reference = GRPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=task.reward_funcs(),
        args=args,
        train_dataset=Dataset.from_list(task.trainer_rows(task.load("train"))),
    )
    reference.train()
    theirs = _calls(path)[len(ours) :]
    assert len(ours) == len(theirs) == 2  # one call per step (per batch), not one per completion
    for a, b in zip(ours, theirs):
        assert a["n"] == b["n"] == 4 and a["keys"] == b["keys"]
        assert a["keys"] == [
            "answer",
            "completion_ids",
            "completions",
            "example_id",
            "log_extra",
            "log_metric",
            "n",
            "prompts",
            "trainer_state",
        ]
        # a conversational prompt: messages in, one assistant message per completion out
        assert isinstance(a["prompt"], list) and a["prompt"][0]["role"] == "user"
        assert isinstance(a["completion"], list) and a["completion"][0]["role"] == "assistant"
        assert type(a["completion"]) is type(b["completion"])
        assert set(a["columns"]["answer"]) <= {"yes", "no", "up", "down"} and len(a["columns"]["n"]) == 4
    assert [c["step"] for c in ours] == [0, 1]  # trainer_state is the live state
    records = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if "rewards/think_format_reward/mean" in r]
    assert len(logged) == 2 and all("probe_calls" in r for r in logged)  # log_metric reached the log
    probe_means = [r["rewards/probe/mean"] for r in logged]
    lengths = [sum(map(len, c["ids"])) / 4 for c in ours]  # the probe returns each completion's token count
    assert probe_means == pytest.approx(lengths)


def test_a_text_prompt_is_a_raw_continuation_on_the_command_line_as_in_trl(tmp_path, tiny_dir):
    from mrtpo.counterfactual import prompt_renderer
    from mrtpo.train import build_trainer

    rows = [{"question": f"Count to {i}:", "answer": str(i)} for i in range(4)]
    path = _task(tmp_path / "raw", rows, "rewards.py:probe")
    config = load_config(
        [],
        {
            "task": str(path),
            "model": str(tiny_dir),
            "method": "gdpo",
            "report": False,
            **{k: v for k, v in _settings(tmp_path).items() if k != "report_to"},
        },
    )
    trainer = build_trainer(config)
    task, first = trainer.mrtpo_task, trainer.train_dataset[0]
    assert first["prompt"] == "Count to 0:"  # the text itself, no chat template around it
    assert trainer._render(first["prompt"]) == "Count to 0:"
    assert prompt_renderer(task, trainer.processing_class)(task.load("train")[0]) == "Count to 0:"  # eval's rendering
    # a text prompt's completions reach the reward as text
    call_reward(
        task.reward_funcs()[0],
        ["Count to 0:"],
        ["1 2"],
        {"answer": ["0"]},
        completion_ids=[[5, 6]],
        trainer_state=trainer.state,
    )
    assert _calls(path)[-1]["completion"] == "1 2"


# --------------------------------------------------------------------------------------------
# trl.rewards.* from a task file (no model: mrtpo eval's call, TRL's keywords).
# --------------------------------------------------------------------------------------------
def test_think_format_reward_from_a_task_file(tmp_path):
    task = load_task_file(_task(tmp_path / "think", _chat_rows(2), "trl.rewards.think_format_reward"))
    examples = task.load("train")
    metrics = task.evaluate(["<think>\nhm\n</think>\nyes", "no thinking"], examples)
    assert metrics["reward/think_format_reward"] == 0.5  # 1.0 and 0.0, as TRL's docstring example


def test_reward_factories_take_args_and_get_the_token_ids(tmp_path):
    rewards = """\
        trl.rewards.get_repetition_penalty_reward:
          args: {ngram_size: 2, max_penalty: -1.0}
        trl.rewards.get_soft_overlong_punishment:
          weight: 2.0
          args: {max_completion_len: 100, soft_punish_cache: 20}
        """
    task = load_task_file(_task(tmp_path / "fac", _chat_rows(2), rewards))
    assert task.reward_weights == [1.0, 2.0]
    # bigrams of [1,2,3,4] all distinct: 0; of [5]*5: 1 distinct of 4, penalty -(1 - 1/4) = -0.75.
    # lengths 4 and 90: 90 lies in (80, 100], so (80 - 90) / 20 = -0.5.
    ids = [[1, 2, 3, 4], [5] * 90]
    metrics = task.evaluate(["a", "b"], task.load("train"), completion_ids=[ids[0], [5] * 5])
    assert metrics["reward/repetition_penalty_reward"] == pytest.approx(-0.75 / 2)
    metrics = task.evaluate(["a", "b"], task.load("train"), completion_ids=ids)
    assert metrics["reward/soft_overlong_punishment_reward"] == pytest.approx(-0.5 / 2)


@pytest.mark.parametrize("name", ["accuracy_reward", "reasoning_accuracy_reward"])
def test_math_rewards_need_math_verify_which_is_said_up_front(tmp_path, name):
    rows = [{"question": [{"role": "user", "content": "1/3?"}], "solution": r"$\frac{1}{3}$"}]
    path = _task(tmp_path / name, rows, f"trl.rewards.{name}")
    if importlib.util.find_spec("math_verify") is None:
        with pytest.raises(TaskFileError, match="needs the 'math_verify' package.*pip install math-verify"):
            load_task_file(path)
        return
    task = load_task_file(path)
    good = r"<think>x</think> \boxed{\frac{1}{3}}"
    assert task.evaluate([good], task.load("train"))[f"reward/{name}"] == 1.0


def test_cosine_scaled_reward_needs_math_verify_too(tmp_path):
    rows = [{"question": [{"role": "user", "content": "1/3?"}], "solution": r"$\frac{1}{3}$"}]
    path = _task(tmp_path / "cos", rows, "trl.rewards.get_cosine_scaled_reward:\n  args: {max_len: 100}")
    if importlib.util.find_spec("math_verify") is None:
        with pytest.raises(TaskFileError, match="math-verify"):
            load_task_file(path)
    else:
        task = load_task_file(path)
        # correct, 50 of 100 tokens: 0.5 + 0.5 * 0.5 * (1 + cos(pi / 2)) = 0.75 (TRL's docstring example)
        metrics = task.evaluate([r"\boxed{\frac{1}{3}}"], task.load("train"), completion_ids=[[1] * 50])
        assert metrics["reward/cosine_scaled_reward"] == pytest.approx(0.75)


# --------------------------------------------------------------------------------------------
# Arguments checked against the columns before any model loads.
# --------------------------------------------------------------------------------------------
def needs_solution(completions, solution, **kwargs):
    return [0.0] * len(completions)


def no_kwargs(prompts, completions):
    return [0.0] * len(completions)


def positional_only(completions, /, **kwargs):
    return [0.0] * len(completions)


def test_call_problem_names_what_does_not_bind():
    assert call_problem(needs_solution, "needs_solution", ["prompt", "solution"]) is None
    problem = call_problem(needs_solution, "needs_solution", ["prompt", "answer"])
    assert "needs the argument 'solution'" in problem and "columns are prompt, answer" in problem
    problem = call_problem(no_kwargs, "no_kwargs", ["prompt", "answer"])
    assert "does not take **kwargs" in problem
    for passed in ("completion_ids", "trainer_state", "log_extra", "log_metric", "answer"):
        assert passed in problem
    assert "positionally only" in call_problem(positional_only, "p", ["prompt"])
    assert call_problem(torch.nn.Linear(1, 1), "model", ["prompt"]) is None  # a reward model: scored as logits


def test_a_missing_reward_argument_is_refused_by_the_task_file_and_the_trainer(tmp_path, capsys):
    path = _task(tmp_path / "acc", _chat_rows(2), "rewards.py:probe")
    (path.parent / "rewards.py").write_text(PROBE + "\ndef scored(completions, solution, **kw):\n    return [0.0]\n")
    path.write_text(path.read_text().replace("rewards.py:probe", "rewards.py:scored"))
    with pytest.raises(TaskFileError, match="needs the argument 'solution'.*columns are prompt, answer, n, example_id"):
        load_task_file(path)
    with pytest.raises(ConfigError, match="needs the argument 'solution'"):
        load_config([], {"task": str(path)})
    from mrtpo.train import main

    assert main(["--task", str(path), "--output-dir", str(tmp_path / "run")]) == 2  # before any model loads
    assert "needs the argument 'solution'" in capsys.readouterr().err
    # the library path: MRTPOTrainer checks before GRPOTrainer would load a model by name
    from datasets import Dataset
    from trl import GRPOTrainer

    data = Dataset.from_list([{"prompt": "x", "answer": "y"}])
    with pytest.raises(ValueError, match="needs the argument 'solution'"):
        check_reward_calls(GRPOTrainer.__init__, None, "no/such-model", [needs_solution], train_dataset=data)
    check_reward_calls(
        GRPOTrainer.__init__,
        None,
        "m",
        reward_funcs=needs_solution,
        train_dataset=Dataset.from_list([{"prompt": "x", "solution": "y"}]),
    )


def test_a_prompt_column_clash_and_mixed_prompt_formats_are_refused(tmp_path):
    rows = [{"question": "a", "prompt": "b"}]
    with pytest.raises(TaskFileError, match="column 'prompt' besides the prompt column 'question'"):
        load_task_file(_task(tmp_path / "clash", rows, "rewards.py:probe"))
    rows = [{"question": "text"}, {"question": [{"role": "user", "content": "chat"}]}]
    with pytest.raises(TaskFileError, match="mixes text prompts and chat messages"):
        load_task_file(_task(tmp_path / "mixed", rows, "rewards.py:probe"))


def test_dotted_paths_and_their_mistakes(tmp_path):
    task = load_task_file(_task(tmp_path / "dot", _chat_rows(2), "trl.rewards.think_format_reward"))
    assert [v.name for v in task.verifiers()] == ["think_format_reward"]
    with pytest.raises(TaskFileError, match="has no 'think_format_rewrd' \\(did you mean 'think_format_reward'\\?\\)"):
        load_task_file(_task(tmp_path / "typo", _chat_rows(2), "trl.rewards.think_format_rewrd"))
    with pytest.raises(TaskFileError, match="no_such_pkg does not import"):
        load_task_file(_task(tmp_path / "nopkg", _chat_rows(2), "no_such_pkg.fn"))


def test_mrtpo_eval_gives_a_task_files_rewards_the_generated_token_ids(tmp_path, tiny_dir, one_thread):
    """``mrtpo eval``'s scoring makes TRL's call with the generated ids (a reward of the ids alone)."""
    from mrtpo.evaluate import evaluate_model
    from mrtpo.models import load_policy

    rewards = "trl.rewards.get_repetition_penalty_reward:\n  args: {ngram_size: 1, max_penalty: -1.0}"
    task = load_task_file(_task(tmp_path / "ev", _chat_rows(3), rewards))
    model, tok = load_policy(str(tiny_dir), dtype=torch.float32)
    metrics, gens = evaluate_model(model, tok, task, task.load("train"), max_new_tokens=24, progress=False)

    def penalty(ids):  # unigrams: -(1 - distinct / total), 0 for an empty completion
        return -(1 - len(set(ids)) / len(ids)) if ids else 0.0

    expected = sum(penalty(g.token_ids) for g in gens) / len(gens)
    assert all(g.token_ids for g in gens) and expected < 0  # some repeats: without the ids it would be 0
    assert metrics["reward/repetition_penalty_reward"] == pytest.approx(expected)
