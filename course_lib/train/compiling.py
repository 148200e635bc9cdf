"""``torch.compile`` or an honest eager fallback: the part of compiling that the training loop needs.

:func:`compile_blocker` names what stops compile from working here (no TorchDynamo for this platform, no C++
compiler for Inductor, partial MPS support) before any work is done; :func:`compile_or_eager` compiles when
nothing blocks it and otherwise runs eager, saying why. Lesson 07 teaches compile itself
(:mod:`course_lib.perf.compile` measures it); the template (:mod:`course_lib.train.loop`) only switches it on.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from typing import Any

import torch

MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_blocker(device: torch.device | str = "cpu", backend: str = "inductor") -> str | None:
    """Why ``torch.compile`` cannot work here, or ``None`` if nothing is known to block it.

    Checked before any work: the platform is supported by TorchDynamo; Inductor has a C/C++ compiler to call
    (Windows needs MSVC's ``cl.exe`` on PATH, i.e. a "Developer Command Prompt"); MPS support is partial.

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    try:
        from torch._dynamo.eval_frame import is_dynamo_supported

        if not is_dynamo_supported():
            python = sys.version.split()[0]
            return f"TorchDynamo does not support this platform/Python ({sys.platform}, Python {python})."
    except Exception as exc:
        return f"TorchDynamo could not be imported: {exc}"
    if backend != "inductor":
        return None
    device = torch.device(device)
    if sys.platform == "win32" and not shutil.which("cl"):
        return ("Windows without MSVC: Inductor needs cl.exe on PATH (install Visual Studio Build Tools and start "
                "from the 'x64 Native Tools' prompt), or use WSL2.")
    if device.type == "cpu" or device.type == "cuda":
        compilers = [os.environ.get("CXX", ""), "g++", "c++", "clang++", "cl"]
        if not any(c and shutil.which(c) for c in compilers):
            return "no C++ compiler found (Inductor generates C++): install gcc/g++ (Linux) or Xcode CLT (macOS)."
    if device.type == "mps":
        return "Inductor's MPS support is partial in this PyTorch; compile on MPS is not relied on in this course."
    return None


def check_mode(mode: Any) -> None:
    """Refuse a ``mode`` that ``torch.compile`` does not know, before anything is compiled."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not one of {MODES}. Pass it by keyword: torch.compile(model, mode=...).")


def compile_or_eager(
    model: torch.nn.Module,
    *,
    mode: str | None = None,
    dynamic: bool | None = None,
    fullgraph: bool = False,
    backend: str | Callable = "inductor",
    device: torch.device | str | None = None,
) -> tuple[torch.nn.Module, str | None]:
    """``(torch.compile(model, ...), None)``, or ``(model, reason)`` with the reason printed when compile cannot work.

    Only the *known* blockers are checked here; compile is lazy, so use
    :func:`course_lib.perf.compile.warm_compile` to make the first call (where most failures appear) and fall back.

    Taught in lesson 11 (``notebooks/11_capstone.ipynb``).
    """
    check_mode(mode)
    if device is None:
        first = next(iter(model.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
    reason = compile_blocker(device, backend if isinstance(backend, str) else "custom")
    if reason is not None:
        print(f"torch.compile skipped, running eager: {reason}")
        return model, reason
    return torch.compile(model, mode=mode, dynamic=dynamic, fullgraph=fullgraph, backend=backend), None


def maybe_compile(model: torch.nn.Module, enabled: bool) -> torch.nn.Module:
    """``torch.compile`` the model when ``enabled`` (eager, with the reason printed, where compile cannot work)."""
    return compile_or_eager(model)[0] if enabled else model

