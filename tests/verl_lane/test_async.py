"""verl's asynchronous trainer with lanpo's store, killed and resumed: `examples/verl/rollout_cpu.py --trainer-mode
colocate_async` (verl's own `PPOTrainerColocateAsync` dispatch, warmup batch, data loader and TransferQueue
checkpoints, lanpo's sampler, manager and workers, a vLLM server in Ray) is SIGKILLed in step 3, after its
checkpoint of step 2 and after some of step 3's groups reached the store, then rerun with `--resume`. The store must
hold every group verl trained once, at the step that trained it, with the weights that generated it; every group it
dropped with its reason; and each step once (docs/verl.md, "Asynchronous training")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.db.connection import ENV_URL
from tests.verl_lane.async_run import check_async_run

pytest.importorskip("verl")
# the full lane: two more Ray clusters and vLLM servers than the verl lane's module (~400 s on 2 cores); its twin in
# the verl lane is test_rollout.py's asynchronous run on the module's server (the same sampler, manager and worker,
# without the kill); the store's side of the resume (fates undone, a re-issued group's rows replaced at its
# dispatch) is tests/feedback/test_fates.py, in the main lane
pytestmark = [
    pytest.mark.verl,
    pytest.mark.full,
    pytest.mark.long("two runs of the example, each starting its own Ray and vLLM server (~100 s each on 2 cores)"),
    pytest.mark.timeout(1500, func_only=True),
]
ROOT = Path(__file__).resolve().parents[2]
RUN = "verl-async"
STEPS = 3
BATCH = 4  # the example's data.train_batch_size
RUN_DEADLINE_S = 1200  # one run of the example: its server's start is most of it


def _example(out: Path, log: Path, *extra: str) -> subprocess.Popen:
    command = [sys.executable, str(ROOT / "examples/verl/rollout_cpu.py"), "--trainer-mode", "colocate_async"]
    command += ["--steps", str(STEPS), "--out", str(out), "--run-name", RUN, *extra]
    # its own session: the kill takes the driver and every process it started (Ray's, the server's)
    return subprocess.Popen(
        command, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, env=dict(os.environ)
    )


def _step3_written(db: Engine) -> int:
    with db.connect() as conn:
        return int(
            conn.scalar(
                sa.text(
                    "SELECT count(*) FROM rollout_groups g JOIN runs r ON r.id = g.run_id "
                    "WHERE r.name = :n AND g.step = 3"
                ),
                {"n": RUN},
            )
        )


def _kill_in_step_3(proc: subprocess.Popen, out: Path, db: Engine, log: Path) -> None:
    """SIGKILL the run once its tracker says step 2 is checkpointed and a group of step 3 is in the store."""
    tracker = out / "latest_checkpointed_iteration.txt"
    began = time.monotonic()
    while not (tracker.is_file() and tracker.read_text().strip() == "2" and _step3_written(db)):
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before step 3 could be killed:\n{_tail(log)}")
        if time.monotonic() - began > RUN_DEADLINE_S:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"no step-3 group in {RUN_DEADLINE_S} s:\n{_tail(log)}")
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def _tail(log: Path) -> str:
    return "\n".join(line for line in log.read_text(errors="replace").splitlines()[-40:] if "Warning" not in line)


@pytest.fixture(scope="module")
def resumed(migrated_db: Engine, pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("verl-async")
    out = folder / "out"
    before = os.environ.get(ENV_URL)
    os.environ[ENV_URL] = pg_url
    try:
        killed = _example(out, folder / "killed.log")
        _kill_in_step_3(killed, out, migrated_db, folder / "killed.log")
        again = _example(out, folder / "resumed.log", "--resume")
        try:
            rc = again.wait(timeout=RUN_DEADLINE_S)
        finally:
            if again.poll() is None:
                os.killpg(again.pid, signal.SIGKILL)
        assert rc == 0, _tail(folder / "resumed.log")
    finally:
        if before is None:
            os.environ.pop(ENV_URL, None)
        else:
            os.environ[ENV_URL] = before
    return folder


def test_the_killed_run_resumed_after_its_checkpoint(resumed: Path) -> None:
    log = (resumed / "resumed.log").read_text(errors="replace")
    assert f"resuming {RUN} after step 2" in log
    assert [line.split(":")[0] for line in log.splitlines() if line.startswith("step ")] == ["step 3"]


def test_every_group_is_in_the_store_once_with_its_fate_and_its_weights(resumed: Path, migrated_db: Engine) -> None:
    check_async_run(migrated_db, RUN, STEPS, BATCH)
