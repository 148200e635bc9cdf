"""``python -m course_lib <command>``: see :mod:`course_lib.cli`."""

from course_lib.cli import main

raise SystemExit(main())
