"""``python -m course_lib.train``: see :mod:`course_lib.train.cli`."""

import sys

from course_lib.train.cli import main

if __name__ == "__main__":
    sys.exit(main())
