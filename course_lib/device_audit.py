"""A CPU that behaves like a separate device: forgotten ``.to(device)`` calls fail here as they fail on a GPU.

On a laptop without a GPU, ``pick_device()`` returns the CPU, and a model or a batch that a lesson forgot to move
works anyway: it is already where the rest is. On a GPU the same cell stops with ``Input type
(torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the same``. With ``COURSE_DEVICE_AUDIT=1``
set, ``pick_device("auto")`` returns an audited CPU device instead, and every tensor is either *on the device*
(moved there with ``.to(device)``, made with ``device=device``, or computed from such a tensor) or *on the host*
(everything else). Any operation that mixes the two raises, as CUDA does, naming the operation. The test suite
executes every lesson and solution this way (``tests/test_lessons.py``, nbval), so the class of bug is caught on a
machine that has no GPU.

The rules follow CUDA's: a 0-dimensional host tensor may join device tensors (a Python-number-like scalar),
indexing a device tensor with host indices works, ``copy_`` and ``.to`` cross devices on purpose, and
``.numpy()`` of a device tensor fails. Compiled regions are not audited (the audit steps aside while
``torch.compile`` traces). It only adds checks: results are the same as without it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

ENV_VAR = "COURSE_DEVICE_AUDIT"
_MARK = "_course_on_device"

# The device the audit hands out: "cpu:0" is the CPU, yet compares unequal to the plain "cpu" that every host tensor
# reports, so the device survives `torch.device(device)`, strings and configs, as "cuda" would.
AUDIT_DEVICE = torch.device("cpu", 0)

_COMPILER_DIRS = tuple(os.path.join("torch", part, "") for part in ("_inductor", "_functorch", "_dynamo"))
_EITHER = "either"  # the mark of a tensor made by compiled code: compatible with both sides
_CROSSING = {torch.Tensor.to, torch.Tensor.copy_, torch.Tensor.__getitem__, torch.Tensor.__setitem__}
_DEVICE_ATTRIBUTE = torch._C.TensorBase.device  # its getter reaches the mode as a new method-wrapper each time


def requested() -> bool:
    """Whether ``COURSE_DEVICE_AUDIT`` asks for the audit (``1``, ``true`` or ``yes``)."""
    return os.environ.get(ENV_VAR, "").strip().lower() in ("1", "true", "yes")


def on_device(tensor: torch.Tensor) -> bool:
    """Whether the audit counts ``tensor`` as moved to the device."""
    return getattr(tensor, _MARK, False) is True


def on_host(tensor: torch.Tensor) -> bool:
    """Whether the audit counts ``tensor`` as left on the host (not moved, and not made by compiled code)."""
    return getattr(tensor, _MARK, False) is False


def _in_compiled_code() -> bool:
    # The caller of an operation is compiled code (inductor's generated module, AOTAutograd's wrappers): it runs
    # where its inputs are, and allocates its buffers with plain `device=cpu`, so its tensors are not judged.
    filename = sys._getframe(2).f_code.co_filename
    return "torchinductor" in filename or any(part in filename for part in _COMPILER_DIRS)


def _set_mark(tensor: Any, moved: bool | str) -> None:
    if isinstance(tensor, torch.Tensor):
        try:
            setattr(tensor, _MARK, moved)
        except (AttributeError, RuntimeError):  # some internal tensors take no attributes; they stay unaudited
            pass


def _is_audit_device(value: Any) -> bool:
    if isinstance(value, int):  # .to(0) means cuda:0 on a GPU: the device
        return True
    try:
        return value is not None and torch.device(value) == AUDIT_DEVICE
    except (RuntimeError, TypeError):
        return False


def _describe(func: Any) -> str:
    return getattr(func, "__name__", None) or repr(func)


class DeviceMismatch(RuntimeError):
    """An operation mixed tensors on the device with tensors left on the host (a GPU raises here too)."""


class DeviceAudit(TorchFunctionMode):
    """Marks each tensor as on the device or on the host, and fails any operation that mixes the two."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if _moving_module or torch.compiler.is_compiling():
            return func(*args, **kwargs)
        if getattr(func, "__self__", None) is _DEVICE_ATTRIBUTE:
            # A moved tensor reports the audit's device object, so `device=x.device` keeps it on the device.
            return AUDIT_DEVICE if on_device(args[0]) else func(*args, **kwargs)
        if func is torch.Tensor.to:
            return self._to(func, args, kwargs)
        if func is torch.Tensor.cpu:
            return self._moved(args[0], func(*args, **kwargs), False)
        if func is torch.Tensor.numpy and on_device(args[0]):
            raise DeviceMismatch("device audit: .numpy() of a tensor on the device fails on a GPU; call .cpu() first.")
        flat, _ = tree_flatten((args, kwargs))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        moved = any(on_device(t) for t in tensors)
        if _in_compiled_code():
            result = func(*args, **kwargs)
            for out in tree_flatten(result)[0]:
                _set_mark(out, True if moved else _EITHER)
            return result
        if moved and func not in _CROSSING:
            host = [t for t in tensors if on_host(t) and t.dim() > 0]
            if host:
                raise DeviceMismatch(
                    f"device audit: {_describe(func)} got tensors on the device and a tensor of shape "
                    f"{tuple(host[0].shape)} left on the host. On a GPU this fails ('Expected all tensors to be on "
                    "the same device'): move it with .to(device), or build it with device=device."
                )
        result = func(*args, **kwargs)
        device_kwarg = kwargs.get("device")
        if moved or _is_audit_device(device_kwarg):
            for out in tree_flatten(result)[0]:
                if func is not torch.Tensor.copy_:  # a copy's destination stays where it is
                    _set_mark(out, True)
        return result

    @staticmethod
    def _to(func: Any, args: tuple, kwargs: dict) -> Any:
        source, rest = args[0], args[1:]
        target = kwargs.get("device", rest[0] if rest else None)
        result = func(*args, **kwargs)
        if isinstance(target, torch.Tensor):
            moved = on_device(target)
        elif isinstance(target, (torch.device, str, int)):
            moved = _is_audit_device(target)
        else:  # .to(dtype) and the like: stays where it was
            moved = on_device(source)
        return DeviceAudit._moved(source, result, moved)

    @staticmethod
    def _moved(source: torch.Tensor, result: torch.Tensor, moved: bool) -> torch.Tensor:
        if result is source and moved != on_device(source):
            # On the CPU a move returns the same tensor; a GPU would return a copy, so mark a copy instead.
            result = source.detach().clone() if not source.requires_grad else source.clone()
        _set_mark(result, moved)
        return result


_active: DeviceAudit | None = None
_moving_module = False  # inside Module.to, whose own bookkeeping mixes old and new tensors
_original_module_to = torch.nn.Module.to
_original_module_cpu = torch.nn.Module.cpu
_original_parameter_new = torch.nn.Parameter.__new__


def _moving(original: Any, self: torch.nn.Module, args: tuple, kwargs: dict) -> torch.nn.Module:
    global _moving_module
    outer, _moving_module = _moving_module, True
    try:
        return original(self, *args, **kwargs)
    finally:
        _moving_module = outer


def _mark_module(module: torch.nn.Module, moved: bool) -> None:
    for tensor in [*module.parameters(), *module.buffers()]:
        _set_mark(tensor, moved)


def _audited_module_to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
    target = kwargs.get("device", args[0] if args else None)
    result = _moving(_original_module_to, self, args, kwargs)
    if isinstance(target, (torch.device, str, int)):
        _mark_module(self, _is_audit_device(target))
    return result


def _audited_module_cpu(self: torch.nn.Module) -> torch.nn.Module:
    result = _moving(_original_module_cpu, self, (), {})
    _mark_module(self, False)
    return result


def _audited_parameter_new(cls: type, data: torch.Tensor | None = None, requires_grad: bool = True) -> Any:
    parameter = _original_parameter_new(cls, data, requires_grad)
    if data is not None and on_device(data):
        _set_mark(parameter, True)
    return parameter


def enable() -> torch.device:
    """Turn the audit on for this process (once) and return the device object lessons move things to."""
    global _active
    if _active is None:
        _active = DeviceAudit()
        _active.__enter__()
        torch.nn.Module.to = _audited_module_to  # type: ignore[method-assign]
        torch.nn.Module.cpu = _audited_module_cpu  # type: ignore[method-assign]
        torch.nn.Parameter.__new__ = _audited_parameter_new  # type: ignore[method-assign]
    return AUDIT_DEVICE


def disable() -> None:
    """Turn the audit off again (tests use it; lessons never do)."""
    global _active
    if _active is not None:
        _active.__exit__(None, None, None)
        _active = None
        torch.nn.Module.to = _original_module_to  # type: ignore[method-assign]
        torch.nn.Module.cpu = _original_module_cpu  # type: ignore[method-assign]
        torch.nn.Parameter.__new__ = _original_parameter_new  # type: ignore[method-assign]
