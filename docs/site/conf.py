"""Sphinx configuration of the course website (built by ``python -m course_lib.website`` / ``make site``).

The sources are staged by the builder (README as home page, executed lessons, docs/); this file only says how to
render them. Everything used here ships in a wheel (Sphinx, myst-nb, Furo): nothing is downloaded at build time,
and the pages load no fonts, scripts or styles from the network.
"""

project = "Fast, correct PyTorch training pipelines"
html_title = project
extensions = ["myst_nb"]
root_doc = "index"
exclude_patterns = ["**/.ipynb_checkpoints"]

# Lessons arrive executed: rendering never runs them (the builder executes them, with a cache, in COURSE_MODE).
nb_execution_mode = "off"
nb_merge_streams = True
myst_heading_anchors = 3  # README links such as (#exercises-and-checking-your-work) resolve to headings
myst_enable_extensions = ["colon_fence"]

html_theme = "furo"
html_copy_source = False  # no second copy of every notebook in _sources/
html_show_sourcelink = False
html_show_sphinx = False
html_last_updated_fmt = None
# Search results without the summary Sphinx would fetch from each result's page: a fetch from a page opened from
# the file system is refused (CORS), so with summaries search only works through a web server. Without, it works
# from files too.
html_show_search_summary = False
suppress_warnings = ["myst.header"]  # a lesson's section levels are its own business, not the site's
