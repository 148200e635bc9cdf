"""The one argument parser every command uses: a refusal is one ``error:`` line and exit code 2.

argparse prints its whole usage block before the error, so a learner reads five lines of options to find the one
that says what is wrong. Here the error comes alone, with the command that lists the options; ``--help`` still
prints everything.
"""

from __future__ import annotations

import argparse
from typing import NoReturn


class CommandParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line: ``error: <what is wrong> (see `<prog> --help`)``.

    Sub-commands made with ``add_subparsers`` are ``CommandParser`` too (argparse uses the parent's class).
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {' '.join(message.split())} (`{self.prog} --help` lists the options)\n")
