"""The room's measurements: each learner's verdicts, bundled with a description of their machine, drawn side by side.

Learner, after the lessons (run with ``COURSE_CLAIM_LOG=<file>`` set, as the workshop's set-up sheet says)::

    python -m course_lib progress export --out my-machine.json

Instructor, with every learner's file in one folder::

    python -m course_lib class report FOLDER [--out DIR]

Each bundle file is one machine (two files with the same host name are two machines). For each claim (a lesson's
comparison of ``a`` with ``b``) the report draws every machine's measured ratio, marks the machines whose verdict
differs from the room's majority, and those whose ratio is far from the room's median (more than
``OUTLIER_FACTOR`` times above or below it, on the log scale the plot uses) even when the verdict agrees, and gives
the likely reason from their descriptions (fewer cores, another device, a busy machine whose verdict rested on CPU
time, another torch version, smoke mode). An even split is said as a tie, with no machine marked for its direction.
Every claim is re-derived from its rounds first (the ``claims check`` logic, :func:`course_lib.perf.claims.problems`);
one that does not re-derive is not counted and the report lists it. It writes ``class-report.png`` and
``class-report.md``; files that are not bundles are skipped with one line each.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_lib import __version__, atomic, journal, mode
from course_lib.argparsing import CommandParser
from course_lib.perf import claims

BUNDLE_FORMAT = 1
OUTLIER_FACTOR = 3.0  # a ratio more than 3x above or below the room's median is marked, whatever its verdict
TIE = "tie"
__all__ = ["machine_description", "export", "load_bundles", "Claim", "machine_labels", "claims_by_comparison",
           "likely_reason", "median_ratio", "far_from_the_room", "report_markdown", "progress_markdown", "draw",
           "progress_main",
           "class_main"]


def machine_description() -> dict[str, Any]:
    """What explains a machine's numbers: cores (all, and usable here), device, torch, Python, mode, course."""
    import torch

    from course_lib.device import pick_device

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cores": os.cpu_count(), "usable_cores": usable, "machine": platform.machine(),
            "system": platform.system(), "device": pick_device().type, "torch": torch.__version__,
            "python": platform.python_version(), "mode": mode.mode(), "course": __version__}


def export(claim_log: Path, out: Path, name: str = "") -> int:
    """Bundle the claim log with this machine's description into ``out``; returns how many claims it holds."""
    lines = [json.loads(line) for line in claim_log.read_text(encoding="utf-8").splitlines() if line.strip()]
    bundle = {"format": BUNDLE_FORMAT, "kind": "course-room-bundle", "name": name or platform.node(),
              "machine": machine_description(), "claims": [c for c in lines if isinstance(c, dict)],
              "progress": journal.load()}
    atomic.write_text(out, json.dumps(bundle, indent=1) + "\n")
    return len(bundle["claims"])


def load_bundles(folder: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Every bundle in ``folder`` (``*.json``), and one line per file skipped (and why)."""
    bundles, skipped = [], []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            skipped.append(f"{path.name}: skipped, not JSON ({exc.__class__.__name__})")
            continue
        if not isinstance(data, dict) or data.get("kind") != "course-room-bundle" or \
                not isinstance(data.get("claims"), list) or not isinstance(data.get("machine"), dict):
            skipped.append(f"{path.name}: skipped, not a bundle from `progress export`")
            continue
        data["name"] = str(data.get("name") or path.stem)
        data["file"] = path.name  # one machine per file: host names repeat (a lab's identical images)
        bundles.append(data)
    return bundles, skipped


@dataclass(frozen=True)
class Claim:
    """One machine's verdict on one comparison."""

    machine: str
    description: dict[str, Any]
    outcome: str
    ratio: float
    quantity: str


def machine_labels(bundles: Sequence[dict[str, Any]]) -> list[str]:
    """How the report names each bundle's machine: its name, with the file where two bundles share a name."""
    names = Counter(b["name"] for b in bundles)
    return [b["name"] if names[b["name"]] == 1 else f"{b['name']} ({b.get('file', '?')})" for b in bundles]


def claims_by_comparison(bundles: Sequence[dict[str, Any]],
                         rejected: list[str] | None = None) -> dict[str, list[Claim]]:
    """``{"02_dataloader.ipynb: a vs b": [one Claim per bundle (its last verdict)]}``. A claim that does not
    re-derive from its rounds (:func:`claims.problems`) is left out, with one line in ``rejected``."""
    found: dict[str, dict[int, Claim]] = {}
    for index, (bundle, label) in enumerate(zip(bundles, machine_labels(bundles))):
        for raw in bundle["claims"]:
            wrong = claims.problems(raw)
            key = f"{raw.get('lesson') or '?'}: {raw.get('a')} vs {raw.get('b')}" if isinstance(raw, dict) else "?"
            if not wrong:
                ratio = float(raw["ratio"])
                if not math.isfinite(ratio) or ratio <= 0:
                    wrong = [f"ratio {ratio!r}"]
            if wrong:
                if rejected is not None:
                    rejected.append(f"{label}: {key}: not counted, {wrong[0]}")
                continue
            found.setdefault(key, {})[index] = Claim(label, bundle["machine"], raw["outcome"], ratio,
                                                     str(raw.get("quantity", "")))
    return {key: list(per_machine.values()) for key, per_machine in sorted(found.items())}


def likely_reason(odd: Claim, majority: Sequence[Claim]) -> str:
    """Why ``odd`` may disagree with the ``majority``, from what differs in its description (or its quantity)."""
    def usual(field: str) -> Any:
        values = Counter(str(c.description.get(field)) for c in majority)
        return values.most_common(1)[0][0] if values else None

    reasons = []
    mine = odd.description
    if str(mine.get("device")) != usual("device"):
        reasons.append(f"device {mine.get('device')} (most: {usual('device')})")
    if str(mine.get("usable_cores")) != usual("usable_cores"):
        reasons.append(f"{mine.get('usable_cores')} usable core(s) (most: {usual('usable_cores')})")
    if odd.quantity == "cpu" and Counter(c.quantity for c in majority).most_common(1)[0][0] != "cpu":
        reasons.append("a busy machine: its verdict rested on CPU time")
    if str(mine.get("mode")) != usual("mode"):
        reasons.append(f"{mine.get('mode')} mode (most: {usual('mode')})")
    if str(mine.get("torch")) != usual("torch"):
        reasons.append(f"torch {mine.get('torch')} (most: {usual('torch')})")
    return "; ".join(reasons) or "nothing in its description: ask what else ran during the measurement"


def _majority(claims_: Sequence[Claim]) -> tuple[str, list[Claim], list[Claim]]:
    """``(verdict, who agrees, who differs)``; an even split at the top is :data:`TIE`, with no one differing."""
    counts = Counter(c.outcome for c in claims_).most_common()
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return TIE, [], []
    outcome = counts[0][0]
    return outcome, [c for c in claims_ if c.outcome == outcome], [c for c in claims_ if c.outcome != outcome]


def _tie_said(claims_: Sequence[Claim]) -> str:
    counts = Counter(c.outcome for c in claims_)
    return "tie (" + ", ".join(f"{n} {o.replace('_', ' ')}" for o, n in sorted(counts.items())) + ")"


def median_ratio(claims_: Sequence[Claim]) -> float:
    """The room's median ratio (of the middle two, their geometric mean: ratios live on a log scale)."""
    logs = sorted(math.log(c.ratio) for c in claims_)
    middle = len(logs) // 2
    return math.exp(logs[middle] if len(logs) % 2 else (logs[middle - 1] + logs[middle]) / 2)


def far_from_the_room(claims_: Sequence[Claim]) -> list[tuple[Claim, float]]:
    """``(claim, how many times above (>1) or below (<1) the median)`` for each ratio more than
    :data:`OUTLIER_FACTOR` times away from the room's median; needs 3 machines (with 2 there is no room to be
    far from)."""
    if len(claims_) < 3:
        return []
    median = median_ratio(claims_)
    return [(c, c.ratio / median) for c in claims_
            if abs(math.log(c.ratio / median)) > math.log(OUTLIER_FACTOR)]


def report_markdown(groups: dict[str, list[Claim]], machines: int, skipped: Sequence[str],
                    rejected: Sequence[str] = ()) -> str:
    """The report's table: per comparison, the room's ratios, its majority verdict (or a tie), the machines whose
    verdict differs and those whose ratio is far from the room's median."""
    lines = [f"# The room's measurements ({machines} machines)", "",
             "| comparison | machines | ratios (min, median, max) | majority verdict | differs (likely reason) |",
             "|---|---|---|---|---|"]
    for key, claims_ in groups.items():
        ratios = sorted(c.ratio for c in claims_)
        outcome, majority, odd = _majority(claims_)
        usual = majority or claims_
        differs = [f"{c.machine}: {c.outcome} ({likely_reason(c, majority)})" for c in odd]
        differs += [f"{c.machine}: {c.ratio:.3g}x, {max(times, 1 / times):.3g}x {'above' if times > 1 else 'below'} "
                    f"the room's median ({likely_reason(c, usual)})"
                    for c, times in far_from_the_room(claims_) if c not in odd]
        verdict = _tie_said(claims_) if outcome == TIE else outcome.replace("_", " ")
        lines.append(f"| {key} | {len(claims_)} | {ratios[0]:.2f}x, {median_ratio(claims_):.2f}x, "
                     f"{ratios[-1]:.2f}x | {verdict} | {'<br>'.join(differs) or '-'} |")
    if rejected:
        lines += ["", "Claims not counted (they do not re-derive from their rounds, as `claims check` would say):",
                  *[f"- {line}" for line in rejected]]
    if skipped:
        lines += ["", "Skipped files:", *[f"- {line}" for line in skipped]]
    return "\n".join(lines) + "\n"


def progress_markdown(bundles: Sequence[dict[str, Any]]) -> str:
    """The room's progress, one row per bundle: lessons run, predictions answered (and how many matched the
    measurement), exercises checked and their points, from each learner's journal as `progress export` bundled it."""
    lines = ["# The room's progress", "",
             "| machine | lessons run | predictions answered (matched) | exercises checked | points |",
             "|---|---|---|---|---|"]
    for label, bundle in zip(machine_labels(bundles), bundles):
        data = bundle.get("progress")
        if not isinstance(data, dict) or not isinstance(data.get("lessons"), dict) \
                or not isinstance(data.get("exercises"), dict):
            lines.append(f"| {label} | not in this bundle (exported before progress was bundled) | | | |")
            continue
        clean, _ = journal.valid_entries(data)
        lessons = clean["lessons"]
        answers = [a for entry in lessons.values() for a in entry.get("predictions", {}).values()]
        matched = sum(a.get("matched") is True for a in answers)
        exercises = clean["exercises"]
        earned = sum(e["earned"] for e in exercises.values())
        possible = sum(e["possible"] for e in exercises.values())
        lines.append(f"| {label} | {sum(bool(e.get('run')) for e in lessons.values())} | {len(answers)} ({matched}) "
                     f"| {len(exercises)} | {f'{earned}/{possible}' if exercises else '-'} |")
    return "\n".join(lines) + "\n"


def draw(groups: dict[str, list[Claim]], out: Path) -> Path:
    """One row per comparison: each machine's ratio (log scale), coloured by its verdict; a ring marks a machine
    whose verdict differs from the room's majority."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"faster": "tab:blue", "slower": "tab:red", "too_close": "tab:gray"}
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(groups) + 1.6))
    for row, claims_ in enumerate(groups.values()):
        _, _, odd = _majority(claims_)
        odd = odd + [c for c, _ in far_from_the_room(claims_)]
        for claim in claims_:
            ax.scatter(claim.ratio, row, color=colours[claim.outcome], s=36, zorder=3)
            if claim in odd:
                ax.scatter(claim.ratio, row, facecolors="none", edgecolors="black", s=140, linewidths=1.2, zorder=4)
                ax.annotate(claim.machine, (claim.ratio, row), textcoords="offset points", xytext=(0, 9),
                            ha="center", fontsize=7)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yticks(range(len(groups)), list(groups), fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("measured ratio (a's speed over b's; 1 = the same)")
    ax.set_title("The room's measurements: blue faster, red slower, grey too close; ringed: differs from the room",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def progress_main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_lib progress [export --out FILE]``: the journal, or a bundle for the room's report."""
    parser = CommandParser(prog="python -m course_lib progress", description=journal.__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    bundle = sub.add_parser("export", help="bundle your claim log with this machine's description (for the room)")
    bundle.add_argument("--claims", type=Path, default=os.environ.get(claims.ENV),
                        help=f"your claim log (default: ${claims.ENV})")
    bundle.add_argument("--out", type=Path, default=Path("my-machine.json"), help="the file to hand in")
    bundle.add_argument("--name", default="", help="how the report names this machine (default: its host name)")
    args = parser.parse_args(argv)
    if args.command != "export":
        print(f"progress kept in {journal.path()}\n\n{journal.summary_markdown()}")
        return 0
    if args.claims is None or not Path(args.claims).is_file():
        parser.error(f"no claim log to export ({args.claims or f'${claims.ENV} is not set'}): run the lessons with "
                     f"{claims.ENV}=<file> set, then export that file")
    count = export(Path(args.claims), args.out, args.name)
    print(f"wrote {args.out}: {count} verdicts and this machine's description; hand it to your instructor")
    return 0


def class_main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_lib class report FOLDER [--out DIR]``."""
    parser = CommandParser(prog="python -m course_lib class", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    report = sub.add_parser("report", help="the room's measurements side by side: a plot and a table")
    report.add_argument("folder", type=Path, help="folder with every learner's bundle (*.json)")
    report.add_argument("--out", type=Path, default=None, help="where to write (default: the folder)")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        parser.error(f"{args.folder}: not a folder (put every learner's `progress export` file in one folder)")
    out = args.out or args.folder
    bundles, skipped = load_bundles(args.folder)
    for line in skipped:
        print(line, file=sys.stderr)
    rejected: list[str] = []
    groups = claims_by_comparison(bundles, rejected)
    for line in rejected:
        print(line, file=sys.stderr)
    if not groups:
        print(f"{args.folder}: no verdicts to compare in {len(bundles)} bundle(s)", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out / "class-report.md", report_markdown(groups, len(bundles), skipped, rejected) + "\n"
                      + progress_markdown(bundles))
    draw(groups, out / "class-report.png")
    print(f"{len(bundles)} machines, {len(groups)} comparisons: wrote {out / 'class-report.md'} and "
          f"{out / 'class-report.png'}")
    return 0
