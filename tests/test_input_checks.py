"""The Python API refuses the same bad input as the command line, with the same messages (InputError / ConfigError).

The checks live in the repositories, configs and helpers, not in click callbacks; `tests/test_cli_errors.py`
drives them through the CLI, these call them directly.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lanpo.config import from_mapping
from lanpo.db import migrate
from lanpo.db.connection import checked_url, current_revision
from lanpo.db.repo import contexts, problems, runs
from lanpo.errors import HINT_LIMIT, ConfigError, InputError
from lanpo.inference.config import SamplingSettings
from lanpo.models import check_adapter_dir, check_device, check_model_ref
from lanpo.paths import atomic_write, output_dir, output_file
from lanpo.retrieval.relevance import relevance_status
from lanpo.retrieval.search import SearchParams
from lanpo.train.config import GRPOConfig, TrainConfig
from tests.db.store_helpers import make_attempts, make_pool, make_problems, relevance

INT64_MAX = 2**63 - 1


@pytest.mark.parametrize("ref", [str(INT64_MAX + 1), "0", "-3"])
def test_problem_ids_outside_bigint_say_the_range(session: Session, ref: str) -> None:
    with pytest.raises(InputError, match=f"problem id {ref} is out of range: ids are integers from 1 to {INT64_MAX}"):
        problems.resolve_refs(session, [ref])
    with pytest.raises(InputError, match="out of range"):
        problems.problems_by_ids(session, [int(ref)])


def test_an_unknown_run_id_is_refused_not_an_empty_draw(session: Session) -> None:
    (pid,) = make_problems(session, 1)
    make_attempts(session, pid, 2)
    with pytest.raises(InputError, match="no run with id 999") as err:
        contexts.intra_contexts(session, [pid], k=2, candidates=4, seed=0, run_id=999)
    assert "lanpo runs" in (err.value.hint or "")
    with pytest.raises(InputError, match="out of range"):
        runs.require_run(session, INT64_MAX + 1)
    run = runs.create_run(session, "r", "train")
    assert contexts.intra_contexts(session, [pid], k=2, candidates=4, seed=0, run_id=run.id) == {pid: []}


def test_an_unknown_scorer_is_refused_and_the_known_ones_listed(session: Session) -> None:
    a, b = make_problems(session, 2)
    pool = make_pool(session).id
    with pytest.raises(InputError, match="unknown relevance scorer 'nope'") as empty:
        contexts.inter_contexts(session, [a], k=2, candidates=4, seed=0, gamma=0.5, scorer="nope", pool_id=pool)
    assert "lanpo relevance build" in (empty.value.hint or "")
    relevance(session, a, b, 0.3, scorer="judge")
    with pytest.raises(InputError) as err:
        contexts.inter_contexts(session, [a], k=2, candidates=4, seed=0, gamma=0.5, scorer="nope", pool_id=pool)
    assert err.value.hint == "scorers in the store: judge"
    # a known scorer with nothing at gamma is an honest empty draw
    draw = contexts.inter_contexts(session, [a], k=2, candidates=4, seed=0, gamma=0.5, scorer="judge", pool_id=pool)
    assert draw == {a: []}


def test_relevance_status_of_an_unknown_dataset_lists_the_datasets(session: Session) -> None:
    make_problems(session, 2, dataset="mine")
    assert relevance_status(session, "mine", 0.9) == []  # known, just not scored yet
    with pytest.raises(InputError, match="unknown dataset 'nosuch'") as err:
        relevance_status(session, "nosuch", 0.9)
    assert err.value.hint == "datasets in the store: mine"
    with pytest.raises(InputError, match="gamma"):
        relevance_status(session, "mine", math.nan)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("localhost:5432/lanpo", "is not a database URL"),
        ("postgresql://u:secret@h:port/db", "is not a database URL"),
        ("postgresql://u@h:0/db", "port 0 is not in 1..65535"),
        ("sqlite:///x.db", "is not a Postgres URL"),
    ],
)
def test_database_urls_are_checked(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as err:
        checked_url(url)
    assert err.value.hint and "postgresql://user:pass@host:5432/dbname" in err.value.hint
    assert "secret" not in err.value.message


def test_good_database_urls_get_the_psycopg_driver() -> None:
    assert checked_url("postgres://u:p@h:5432/db") == "postgresql+psycopg://u:p@h:5432/db"
    assert checked_url(" postgresql+psycopg://h/db ") == "postgresql+psycopg://h/db"


@pytest.mark.parametrize("revision", ["nosuch", "9999", "+1"])
def test_migrating_to_an_unknown_revision_points_to_the_history(db: Engine, revision: str) -> None:
    before = current_revision(db)
    with pytest.raises(InputError, match=re.escape(f"cannot upgrade to revision '{revision}'")) as err:
        migrate.upgrade(db, revision)
    hint = err.value.hint or ""
    assert f"the database is at {before}" in hint and "`lanpo db history` lists the revisions" in hint
    assert len(hint) < HINT_LIMIT  # it used to list every revision, and grew with each migration
    assert current_revision(db) == before


def test_config_numbers_must_be_finite_and_fit_64_bits() -> None:
    with pytest.raises(ConfigError, match=r"grpo\.beta must be a finite number"):
        from_mapping(TrainConfig, {"grpo": {"beta": math.nan}})
    with pytest.raises(ConfigError, match="learning_rate must be a finite number"):
        from_mapping(GRPOConfig, {"learning_rate": math.inf})
    with pytest.raises(ConfigError, match="steps must be a 64-bit integer"):
        from_mapping(TrainConfig, {"steps": 2**70})
    with pytest.raises(ConfigError, match=r"sampling\.temperature"):
        SamplingSettings(temperature=math.nan)
    with pytest.raises(ConfigError, match=r"sampling\.seed"):
        SamplingSettings(seed=2**64)


def test_search_params_keep_ef_search_within_pgvector_limits() -> None:
    with pytest.raises(InputError, match=r"ef_search must be in 1\.\.1000"):
        SearchParams(stage1="vector", ef_search=1001)
    with pytest.raises(InputError, match="ef_search must be an integer"):
        SearchParams(stage1="vector", ef_search=1.5)  # type: ignore[arg-type]


def test_model_references_devices_and_adapters_are_checked_before_loading(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        check_model_ref(tmp_path / "missing")
    with pytest.raises(InputError, match=r"no config\.json"):
        check_model_ref(tmp_path)
    check_model_ref("smollm2")
    check_model_ref("org/some-hub-id")  # may be in the HF cache: only loading can tell
    with pytest.raises(InputError, match="unknown torch device 'gpu0'"):
        check_device("gpu0")
    check_device("cpu")
    with pytest.raises(InputError, match="holds no PEFT adapter"):
        check_adapter_dir(tmp_path)


def test_output_paths_are_checked_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="does not exist") as err:
        output_file(tmp_path / "no" / "out.jsonl", "--out")
    assert err.value.hint == f"create it first: mkdir -p {tmp_path / 'no'}"
    with pytest.raises(InputError, match="is not a folder"):
        output_file(tmp_path / "file" / "out.jsonl", "--out")
    with pytest.raises(InputError, match="is a folder"):
        output_file(tmp_path, "--out")
    with pytest.raises(InputError, match="is a file, not a folder"):
        output_dir(tmp_path / "file" / "sub", "--out")
    assert output_dir(tmp_path / "new" / "deeper", "--out") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # checked, not created


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_folder_that_cannot_be_written_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    with pytest.raises(InputError, match="permission denied"):
        output_file(locked / "out.jsonl", "--out")
    with pytest.raises(InputError, match="permission denied"):
        output_dir(locked / "sub", "--out")


def test_atomic_write_leaves_the_old_file_or_nothing(tmp_path: Path) -> None:
    target = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError), atomic_write(target) as handle:
        handle.write("half")
        raise RuntimeError("failed half-way")
    assert list(tmp_path.iterdir()) == []
    target.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_write(target) as handle:
        handle.write("new")
        raise RuntimeError("failed half-way")
    assert target.read_text() == "old\n" and list(tmp_path.iterdir()) == [target]
    with atomic_write(target) as handle:
        handle.write("new\n")
    assert target.read_text() == "new\n"


def test_a_taken_run_name_is_refused(session: Session) -> None:
    runs.create_run(session, "taken", "infer")
    with pytest.raises(InputError, match="a run named 'taken' already exists"):
        runs.require_name_free(session, "taken")
    runs.require_name_free(session, "free")
