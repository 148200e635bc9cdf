"""``python -m course_lib.train``: see :mod:`course_lib.train.cli`."""

import sys

try:
    from course_lib.train.cli import main  # imports torch: seconds, in which Ctrl-C is likely
except KeyboardInterrupt:
    print("\nerror: interrupted (Ctrl-C) while starting; nothing was done.", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main())
