"""One declaration of what a task is: every task derives from ``Task``, every hook the code probes is declared there."""

import re
from pathlib import Path

import pytest

import mrtpo
from mrtpo.task_base import OPTIONAL_HOOKS, Task, implements
from mrtpo.tasks import TASK_NAMES, get_task

SRC = Path(mrtpo.__file__).parent


@pytest.mark.parametrize("name", TASK_NAMES)
def test_every_built_in_task_is_a_task_with_its_three_methods(name):
    task = get_task(name)
    assert isinstance(task, Task)
    for method in ("load", "verifiers", "evaluate"):
        assert getattr(type(task), method) is not getattr(Task, method), f"{name} must implement {method}"


def test_implements_tells_a_task_s_own_hooks_from_the_defaults():
    gym, sql = get_task("gym-constraints"), get_task("sql")
    assert implements(gym, "relevant_positions") and implements(gym, "policy")
    assert implements(sql, "checked_spans") and not implements(sql, "policy")
    assert not implements(sql, "relevant_positions")
    assert implements(get_task("toolcall"), "warm_start_pairs")
    with pytest.raises(NotImplementedError, match="ships no policy"):
        sql.policy()


def test_a_plugin_task_that_does_not_derive_from_task_is_read_by_its_attributes():
    class Plugin:
        def checked_spans(self, example, text):
            return []

    assert implements(Plugin(), "checked_spans") and not implements(Plugin(), "policy")
    with pytest.raises(ValueError, match="unknown task hook"):
        implements(Plugin(), "load")


def test_the_defaults_say_none():
    task = Task()
    assert task.checked_spans(None, "text") == [] and task.may_have_checked_spans(None) is False
    assert task.splits is None and task.max_new_tokens is None and task.heldout_metrics == ()


def test_no_code_probes_a_task_for_an_undeclared_hook():
    """Every ``implements(…, "hook")`` names a declared optional hook, and no module probes a task with
    ``hasattr`` any more (a probe that bypasses the declaration would let a hook go undocumented)."""
    text = {p: p.read_text() for p in SRC.rglob("*.py")}
    probed = {hook for source in text.values() for hook in re.findall(r'implements\([^,()]+, "([a-z_]+)"\)', source)}
    assert probed and probed <= set(OPTIONAL_HOOKS)
    hasattr_probes = [
        f"{p.relative_to(SRC)}: {m}"
        for p, source in text.items()
        for m in re.findall(r'hasattr\((?:get_task\([^)]*\)|[a-z_.]*task), "[a-z_]+"\)', source)
    ]
    assert hasattr_probes == []
    declared = {name for name in vars(Task) if not name.startswith("_")}
    getattr_probes = {
        hook for source in text.values() for hook in re.findall(r'getattr\((?:self\.)?task, "([a-z_]+)"', source)
    }
    assert getattr_probes <= declared, f"probed but not declared on Task: {getattr_probes - declared}"


def test_a_plugin_task_gets_the_default_trainer_hooks():
    """``task_hook`` gives a task that does not derive from ``Task`` the defaults: the messages and ids as rows,
    each verifier wrapped as a TRL reward function."""
    from mrtpo.rewards import VerifierReward
    from mrtpo.task_base import task_hook
    from mrtpo.verifiers import Example

    class Says:
        name = "says"

        def __call__(self, completion, example):
            return float("hi" in completion)

        def evidence(self, example):
            return None

    class Plugin:
        def verifiers(self):
            return [Says()]

    examples = [Example(id="a", split="train", messages=[{"role": "user", "content": "say hi"}], gold={})]
    assert task_hook(Plugin(), "trainer_rows")(examples) == [{"prompt": examples[0].messages, "example_id": "a"}]
    (reward,) = task_hook(Plugin(), "reward_funcs")({ex.id: ex for ex in examples})
    assert isinstance(reward, VerifierReward)
    assert reward(prompts=["p"], completions=["hi there"], example_id=["a"]) == [1.0]
