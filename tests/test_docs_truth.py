"""A figure in the README or a reference page is traced to the run that produced it (docs/contributing.md, "The log").

Each check here caught a claim that had gone stale while nothing failed:

- a figure in a sentence that links a dated docs/log.md entry appears in that entry (the README's suite time was
  quoted from no entry at all);
- the suite's time, in the README and in docs/contributing.md, links the newest log entry that timed a fresh clone
  (a new entry left the README's figure two clones behind);
- the README's results table quotes the section it links, and carries every difference docs/results.md marks as past
  two standard errors (it led with an older run and left out the newest);
- "N lines" in the README is the number of lines docs/trl.md and docs/verl.md mark as lanpo's (the README said four
  where docs/trl.md marks seven).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_docs_log import REFERENCE, entries, prose, slug

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LOG_ANCHOR = re.compile(r"\]\((?:\.\./|docs/)?log\.md#([^)\s]+)\)")
# A measured figure: a decimal, a number with thousands separators, or a whole number with its unit.
FIGURE = re.compile(r"\d[\d,]*\.\d+|\d{1,3}(?:,\d{3})+|\d+(?= ?(?:s|ms|min|GB|GiB|MB|%|x|tests)\b)")
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven"]


def _log_sections() -> dict[str, str]:
    """Each log entry's anchor -> its text (an entry's own ### subsections included)."""
    return {slug(heading): "\n".join(lines) for _, heading, lines in entries()}


def _plain(text: str) -> str:
    return text.replace("\u2212", "-").replace("**", "")


def sentences(path: Path) -> list[tuple[int, str]]:
    """(first line, sentence) of the prose of a page: paragraphs joined across lines, table rows and list items
    each their own paragraph, split after a full stop or a semicolon."""
    blocks: list[list[tuple[int, str]]] = []
    current: list[tuple[int, str]] = []
    for number, text in prose(path):
        starts_own = text.lstrip().startswith(("|", "- ", "#")) or re.match(r"\s*\d+\. ", text)
        if not text.strip() or starts_own:
            if current:
                blocks.append(current)
            current = [(number, text)] if text.strip() else []
            continue
        current.append((number, text))
    if current:
        blocks.append(current)
    out = []
    for block in blocks:
        joined = " ".join(text.strip() for _, text in block)
        out += [(block[0][0], s) for s in re.split(r"(?<=[.;])\s+(?=[A-Z(`*\[])", joined)]
    return out


def test_a_figure_beside_a_log_link_is_in_that_entry() -> None:
    log = _log_sections()
    problems = []
    for path in [README, *REFERENCE]:
        for number, sentence in sentences(path):
            anchors = LOG_ANCHOR.findall(sentence)
            if not anchors:
                continue
            source = _plain(" ".join(log.get(a, "") for a in anchors))
            missing = sorted({f for f in FIGURE.findall(LOG_ANCHOR.sub("", sentence)) if f not in source})
            if missing:
                problems.append(f"{path.relative_to(ROOT)}:{number}: {missing} not in #{', #'.join(anchors)}")
    assert not problems, (
        "a figure quoted beside a link to the log is not in the linked entry: quote the entry, or measure again and "
        "add an entry on top of docs/log.md\n" + "\n".join(problems)
    )


def _newest_suite_entry() -> str:
    """The anchor of the newest log entry that timed `bash .ci/run` on a fresh clone."""
    for _, heading, lines in entries():
        text = "\n".join(lines)
        reproduce = [line for line in lines if line.startswith("Reproduce:")]
        if "fresh clone" in text and any("bash .ci/run" in line for line in reproduce):
            return slug(heading)
    raise AssertionError("no entry of docs/log.md times `bash .ci/run` on a fresh clone")


def _paragraph_with(path: Path, phrase: str) -> str:
    for _, sentence in sentences(path):
        if phrase in sentence:
            return sentence
    raise AssertionError(f"{path.relative_to(ROOT)} has no sentence with {phrase!r}")


def test_the_suites_time_is_the_newest_fresh_clones() -> None:
    newest = _newest_suite_entry()
    for path, phrase in [(README, "`bash .ci/run`"), (ROOT / "docs" / "contributing.md", "Where it stands")]:
        sentence = _paragraph_with(path, phrase)
        linked = LOG_ANCHOR.findall(sentence)
        assert newest in linked, (
            f"{path.relative_to(ROOT)}: the suite's time ({sentence[:120]!r}) links {linked or 'no log entry'}, "
            f"not the newest fresh clone's, #{newest}: quote that entry's figures and link it"
        )


# --------------------------------------------------------------------------- the README's results


def _readme_results_rows() -> list[tuple[int, str]]:
    lines = README.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("## Where the results stand"))
    rows = []
    for number, line in enumerate(lines[start + 1 :], start + 2):
        if line.startswith("## "):
            break
        if line.startswith("|") and not re.match(r"\|\s*(---|comparison)", line):
            rows.append((number, line))
    return rows


def _section(path: Path, anchor: str) -> str:
    """The text under the heading whose anchor is `anchor`, up to the next heading of the same or a higher level."""
    out, level = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"(#+) ", line)
        if heading and level and len(heading.group(1)) <= level:
            break
        if level:
            out.append(line)
        elif heading and slug(line) == anchor:
            level = len(heading.group(1))
    return "\n".join(out)


SIGNED = re.compile(r"[+\-−]\d+\.\d+(?: ± \d+\.\d+)?")


def test_the_readmes_results_quote_the_sections_they_link() -> None:
    rows = _readme_results_rows()
    assert rows, "README.md: no results table under 'Where the results stand'"
    problems = []
    for number, row in rows:
        link = re.search(r"\]\((docs/[\w.]+\.md)#([^)]+)\)", row)
        if not link:
            if SIGNED.search(row):
                problems.append(f"README.md:{number}: a figure without a link to its section")
            continue
        source = _plain(_section(ROOT / link.group(1), link.group(2)))
        assert source, f"README.md:{number}: {link.group(1)}#{link.group(2)} is no heading"
        for figure in SIGNED.findall(_plain(row)):
            for part in figure.split(" ± "):
                if part not in source:
                    problems.append(f"README.md:{number}: {part} is not in {link.group(1)}#{link.group(2)}")
    assert not problems, "\n".join(problems)


def test_the_readme_carries_every_difference_results_md_marks() -> None:
    """A difference docs/results.md sets in bold (past two standard errors, or the pooled headline) is in the
    README's table: the summary cannot keep an older run's figure and leave out the newer one."""
    readme = _plain("\n".join(row for _, row in _readme_results_rows()))
    marked = re.findall(r"\*\*([+\-−]\d+\.\d+(?: ± \d+\.\d+)?)\*\*", (ROOT / "docs" / "results.md").read_text())
    assert marked, "docs/results.md marks no difference in bold"
    missing = [m for m in marked if _plain(m) not in readme]
    assert not missing, f"README.md's results table leaves out {missing}, which docs/results.md marks"


# --------------------------------------------------------------------------- "N lines"


def _marked_lines(page: str, fence: str, marker: re.Pattern[str]) -> int:
    """Lines of the page's first ```fence block that match the marker, up to a top-level `lanpo:` key (lanpo's own
    block in a verl config, which is its recipe, not lines added to verl's)."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    block = re.search(rf"```{fence}\n(.*?)```", text, re.S)
    assert block, f"docs/{page} has no ```{fence} block"
    lines = block.group(1).split("\nlanpo:")[0].splitlines()
    return sum(1 for line in lines if marker.search(line))


def test_the_readmes_line_counts_are_the_pages_marked_lines() -> None:
    trl = _marked_lines("trl.md", "python", re.compile(r"#\s*lanpo\b"))
    # verl's own keys that name lanpo (the `lanpo:` block below them is lanpo's recipe, counted apart)
    verl = _marked_lines("verl.md", "yaml", re.compile(r"^\s+\w+: lanpo[\w.]*\s"))
    text = " ".join(README.read_text(encoding="utf-8").split())
    for count, where in [(trl, "docs/trl.md"), (verl, "docs/verl.md")]:
        claim = re.search(rf"(\w+) (?:marked |config )?(?:lines|keys)\b.{{0,200}}?\]\({re.escape(where)}\)", text)
        assert claim, f"README.md names no count of lines beside its link to {where}"
        assert claim.group(1) == NUMBER_WORDS[count], (
            f"README.md says {claim.group(1)!r} lines for {where}, which marks {NUMBER_WORDS[count]}"
        )


# --------------------------------------------------------------------------- the budget


def test_the_lane_shares_in_contributing_are_ci_runs() -> None:
    """docs/contributing.md's table of lanes gives each lane's share of the budget, and .ci/run prints each lane
    against its own copy of the number: the two are one number."""
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    shares = {name.lower(): int(value) for name, value in re.findall(r"^(\w+)_BUDGET_S=(\d+)\b", script, re.M)}
    table = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    documented = {
        lane.strip("() "): int(share) for lane, share in re.findall(r"^\| ([\w() ]+?) \|.*\| (\d+) \|$", table, re.M)
    }
    assert shares and documented == shares, f"docs/contributing.md says {documented}, .ci/run {shares}"
    target = int(re.search(r"^TARGET_S=\$\(\((\d+) \* 60\)\)", script, re.M).group(1)) * 60
    assert sum(shares.values()) == target, f"the shares add up to {sum(shares.values())} s, the target is {target}"
