"""Every command refuses bad arguments in one ``error:`` line with exit code 2 (docs/grading.md), never argparse's
usage block: whether argparse found the problem or the command did."""

from __future__ import annotations

import pytest

from course_lib import cli

# A valid first word for the commands whose parser has sub-commands, so the bad option reaches the sub-command.
SUBCOMMAND = {"data": ["prepare"], "claims": ["check"], "class": ["report"], "progress": []}


def refusal(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """What a refused command printed on stderr; it exited with 2 (raised, or returned as `train` does)."""
    try:
        code = cli.main(argv)
    except SystemExit as exited:
        code = exited.code
    err = capsys.readouterr().err
    assert code == 2, (argv, code, err)
    return err


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_an_unknown_option_is_one_error_line(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = refusal(capsys, [command, *SUBCOMMAND.get(command, []), "--no-such-option"])
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    # It names the problem: the unknown option, or what is missing before it.
    assert ("--no-such-option" in lines[0] or "required" in lines[0]) and "--help" in lines[0] and "usage:" not in err


@pytest.mark.parametrize("argv", [
    ["grade", "/no/such/folder"],                          # the command's own check, through parser.error
    ["bench", "--threads", "many"],                        # argparse's type check
    ["check", "05", "--notebooks", "/no/such/folder"],
])
def test_a_bad_value_is_one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    err = refusal(capsys, argv)
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err


def test_help_still_prints_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["grade", "--help"])
    assert exited.value.code == 0 and "usage:" in capsys.readouterr().out
