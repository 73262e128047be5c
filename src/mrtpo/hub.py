"""Whether mrtpo uses the Hugging Face hub: the user's setting, else one quick check.

A user's ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is obeyed either way. Without one,
:func:`decide` sends one HTTP HEAD to the hub endpoint (``HF_ENDPOINT``, default
https://huggingface.co) with a :data:`CHECK_TIMEOUT_S` deadline (DNS included), once per process and
endpoint. No answer, or an HTTP error status (an interceptor or a blocking proxy): this process and its
children run offline (``HF_HUB_OFFLINE=1``, with the reason in :data:`REASON_VAR`), so nothing later waits
on a network timeout; ``HF_HUB_OFFLINE=0`` overrules the check.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import urllib.request

__all__ = [
    "CHECK_TIMEOUT_S",
    "DEFAULT_ENDPOINT",
    "REASON_VAR",
    "HubError",
    "decide",
    "endpoint",
    "go_offline",
    "hub_reachable",
    "offline_reason",
    "prepare_hub",
    "user_setting",
]

DEFAULT_ENDPOINT = "https://huggingface.co"
CHECK_TIMEOUT_S = 2.0
#: Set (with ``HF_HUB_OFFLINE=1``) when mrtpo, not the user, chose offline mode: why, and how to lift it.
REASON_VAR = "MRTPO_HUB_OFFLINE_REASON"
_TRUE = {"1", "true", "yes", "on"}
_LIFT = "set HF_HUB_OFFLINE=0 to use the hub anyway"


class HubError(RuntimeError):
    """Something needs the hub (``push_to_hub``) and cannot have it here; says what to change."""


def endpoint() -> str:
    """The hub endpoint: ``HF_ENDPOINT`` or the public hub."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _is_true(value: str | None) -> bool:
    return (value or "").strip().lower() in _TRUE


def user_setting() -> tuple[str, bool] | None:
    """``(variable, offline)`` where the user set offline mode either way, else None.

    Read like huggingface_hub does: the first non-empty of ``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE``.
    An ``HF_HUB_OFFLINE=1`` that mrtpo set itself (inherited from a parent mrtpo process) is not the user's.
    """
    if os.environ.get(REASON_VAR) and _is_true(os.environ.get("HF_HUB_OFFLINE")):
        return None
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip():
            return var, _is_true(os.environ[var])
    return None


@functools.cache
def _probe(url: str, timeout: float) -> bool:
    """One HEAD request to ``url`` in a daemon thread, waited on for at most ``timeout`` seconds."""
    answer: list[bool] = []

    def run() -> None:
        request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "mrtpo-hub-check"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                answer.append(response.status < 400)
        except Exception:  # noqa: BLE001 - DNS, refused, TLS, timeout, an HTTP error status: not usable
            answer.append(False)

    thread = threading.Thread(target=run, name="mrtpo-hub-check", daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(answer and answer[0])


def hub_reachable(timeout: float = CHECK_TIMEOUT_S) -> bool:
    """True when the hub endpoint answers HEAD with a status below 400 within ``timeout`` seconds (cached per
    process and endpoint)."""
    return _probe(endpoint(), timeout)


def go_offline(reason: str, lift: str = _LIFT) -> None:
    """Run this process (and its children) offline: ``HF_HUB_OFFLINE=1``, also in modules already imported."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ[REASON_VAR] = f"{reason}; {lift}"
    hub_constants = sys.modules.get("huggingface_hub.constants")
    if hub_constants is not None:
        hub_constants.HF_HUB_OFFLINE = True
    datasets_config = sys.modules.get("datasets.config")
    if datasets_config is not None:
        datasets_config.HF_HUB_OFFLINE = datasets_config.HF_DATASETS_OFFLINE = True


def decide() -> bool:
    """True when this process runs offline: the user's setting, else mrtpo's earlier choice, else the check."""
    user = user_setting()
    if user is not None:
        return user[1]
    if os.environ.get(REASON_VAR) and _is_true(os.environ.get("HF_HUB_OFFLINE")):
        return True
    if getattr(sys.modules.get("huggingface_hub.constants"), "HF_HUB_OFFLINE", False):
        return True  # set in code (huggingface_hub.constants.HF_HUB_OFFLINE = True)
    if hub_reachable():
        return False
    go_offline(
        f"the hub endpoint {endpoint()} gave no usable answer within {CHECK_TIMEOUT_S:g} s, so mrtpo set "
        "HF_HUB_OFFLINE=1"
    )
    return True


def offline_reason() -> str:
    """Why this process is offline, and what lifts it (for error messages)."""
    user = user_setting()
    if user is not None and user[1]:
        var = user[0]
        return f"{var}={os.environ[var]} is set in the environment; set {var}=0 (or unset it) to use the hub"
    return os.environ.get(REASON_VAR) or f"huggingface_hub is in offline mode; {_LIFT}"


def prepare_hub(push_to_hub: bool = False) -> bool:
    """Before a command loads anything: decide the hub mode (returns offline); ``push_to_hub`` needs the hub
    and a token, else :class:`HubError`."""
    offline = decide()
    if not push_to_hub:
        return offline
    if offline:
        raise HubError(
            f"push_to_hub=true needs the model hub, which is offline here ({offline_reason()}); "
            "or set push_to_hub=false and upload the run folder later"
        )
    from huggingface_hub import get_token

    if get_token() is None:
        raise HubError(
            "push_to_hub=true needs a Hugging Face token: `hf auth login` or HF_TOKEN=..., or set push_to_hub=false"
        )
    return offline
