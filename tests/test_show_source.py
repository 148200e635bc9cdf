"""``lesson.show_source`` shows the library's own code, under the file it comes from."""

from __future__ import annotations

import inspect

import pytest

from course_lib import lesson
from course_lib.train import loop


def test_show_source_displays_the_real_function_with_its_file(monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list[str] = []
    monkeypatch.setattr(lesson, "say", shown.append)
    lesson.show_source(loop.optimizer_step)
    assert shown == [f"`course_lib/train/loop.py` · `optimizer_step`\n\n```python\n"
                     f"{inspect.getsource(loop.optimizer_step).rstrip()}\n```"]
    lesson.show_source(loop.LogWindow)
    assert shown[1].startswith("`course_lib/train/loop.py` · `LogWindow`\n\n```python\nclass LogWindow:")
