"""docs/log.md keeps the history, the reference pages say what is true now (docs/contributing.md, "The log").

- every entry of docs/log.md is a `## YYYY-MM-DD: title` heading, newest first, with a `Machine:` line and a
  `Reproduce:` line carrying a command in backticks;
- the README and the reference pages (every docs page but the log, and docs/learning/README.md) carry no date and
  no "before issue N" outside a link to the log: a dated run, or the story of how a figure was reached, goes into the
  log, and the page links to its entry;
- every link to the log names an entry (or a section of one) that exists.
"""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "docs" / "log.md"
REFERENCE = [p for p in sorted((ROOT / "docs").glob("*.md")) if p != LOG] + [ROOT / "docs" / "learning" / "README.md"]

ENTRY = re.compile(r"## (\d{4}-\d{2}-\d{2}): \S")
ISO_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
BEFORE_ISSUE = re.compile(r"\b(?:before|after|since) issue \d+", re.IGNORECASE)
LOG_LINK = re.compile(r"\[[^\]]*\]\((?:\.\./|docs/)?log\.md(?:#[^)\s]*)?\)")
COMMAND = re.compile(r"^Reproduce:.*`[^`]+`")


def prose(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside code fences (a fence holds a program's output, not the page's)."""
    out, fenced = [], False
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if re.match(r"\s*(```|~~~)", text):
            fenced = not fenced
        elif not fenced:
            out.append((number, text))
    return out


def entries() -> list[tuple[int, str, list[str]]]:
    """(line number, heading, lines) of each `## ` section of the log."""
    out: list[tuple[int, str, list[str]]] = []
    for number, text in prose(LOG):
        if text.startswith("## "):
            out.append((number, text, []))
        elif out:
            out[-1][2].append(text)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces to hyphens."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_log_entries_are_dated_newest_first_with_machine_and_command() -> None:
    found, problems = entries(), []
    assert len(found) >= 10, "docs/log.md has too few entries to be the project's log"
    previous = None
    for number, heading, lines in found:
        where = f"docs/log.md:{number}: {heading}"
        match = ENTRY.match(heading)
        if not match:
            problems.append(f"{where}: an entry's heading is `## YYYY-MM-DD: title`")
            continue
        day = date.fromisoformat(match.group(1))
        if previous is not None and day > previous:
            problems.append(f"{where}: newer than the entry above it (newest first)")
        previous = day
        if not any(re.match(r"Machine: \S", line) for line in lines):
            problems.append(f"{where}: no `Machine:` line (cores, CPU, GPU or not)")
        if not any(COMMAND.match(line) for line in lines):
            problems.append(f"{where}: no `Reproduce:` line with a command in backticks")
    assert not problems, "\n".join(problems)


def test_reference_pages_carry_no_dated_history() -> None:
    problems = []
    for path in [ROOT / "README.md", *REFERENCE]:
        for number, text in prose(path):
            rest = LOG_LINK.sub("", text)
            for found in ISO_DATE.findall(rest) + BEFORE_ISSUE.findall(rest):
                problems.append(f"{path.relative_to(ROOT)}:{number}: {found!r} in {text.strip()[:100]!r}")
    assert not problems, (
        "dated history in a reference page: move the run or the story into docs/log.md and link its entry\n"
        + "\n".join(problems)
    )


def test_links_to_the_log_name_its_entries() -> None:
    anchors = {slug(text) for _, text in prose(LOG) if re.match(r"#{1,6} ", text)}
    problems = []
    for path in [*REFERENCE, LOG, ROOT / "README.md"]:
        for number, text in prose(path):
            targets = re.findall(r"\]\((?:\.\./)?log\.md#([^)\s]+)\)", text)
            if path == LOG:
                targets += re.findall(r"\]\(#([^)\s]+)\)", text)
            missing = [t for t in targets if t not in anchors]
            problems += [f"{path.relative_to(ROOT)}:{number}: #{t} is no heading of docs/log.md" for t in missing]
    assert not problems, "\n".join(problems)
