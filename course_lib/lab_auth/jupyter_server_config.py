"""Loaded by Jupyter (not imported): the course lab's token wins over any token in the user's configuration, and
a course notebook opens unmodified and saving an untouched one writes it back unchanged
(:mod:`course_lib.labcontents`)."""

import os

try:
    c = get_config()  # provided by Jupyter's config loader
except NameError:  # imported as a module, not loaded as a config file: nothing to configure
    c = None

if c is not None and os.environ.get("JUPYTER_TOKEN"):
    c.IdentityProvider.token = os.environ["JUPYTER_TOKEN"]

if c is not None:
    c.ServerApp.contents_manager_class = "course_lib.labcontents.CourseContentsManager"
