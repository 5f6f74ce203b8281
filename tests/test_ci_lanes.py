"""The vllm and verl lanes of `.ci/run` collect only the paths it names (`VLLM_PATHS`, `VERL_PATHS`): collecting the
whole tree for their few tests imported every test module in each of their pytest processes. A test marked for
either lane anywhere else would never run in CI; this test, in the main lane, fails first."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# pytest.mark.vllm / marks=pytest.mark.verl / pytestmark = [pytest.mark.vllm, ...]: how a test joins a lane
MARK = re.compile(r"\bmark\.(vllm|verl)\b")


def lane_paths(lane: str) -> list[Path]:
    """The paths .ci/run gives the lane's pytest (`VLLM_PATHS=(...)` / `VERL_PATHS=(...)`)."""
    found = re.search(rf"^{lane.upper()}_PATHS=\(([^)]*)\)$", (ROOT / ".ci" / "run").read_text(), re.MULTILINE)
    assert found, f".ci/run names no {lane.upper()}_PATHS"
    return [ROOT / p for p in shlex.split(found.group(1))]


def marked_files(lane: str) -> set[Path]:
    """Every test file that marks a test, a parameter or itself for the lane."""
    return {
        path
        for path in (ROOT / "tests").rglob("*.py")
        if path != Path(__file__).resolve() and lane in MARK.findall(path.read_text())
    }


@pytest.mark.parametrize("lane", ["vllm", "verl"])
def test_every_test_of_a_lane_is_in_the_paths_it_collects(lane: str) -> None:
    paths = lane_paths(lane)
    assert all(p.exists() for p in paths), [str(p) for p in paths if not p.exists()]
    files = marked_files(lane)
    assert files, f"no test is marked {lane}: the pattern no longer finds them"
    outside = sorted(str(f.relative_to(ROOT)) for f in files if not any(f == p or p in f.parents for p in paths))
    assert not outside, f"marked {lane} but outside .ci/run's {lane.upper()}_PATHS: {outside}"
