"""A rank left waiting in a collective fails after $LANPO_DIST_TIMEOUT instead of hanging the job for ever."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import timedelta

import pytest

from lanpo.errors import ConfigError
from lanpo.train.plumbing.dist import ENV_TIMEOUT, dist_timeout

# Rank 1 never reaches the broadcast rank 0 waits in (as when a rank dies or stalls during SFT's broadcast).
SCRIPT = """
import time, torch, torch.distributed as dist
from lanpo.train.plumbing.dist import init_from_env
d = init_from_env()
if d.rank == 0:
    started = time.perf_counter()
    try:
        dist.broadcast_object_list([None], src=1)
    except Exception as exc:
        print(f"rank 0 gave up after {time.perf_counter() - started:.1f} s:", type(exc).__name__, flush=True)
        raise SystemExit(3)
else:
    time.sleep(120)
"""


def test_a_rank_blocked_in_a_broadcast_gives_up_after_the_timeout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "stall.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", **{ENV_TIMEOUT: "5"})
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    out = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    found = re.search(r"rank 0 gave up after ([0-9.]+) s", out.stdout + out.stderr)
    assert found, out.stderr[-2000:]
    assert 4 <= float(found.group(1)) < 60 and out.returncode != 0  # the 5 s timeout, not the other rank's 120 s


@pytest.mark.parametrize("raw", ["abc", "0", "-5"])
def test_a_bad_timeout_names_the_variable(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_TIMEOUT, raw)
    with pytest.raises(ConfigError, match=ENV_TIMEOUT):
        dist_timeout()


def test_the_default_timeout_is_an_hour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_TIMEOUT, raising=False)
    assert dist_timeout() == timedelta(hours=1)
