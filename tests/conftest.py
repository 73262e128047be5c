"""Test-wide settings: never touch the network, deterministic seeds."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Property-based tests explore new examples locally but replay a fixed sequence in CI, so a CI
# run is reproducible; a failure found locally is stored in .hypothesis/ and replayed first.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A saved tiny random model + tokenizer folder, for the CLI tests (`--model <dir>`)."""
    from mrtpo.testing import tiny_policy

    path = tmp_path_factory.mktemp("tiny-model")
    model, tok = tiny_policy(seed=0, max_position_embeddings=4096)  # sql prompts are ~1,100 bytes
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_dir(tiny_model_dir):
    return tiny_model_dir


@pytest.fixture
def one_thread():
    """torch on one thread for the test (the real-model and CLI tests share two cores), restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
