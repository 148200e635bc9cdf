"""The JupyterLab override that saves widget state with notebooks: the right plugin and setting, merged safely."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from course_lib import labsettings


def _installed_widget_schema() -> Path | None:
    package, plugin = labsettings.WIDGETS_PLUGIN.split(":")
    for root in (Path(sys.prefix) / "share" / "jupyter" / "labextensions" / package / "schemas",
                 Path(sys.prefix) / "share" / "jupyter" / "lab" / "schemas"):
        path = root / package / f"{plugin}.json"
        if path.is_file():
            return path
    return None


def test_the_override_names_a_real_setting_of_the_installed_widget_manager() -> None:
    schema_path = _installed_widget_schema()
    if schema_path is None:
        pytest.skip("jupyterlab_widgets is not installed in this environment")
    schema = json.loads(schema_path.read_text())
    for setting, value in labsettings.COURSE_OVERRIDES[labsettings.WIDGETS_PLUGIN].items():
        assert schema["properties"][setting]["type"] == "boolean" and isinstance(value, bool)
        assert schema["properties"][setting]["default"] is False  # why the course has to override it


def test_merge_keeps_other_settings_and_explicit_choices(tmp_path: Path) -> None:
    path = labsettings.overrides_path(tmp_path)
    path.write_text(json.dumps({"@jupyterlab/apputils-extension:themes": {"theme": "JupyterLab Dark"}}))
    assert labsettings.ensure_course_settings(tmp_path) == path
    written = json.loads(path.read_text())
    assert written["@jupyterlab/apputils-extension:themes"] == {"theme": "JupyterLab Dark"}
    assert written[labsettings.WIDGETS_PLUGIN] == {"saveState": True}
    assert labsettings.ensure_course_settings(tmp_path) is None  # already there: nothing written
    chosen = {labsettings.WIDGETS_PLUGIN: {"saveState": False}, labsettings.NOTIFICATION_PLUGIN: {"fetchNews": "true"}}
    path.write_text(json.dumps(chosen))
    assert labsettings.ensure_course_settings(tmp_path) == path  # only what is missing is added
    written = json.loads(path.read_text())
    assert written[labsettings.WIDGETS_PLUGIN] == {"saveState": False}  # somebody chose these on purpose
    assert written[labsettings.NOTIFICATION_PLUGIN] == {"fetchNews": "true", "checkForUpdates": False}


def test_the_news_override_names_real_settings_of_the_installed_lab() -> None:
    import jupyterlab

    schema_path = (Path(sys.prefix) / "share" / "jupyter" / "lab" / "schemas" / "@jupyterlab" / "apputils-extension"
                   / "notification.json")
    if not schema_path.is_file():
        pytest.skip(f"JupyterLab {jupyterlab.__version__} has no notification settings schema here")
    properties = json.loads(schema_path.read_text())["properties"]
    overrides = labsettings.COURSE_OVERRIDES[labsettings.NOTIFICATION_PLUGIN]
    fetch_news = properties["fetchNews"]  # JupyterLab 4.2 lists its choices as an enum, later ones as titled oneOf
    choices = fetch_news.get("enum") or [choice["const"] for choice in fetch_news["oneOf"]]
    assert overrides["fetchNews"] in choices
    assert properties["checkForUpdates"]["type"] == "boolean" and overrides["checkForUpdates"] is False


def test_a_missing_folder_is_created_and_a_broken_file_is_left_alone(tmp_path: Path, capsys) -> None:
    fresh = tmp_path / "new" / "settings"
    assert labsettings.ensure_course_settings(fresh) == fresh / "overrides.json"
    broken = labsettings.overrides_path(tmp_path)
    broken.write_text("{not json")
    assert labsettings.ensure_course_settings(tmp_path) is None
    assert broken.read_text() == "{not json" and "not changing" in capsys.readouterr().err
    assert labsettings.overrides_path().parts[-5:] == ("share", "jupyter", "lab", "settings", "overrides.json")
