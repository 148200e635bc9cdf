"""Loaded by Jupyter (not imported): the course lab's token wins over any token in the user's configuration, and
saving an untouched course notebook writes it back unchanged (:func:`course_lib.nbclean.keep_stored_metadata`)."""

import os

try:
    c = get_config()  # provided by Jupyter's config loader
except NameError:  # imported as a module, not loaded as a config file: nothing to configure
    c = None

if c is not None and os.environ.get("JUPYTER_TOKEN"):
    c.IdentityProvider.token = os.environ["JUPYTER_TOKEN"]

if c is not None:
    from course_lib.nbclean import keep_stored_metadata

    c.ContentsManager.pre_save_hook = keep_stored_metadata
