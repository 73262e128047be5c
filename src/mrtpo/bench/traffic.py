"""Count what the code around a model does per call: host syncs, host-to-device copies, torch ops.

On a GPU, a replay small enough to be bound by overhead pays for every host sync (``.item()``,
``.tolist()``, ``nonzero``, a ``bool`` of a tensor, a copy to the host) and every small kernel.
Those counts can be taken on a CPU too: :class:`HostTraffic` sees every torch call made outside
the model's own forward (a :class:`~torch.overrides.TorchFunctionMode`), whatever device the
tensors are on. So on a CPU it counts the calls that *would* sync if the tensors lived on an
accelerator (an upper bound), which is what a test needs to show a count does not grow with the
number of groups.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

#: Calls that wait for the device: the value must reach the host.
SYNC_CALLS = frozenset(
    {
        "item",
        "tolist",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "nonzero",
        "numpy",
        "cpu",
        "masked_select",
        "unique",
    }
)


def _name(func: Any) -> str:
    return getattr(func, "__name__", str(func))


def _target_device(name: str, args: tuple, kwargs: dict) -> torch.device | None:
    """The device a ``tensor.to(...)`` or ``torch.tensor(..., device=...)`` call names, if any."""
    target = kwargs.get("device")
    if target is None and name == "to":
        target = next((a for a in args[1:] if isinstance(a, (str, torch.device))), None)
    return torch.device(target) if isinstance(target, (str, torch.device)) else None


class HostTraffic(TorchFunctionMode):
    """Counts torch calls made outside ``model``'s forward while active (``with HostTraffic(model) as t``).

    ``syncs``: calls in :data:`SYNC_CALLS` (and ``.to`` the CPU from another device); ``to_device``:
    calls naming a device to put a tensor on (``.to(device)``, ``torch.tensor(..., device=)``: a
    copy unless it is already there); ``calls``: every torch call outside the model (a kernel
    launch or a host op); ``by_name``: the calls per name.
    """

    def __init__(self, model: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.syncs = self.to_device = self.calls = 0
        self.by_name: Counter[str] = Counter()
        self._depth = 0
        self._hooks = []
        if model is not None:
            self._hooks = [model.register_forward_pre_hook(self._enter), model.register_forward_hook(self._leave)]

    def _enter(self, *_: Any) -> None:
        self._depth += 1

    def _leave(self, *_: Any) -> None:
        self._depth -= 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._depth == 0:
            name = _name(func)
            self.calls += 1
            self.by_name[name] += 1
            target = _target_device(name, args, kwargs) if name in ("to", "tensor", "as_tensor") else None
            if name in SYNC_CALLS or (
                name == "to" and target is not None and target.type == "cpu" and args[0].device.type != "cpu"
            ):
                self.syncs += 1
            elif target is not None:
                self.to_device += 1
        return func(*args, **kwargs)

    def __exit__(self, *exc: Any) -> Any:
        for hook in self._hooks:
            hook.remove()
        return super().__exit__(*exc)

    def summary(self) -> dict[str, Any]:
        return {"syncs": self.syncs, "to_device": self.to_device, "calls": self.calls}


__all__ = ["HostTraffic", "SYNC_CALLS"]
