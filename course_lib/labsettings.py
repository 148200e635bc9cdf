"""JupyterLab defaults the course needs: save widget state with the notebook, no autosave, and no news pop-up.

A lesson asks its predictions with ipywidgets. When a learner saves a lesson and opens it again later, the kernel
that owned those widgets is gone; unless the notebook carries the widgets' state, JupyterLab can only show
"Error displaying widget: model not found" where the question was. The widget manager
(``@jupyter-widgets/jupyterlab-manager``, plugin ``plugin``) writes that state into the notebook when its
``saveState`` setting is on, and it is off by default. And an offline-first course does not let JupyterLab ask, over
the first lesson, whether to fetch news from the internet (``@jupyterlab/apputils-extension:notification``:
``fetchNews`` "false", no update check). Autosave is off (``@jupyterlab/docmanager-extension:plugin``): running a
lesson never changes it on disk; only the learner's own save does.

:func:`ensure_course_settings` writes both as JupyterLab *settings overrides*: a default written to
``{sys.prefix}/share/jupyter/lab/settings/overrides.json`` (the app settings folder of this environment), merged
with whatever that file already holds. A value somebody set there on purpose is kept, and a learner's own user
settings still win over any override. ``python -m course_lib lab`` calls it before starting JupyterLab.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from course_lib import atomic

WIDGETS_PLUGIN = "@jupyter-widgets/jupyterlab-manager:plugin"
NOTIFICATION_PLUGIN = "@jupyterlab/apputils-extension:notification"
DOCMANAGER_PLUGIN = "@jupyterlab/docmanager-extension:plugin"
COURSE_OVERRIDES: dict[str, dict[str, Any]] = {
    WIDGETS_PLUGIN: {"saveState": True},
    # Running a lesson must not write it: JupyterLab's autosave wrote every lesson run (sometimes half-finished),
    # and the next `git pull` conflicted. A lesson changes on disk only when the learner saves it.
    DOCMANAGER_PLUGIN: {"autosave": False},
    NOTIFICATION_PLUGIN: {"fetchNews": "false", "checkForUpdates": False},
}

__all__ = ["WIDGETS_PLUGIN", "NOTIFICATION_PLUGIN", "DOCMANAGER_PLUGIN", "COURSE_OVERRIDES", "overrides_path",
           "merged_overrides", "ensure_course_settings"]


def overrides_path(app_settings_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where JupyterLab reads settings overrides: ``<app settings dir>/overrides.json``.

    The app settings folder defaults to ``{sys.prefix}/share/jupyter/lab/settings`` (what ``jupyter lab`` uses
    unless ``--LabApp.app_settings_dir`` says otherwise).
    """
    folder = Path(app_settings_dir) if app_settings_dir is not None else (
        Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings")
    return folder / "overrides.json"


def merged_overrides(existing: dict[str, Any]) -> dict[str, Any]:
    """``existing`` overrides plus the course's; a setting already present in ``existing`` is left as it is."""
    merged = {plugin: dict(values) if isinstance(values, dict) else values for plugin, values in existing.items()}
    for plugin, values in COURSE_OVERRIDES.items():
        current = merged.get(plugin)
        if not isinstance(current, dict):
            current = {}
        merged[plugin] = {**values, **current}
    return merged


def ensure_course_settings(app_settings_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """Make the course's settings JupyterLab's defaults (widget state saved, no news); return the file written, or
    ``None``.

    ``None`` means nothing needed writing (the setting is already there) or the file could not be written; in
    the latter case a warning goes to stderr and JupyterLab simply starts without the default (a saved lesson
    then shows a widget error on reopening until its cells run again). An overrides file that is not valid JSON
    is never overwritten.
    """
    path = overrides_path(app_settings_dir)
    try:
        existing = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, ValueError) as err:
        print(f"course lab: not changing {path} ({err}); widget state will not be saved with notebooks unless "
              f"you set saveState in JupyterLab's Settings > Jupyter Widgets.", file=sys.stderr)
        return None
    if not isinstance(existing, dict):
        print(f"course lab: {path} does not hold a JSON object; leaving it as it is.", file=sys.stderr)
        return None
    merged = merged_overrides(existing)
    if merged == existing:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Atomically: JupyterLab may be reading the file while another lab starts.
        atomic.write_text(path, json.dumps(merged, indent=2) + "\n", permissions=0o600)
    except OSError as err:
        print(f"course lab: could not write {path} ({err}); widget state will not be saved with notebooks.",
              file=sys.stderr)
        return None
    return path
