"""Jupyter configuration that ``python -m course_lib lab`` puts first on ``JUPYTER_CONFIG_PATH``.

Jupyter reads config files from several folders and lets the first folder on ``JUPYTER_CONFIG_PATH`` win over the
user's own (``~/.jupyter``). ``jupyter_server_config.py`` here sets the server's token from ``JUPYTER_TOKEN``, so a
user config such as ``c.IdentityProvider.token = ""`` cannot switch authentication off for the course's lab.
"""
