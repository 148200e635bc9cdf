"""The course lab's contents manager: a lesson opens unmodified, and saving it leaves it as stored.

Opening a notebook, JupyterLab writes the kernel's full ``language_info`` (Python's version included) and its
kernelspec's display name into the notebook's metadata; a stored lesson carries only their clean form
(:mod:`course_lib.nbclean`), so every lesson was marked modified the moment it opened ("Save your work?" on closing
it, "Leave site?" on a reload). JupyterLab changes nothing when the value it sets equals the one there, so
:class:`CourseContentsManager` serves a clean-form notebook with the metadata this lab's kernel will report, and its
save hook (:func:`course_lib.nbclean.keep_stored_metadata`) writes the stored form back. The file on disk never sees
the filled-in values.

Registered in ``course_lib/lab_auth/jupyter_server_config.py`` (``ServerApp.contents_manager_class``). The save
hook is registered here rather than through the ``pre_save_hook`` setting, which the server applies twice and
warned about at every start.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager

from course_lib.nbclean import keep_stored_metadata

__all__ = ["CourseContentsManager", "is_clean_form", "as_the_kernel_reports"]


def is_clean_form(metadata: Any) -> bool:
    """Whether notebook ``metadata`` is in the course's stored form (kernelspec and ``language_info.name`` only)."""
    if not isinstance(metadata, dict) or set(metadata) - {"kernelspec", "language_info"}:
        return False
    language = metadata.get("language_info", {})
    return isinstance(language, dict) and not set(language) - {"name"}


def kernel_language_info() -> dict[str, Any]:
    """What an IPython kernel of this environment reports as its ``language_info``."""
    from ipykernel.ipkernel import IPythonKernel

    return dict(IPythonKernel.language_info)


def as_the_kernel_reports(metadata: dict[str, Any], spec: dict[str, str] | None) -> dict[str, Any]:
    """``metadata`` of a clean-form Python notebook with what JupyterLab will set on connecting its kernel:
    the kernel's ``language_info`` and the kernelspec's ``{name, display_name, language}`` (``spec``: the
    kernelspec's display name and language, ``None`` when unknown). Anything else is returned as it is."""
    if not is_clean_form(metadata) or metadata.get("language_info", {}).get("name", "python") != "python":
        return metadata
    filled = {**metadata, "language_info": kernel_language_info()}
    kernelspec = metadata.get("kernelspec")
    if spec is not None and isinstance(kernelspec, dict) and kernelspec.get("name"):
        filled["kernelspec"] = {"name": kernelspec["name"], **spec}
    return filled


class CourseContentsManager(AsyncLargeFileManager):
    """Jupyter server's default contents manager, serving clean-form notebooks as their kernel will fill them in
    and saving them back in their stored form (see the module's docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.register_pre_save_hook(keep_stored_metadata)

    def _kernelspec(self, name: str) -> dict[str, str] | None:
        manager = getattr(self.parent, "kernel_spec_manager", None)
        try:
            spec = manager.get_kernel_spec(name) if manager is not None else None
        except Exception:  # no such kernelspec here: JupyterLab will ask which kernel to use anyway
            return None
        return None if spec is None else {"display_name": spec.display_name, "language": spec.language}

    async def get(self, path: str, content: bool = True, type: str | None = None, format: str | None = None,
                  **kwargs: Any) -> dict[str, Any]:
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if model.get("type") == "notebook" and isinstance(model.get("content"), dict):
            metadata = model["content"].get("metadata", {})
            name = (metadata.get("kernelspec") or {}).get("name", "") if isinstance(metadata, dict) else ""
            model["content"]["metadata"] = as_the_kernel_reports(metadata, self._kernelspec(name) if name else None)
        return model
