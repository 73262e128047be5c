"""The gym's shipped warm starts (mrtpo.gym.shipped): pinned, complete, loaded without building."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from mrtpo.gym import shipped
from mrtpo.gym.shipped import (
    POLICIES_DIR,
    SHIPPED_MANIFEST_SHA256,
    ShippedPolicyError,
    shipped_policies,
    shipped_policy,
)
from mrtpo.tasks import get_task

FAMILIES = ("gym-constraints", "gym-answer", "gym-call", "gym-overlap", "gym-tradeoff", "gym-long")


def test_the_manifest_is_pinned_and_every_shipped_file_matches_it():
    manifest = POLICIES_DIR / "MANIFEST.json"
    assert hashlib.sha256(manifest.read_bytes()).hexdigest() == SHIPPED_MANIFEST_SHA256
    policies = shipped_policies()
    assert len(policies) == 3 * len(FAMILIES)
    for name, entry in policies.items():
        assert {"model.safetensors", "config.json", "tokenizer.json", "gym_warm_start.json"} <= set(entry["files"])
        for file, digest in entry["files"].items():
            assert hashlib.sha256((POLICIES_DIR / name / file).read_bytes()).hexdigest() == digest, (name, file)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_ships_three_independent_warm_starts(family):
    folders = [shipped_policy(get_task(family, policy={"seed": seed})) for seed in (0, 1, 2)]
    assert all(f is not None for f in folders) and len(set(folders)) == 3
    assert folders[0] == shipped_policy(get_task(family))  # the default is warm-start seed 0
    weights = [load_file(f / "model.safetensors") for f in folders]
    key = next(iter(weights[0]))
    assert not torch.equal(weights[0][key], weights[1][key]) and not torch.equal(weights[1][key], weights[2][key])
    for folder, seed in zip(folders, (0, 1, 2)):
        record = json.loads((folder / "gym_warm_start.json").read_text())
        assert record["spec"]["seed"] == seed and record["task"]["task"] == family


def test_a_shipped_policy_loads_without_building(monkeypatch):
    import mrtpo.gym.policy as policy

    def no_build(*args, **kwargs):
        raise AssertionError("a shipped policy was built")

    monkeypatch.setattr(policy, "ensure_warm_start", no_build)
    task = get_task("gym-call", policy={"seed": 1})
    model, tokenizer = task.policy()
    stored = load_file(shipped_policy(task) / "model.safetensors")
    for name, value in model.state_dict().items():
        if name in stored:
            assert torch.equal(value, stored[name]), name
    assert len(tokenizer) == model.config.vocab_size


def test_a_policy_folder_loads_with_its_own_word_level_tokenizer():
    # as `mrtpo eval/train/export --model <folder>` load it: AutoTokenizer alone picks Qwen2's BPE
    # class for this Qwen2 model and decodes the words glued together ("redpigapplejade")
    from mrtpo.models import load_policy

    task = get_task("gym-constraints")
    _, gym_tokenizer = task.policy()
    _, tokenizer = load_policy(str(shipped_policy(task)), dtype=torch.float32)
    text = "red pig apple jade"
    ids = tokenizer(text)["input_ids"]
    assert ids == gym_tokenizer(text)["input_ids"] and len(ids) == 4
    assert tokenizer.decode(ids) == text


def test_settings_that_are_not_shipped_are_built_as_before():
    assert shipped_policy(get_task("gym-call", policy={"steps": 2, "batch_size": 4})) is None
    assert shipped_policy(get_task("gym-answer", p_follow=0.7)) is None


def test_an_install_without_the_policies_builds_and_says_why(monkeypatch, tmp_path):
    """A wheel install carries no policies (pyproject leaves them out): the task builds its warm start
    and warns that it differs from the pinned one; a checkout's shipped policy is not built."""
    import mrtpo.gym.policy as policy

    assert shipped.policies_installed()  # this checkout has them
    built = []
    monkeypatch.setattr(policy, "load_warm_start", lambda task, dtype=None: built.append(task.name) or ("m", "t"))
    monkeypatch.setattr(shipped, "POLICIES_DIR", tmp_path)  # a wheel install: no policies folder
    assert not shipped.policies_installed() and shipped_policy(get_task("gym-call")) is None
    with pytest.warns(UserWarning, match="carries no shipped gym policies"):
        assert get_task("gym-call").policy() == ("m", "t")
    assert built == ["gym-call"]


def _copy(tmp_path, name):
    root = tmp_path / "policies"
    root.mkdir()
    shutil.copy(POLICIES_DIR / "MANIFEST.json", root / "MANIFEST.json")
    shutil.copytree(POLICIES_DIR / name, root / name)
    return root


def test_a_changed_file_is_an_error_naming_it(tmp_path):
    task = get_task("gym-overlap")
    name = shipped_policy(task).name
    root = _copy(tmp_path, name)
    assert shipped_policy(task, folder=root) == root / name
    weights = root / name / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(ShippedPolicyError, match="model.safetensors"):
        shipped_policy(task, folder=root)


def test_a_changed_manifest_is_refused(tmp_path):
    task = get_task("gym-overlap")
    root = _copy(tmp_path, shipped_policy(task).name)
    manifest = json.loads((root / "MANIFEST.json").read_text())
    manifest["built_on"] = "elsewhere"
    (root / "MANIFEST.json").write_text(json.dumps(manifest))
    shipped._manifest.cache_clear()
    with pytest.raises(ShippedPolicyError, match="pins"):
        shipped_policy(task, folder=root)


def test_a_policy_override_equal_to_the_default_names_the_same_warm_start():
    from mrtpo.gym.policy import policy_spec, warm_start_dir

    for family in FAMILIES:
        default, explicit = get_task(family), get_task(family, policy={"seed": 0})
        assert warm_start_dir(default, policy_spec(default)) == warm_start_dir(explicit, policy_spec(explicit))
        other = get_task(family, policy={"seed": 1})
        assert warm_start_dir(other, policy_spec(other)) != warm_start_dir(default, policy_spec(default))


def test_the_long_warm_start_keeps_its_filler_high_entropy_and_reads_the_rules():
    """Under the shipped gym-long policy the filler tokens of demonstrations carry >= 2 nats each (the
    noise uniform credit spreads over every reward), and across the response the policy gives the
    words its prompt's rules name several times the probability of content words the prompt does not
    name (it read the rules; the demonstrator puts a rule word at a random position, so per position
    its probability is small either way)."""
    import random

    from mrtpo.gym import long
    from mrtpo.gym.policy import demonstration_batch
    from mrtpo.gym.vocab import CONTENT

    task = get_task("gym-long")
    model, tokenizer = task.policy()
    ids, mask, labels = demonstration_batch(task, tokenizer, random.Random(7), 16)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    targets = labels[:, 1:]
    logp = logits.log_softmax(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    filler_ids = set(tokenizer.convert_tokens_to_ids(list(long.FILLER)))
    is_filler = torch.tensor([[t in filler_ids for t in row] for row in targets.tolist()])
    assert is_filler.sum() > 500
    assert entropy[is_filler].mean() >= 2.0
    content = torch.tensor(tokenizer.convert_tokens_to_ids(list(CONTENT)))
    named, other = [], []
    for row in range(ids.shape[0]):
        in_prompt = set(ids[row][labels[row] == -100].tolist())
        is_named = torch.tensor([c in in_prompt for c in content.tolist()])
        probs = logp[row][targets[row] >= 0].exp()[:, content]  # (response positions, content words)
        named.append(probs[:, is_named].mean())
        other.append(probs[:, ~is_named].mean())
    assert torch.stack(named).mean() > 3 * torch.stack(other).mean()
