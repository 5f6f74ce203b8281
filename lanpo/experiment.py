"""`lanpo experiment`: does language feedback make RL learn better? Arms x seeds of training runs on one start.

Every arm (GRPO, LANPO-intra, LANPO-inter, LANPO-both, MEL, ...) trains from the same SFT start, on the same problems,
for the same steps with the same group size, validating on the same held-out set; only the arm's overrides and
the seed differ. So:

1. the shared start: one SFT warm start (the recipe's [sft]), merged into the base of every run;
2. relevance for the inter arms: the problems of the dataset judged against each other once (`[relevance]`);
3. the runs, seed by seed (so a stopped experiment holds paired results): each arm with its overrides, its own
   pool, `experiment` and `arm` recorded on the run; a finished run is skipped and an unfinished one resumed,
   so rerunning the command continues where it stopped. `jobs` runs train side by side, each in a process of its
   own (on a CPU one per core: a run's forwards use `model.threads` threads), in the same seed-by-seed order;
   a run trains the same way alone or beside others (its seed decides its random numbers);
4. `lanpo report EXPERIMENT`: figures and the Table 1-shaped result (held-out mean@k per arm, mean +- std over
   seeds, and each arm's paired difference to GRPO).
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy.engine import Engine

from lanpo.config import (
    Renamed,
    from_mapping,
    help_field,
    lanpo_home,
    load_toml,
    quiet_renames,
    set_path,
    to_mapping,
    upgrade_path,
)
from lanpo.db.connection import transaction
from lanpo.db.repo import experiments as experiments_repo
from lanpo.db.repo import runs as runs_repo
from lanpo.errors import ConfigError, LanpoError, listing, sigterm_raises
from lanpo.experiment_arms import DEFAULT_ARMS
from lanpo.feedback_modes import asks_inter
from lanpo.retrieval import STAGE1
from lanpo.train.config import TrainConfig


@dataclass
class RelevanceStep:
    """Problem-to-problem relevance for the inter arms, built once for the dataset (`lanpo relevance build`)."""

    # `judge` was `scorer` (issue 24: `scorer` names only the stored "<model>|<prompt version>"); lanpo.config.Renamed
    RENAMED: ClassVar[dict[str, Renamed]] = {"scorer": Renamed("judge")}

    judge: str = help_field("smollm2", "the judge model (its scores feed every inter arm)")
    top_k: int = help_field(8, "stage-1 candidates judged per problem")
    stage1: str = help_field("hybrid", "stage-1 search: bm25 | vector | hybrid")

    def __post_init__(self) -> None:
        if self.stage1 not in STAGE1:
            raise ConfigError(f"relevance.stage1 must be one of {', '.join(STAGE1)}, got {self.stage1!r}")
        if self.top_k < 1:
            raise ConfigError(f"relevance.top_k must be >= 1, got {self.top_k}")


@dataclass
class ExperimentConfig:
    """Arms x seeds of `lanpo train` on one recipe, one SFT start and one held-out set."""

    name: str = help_field("", "experiment name in the store (runs are <name>-<arm>-s<seed>)")
    recipe: str = help_field("", "the training recipe every arm starts from (relative to this file)")
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2], metadata={"help": "one run per arm and seed"})
    arms: list[str] = field(
        default_factory=lambda: ["grpo", "lanpo-both"],
        metadata={"help": "the arms that run (of [arm.*] and the built-in ones)"},
    )
    arm: dict = field(
        default_factory=dict,
        metadata={
            "help": '[arm.NAME] tables of recipe overrides ("feedback.mode" = "none"); built in: '
            + ", ".join(DEFAULT_ARMS)
        },
    )
    relevance: RelevanceStep = field(default_factory=RelevanceStep, metadata={"help": "relevance for inter arms"})
    output_dir: str | None = help_field(
        None, "the shared start and the report go here ($LANPO_HOME/experiments/<name>)"
    )

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ConfigError("name must name the experiment")
        if not self.recipe.strip():
            raise ConfigError("recipe must name the training recipe the arms share")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must be distinct and at least one, got {self.seeds}")
        self.arm = {name: _upgrade_arm(table) for name, table in self.arm.items()}
        unknown = [a for a in self.arms if a not in self.arm_overrides()]
        if unknown or not self.arms:
            raise ConfigError(
                f"arms names {unknown or 'nothing'}", hint=f"arms known: {listing(self.arm_overrides())}"
            )

    def arm_overrides(self) -> dict[str, dict[str, Any]]:
        return {**DEFAULT_ARMS, **{name: dict(table) for name, table in self.arm.items()}}

    def folder(self) -> Path:
        return Path(self.output_dir).expanduser() if self.output_dir else lanpo_home() / "experiments" / self.name


def _upgrade_arm(table: Any) -> Any:
    """An [arm.NAME] table with old recipe key names read as today's (`lanpo.config.Renamed`), so that the arm and
    the experiment's identity are the same whichever name the file uses."""
    if not isinstance(table, dict):
        return table
    out: dict[str, Any] = {}
    for key, value in table.items():
        path, value, _old = upgrade_path(TrainConfig, str(key).split("."), value)
        new_key = ".".join(path)
        if new_key in out:
            raise ConfigError(
                f"an arm table sets {new_key} twice, by its old and its new name",
                hint=f'keep "{new_key}" only',
            )
        out[new_key] = value
    return out


@dataclass
class ArmRun:
    arm: str
    seed: int
    run_name: str
    status: str  # trained | resumed | skipped (finished before)
    seconds: float = 0.0
    validation: dict[int, dict[str, float]] = field(default_factory=dict)
    steps: int = 0


@dataclass
class ExperimentResult:
    name: str
    start_adapter: Path
    runs: list[ArmRun]
    report_dir: Path | None = None


def load_experiment(path: str | Path, overrides: Sequence[str] = ()) -> tuple[ExperimentConfig, TrainConfig]:
    """The experiment file and the recipe it names (recipe overrides applied, `--set` style)."""
    path = Path(path)
    exp = load_toml(ExperimentConfig, path)
    recipe = (path.parent / exp.recipe).resolve()
    base = load_toml(TrainConfig, recipe, list(overrides))
    for arm, table in exp.arm_overrides().items():  # every arm's config must load, before anything runs
        arm_config(base, table, arm, 0, exp)
    return exp, base


def arm_config(base: TrainConfig, table: dict[str, Any], arm: str, seed: int, exp: ExperimentConfig) -> TrainConfig:
    """The recipe with the arm's overrides, the seed, and the run's name and tags."""
    data = to_mapping(base)
    try:
        for key, value in table.items():
            path, value, _old = upgrade_path(TrainConfig, key.split("."), value)
            set_path(data, path, value, where=f"key {key!r}")
    except ConfigError as exc:
        exc.message = f"arm {arm!r}: {exc.message}"
        raise
    data.update(run_name=f"{exp.name}-{arm}-s{seed}", seed=seed, experiment=exp.name, arm=arm, output_dir=None)
    try:
        return from_mapping(TrainConfig, data)
    except ConfigError as exc:
        exc.message = f"arm {arm!r}: {exc.message}"
        raise


def identity(exp: ExperimentConfig, base: TrainConfig) -> dict[str, Any]:
    """What makes two invocations the same experiment: the recipe and the file's own arm tables. Which arms and seeds
    one invocation runs is a selection from it, so `--arms lanpo-intra` or `--seeds 3` extends an experiment, and
    two processes (one per core or GPU, `--arms grpo` and `--arms lanpo-both`) can run its arms side by side."""
    chosen = {k: v for k, v in to_mapping(exp).items() if k not in ("arms", "seeds")}  # keeps the [arm.*] tables
    return {**chosen, "base": to_mapping(base)}


def upgrade_identity(stored: dict[str, Any], exp: ExperimentConfig) -> dict[str, Any]:
    """A stored `identity` read through today's config classes, so that a key added since it was written (with the
    default that keeps the old behaviour) does not make the same experiment look like another one. A key since
    removed or a value today's checks refuse leaves it as stored: then it differs, as it should."""
    try:
        with quiet_renames():  # old key names are read as today's: the same experiment, nothing to rewrite
            base = to_mapping(from_mapping(TrainConfig, stored["base"], "base."))
            rest = {k: v for k, v in stored.items() if k != "base"}
            chosen = to_mapping(from_mapping(ExperimentConfig, {**rest, "arms": exp.arms, "seeds": exp.seeds}))
    except (ConfigError, KeyError, TypeError):
        return stored
    return {**{k: v for k, v in chosen.items() if k not in ("arms", "seeds")}, "base": base}


def run_experiment(
    exp: ExperimentConfig,
    base: TrainConfig,
    db: Engine,
    echo: Callable[[str], None] = print,
    report: bool = True,
    jobs: int = 1,
) -> ExperimentResult:
    """Train every arm x seed from one shared start (see the module docstring), `jobs` runs at a time; returns what
    ran."""
    from lanpo.train.loop import train

    if jobs < 1:
        raise ConfigError(f"jobs must be >= 1, got {jobs}")

    with transaction(db) as session:
        experiment = experiments_repo.ensure_experiment(
            session, exp.name, identity(exp, base), upgrade=lambda stored: upgrade_identity(stored, exp)
        )
    folder = exp.folder()
    start = shared_start(exp, base, db, folder, echo)
    arms = exp.arm_overrides()
    scorer = None
    if any(_reads_relevance(arms[a], base) for a in exp.arms):
        scorer = shared_relevance(exp, base, db, echo)
    cfgs = []
    for seed in exp.seeds:
        for arm in exp.arms:
            cfg = arm_config(base, arms[arm], arm, seed, exp)
            cfg = replace(cfg, model=replace(cfg.model, init_adapter=str(start)), sft=replace(cfg.sft, enabled=False))
            if scorer and cfg.feedback.inter.scorer is None:
                inter = replace(cfg.feedback.inter, scorer=scorer)
                cfg = replace(cfg, feedback=replace(cfg.feedback, inter=inter))
            cfgs.append(cfg)
    try:
        if jobs == 1:
            runs = [_run_arm(cfg, db, echo, train) for cfg in cfgs]
        else:
            runs = _run_side_by_side(cfgs, db, echo, jobs, folder / "logs")
    except BaseException:
        with transaction(db) as session:
            experiments_repo.set_status(session, experiment.id, "failed")
        raise
    with transaction(db) as session:
        experiments_repo.set_status(session, experiment.id, "finished")
    result = ExperimentResult(exp.name, start, runs)
    if report:
        from lanpo.report.build import read_report, write_report

        with transaction(db) as session:
            data = read_report(session, [exp.name])
        result.report_dir = write_report(data, folder / "report", command=f"lanpo report {exp.name}").out_dir
        echo(f"report: {result.report_dir / 'report.md'}")
    return result


def _run_arm(cfg: TrainConfig, db: Engine, echo: Callable[[str], None], train: Callable[..., Any]) -> ArmRun:
    found = _stored_run(db, cfg)
    if found is not None and found.status == "finished":
        echo(f"{cfg.run_name}: finished before, skipped")
        return ArmRun(cfg.arm or "", cfg.seed, cfg.run_name, "skipped")
    started = time.perf_counter()
    echo(f"{cfg.run_name}: {'resuming' if found else 'training'} {cfg.steps} steps ({_what(cfg)})")
    result = train(cfg, db=db, resume=found is not None, progress=False)
    run = ArmRun(
        cfg.arm or "",
        cfg.seed,
        cfg.run_name,
        "resumed" if found else "trained",
        time.perf_counter() - started,
        result.validation,
        len(result.steps),
    )
    echo(_finished_line(run))
    return run


def _stored_run(db: Engine, cfg: TrainConfig) -> Any:
    with transaction(db) as session:
        return runs_repo.find_run(session, cfg.run_name)


def _what(cfg: TrainConfig) -> str:
    return f"{cfg.resolved_method()}, {cfg.feedback.mode} feedback"


def _finished_line(run: ArmRun) -> str:
    last = max(run.validation) if run.validation else None
    shown = (
        ""
        if last is None
        else "  ".join(
            f"{k.split('/')[-1]} {v:.3f}" for k, v in run.validation[last].items() if "/mean@" in k or "/pass@" in k
        )
    )
    return f"{run.run_name}: {run.steps} steps in {run.seconds:.0f}s; held-out at step {last}: {shown}"


def side_by_side_order(cfgs: list[TrainConfig]) -> list[TrainConfig]:
    """The order workers take runs in: seed by seed, and within a seed the costlier arms first (feedback prompts
    carry a context, MEL replays and diagnoses: their steps are longer), so that the short runs fill the end and no
    worker idles while another finishes a long one. Measured at the default (two workers, three seeds, bf16
    autocast): GRPO runs 25-29 minutes, LANPO-both 33-35; in the file's order (GRPO first) the last LANPO-both run
    trained alone for its final ~18 minutes (docs/log.md, the bf16-autocast run)."""

    def cost(cfg: TrainConfig) -> int:
        return int(cfg.feedback.mode != "none" or cfg.resolved_method() == "mel")

    seeds = list(dict.fromkeys(cfg.seed for cfg in cfgs))  # in the experiment's order
    return sorted(cfgs, key=lambda cfg: (seeds.index(cfg.seed), -cost(cfg)))  # stable: ties keep the file's order


def auto_jobs(base: TrainConfig, runs: int) -> int:
    """How many runs to train side by side: on a CPU one per `model.threads` of the cores this process may use
    (`model.threads = 0`, all cores, gives one); on a GPU one. Never more than `runs`."""
    import torch

    device = base.model.device
    on_gpu = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    cores = len(os.sched_getaffinity(0))
    per_run = base.model.threads or cores
    return max(1, min(runs, 1 if on_gpu else cores // per_run))


def _run_side_by_side(
    cfgs: list[TrainConfig], db: Engine, echo: Callable[[str], None], jobs: int, logs: Path
) -> list[ArmRun]:
    """Train `cfgs` in `jobs` worker processes (spawned: each loads its own torch and model), started in
    `side_by_side_order`; returns their runs in `cfgs`' order.

    A worker's output goes to `logs/<run>.log`. A run that fails does not stop the others; once they have ended, the
    first failure is raised with its log named. A worker killed outright (out of memory) stops the pool and every
    run in it; each is resumable, from its last checkpoint, by running the experiment again."""
    logs.mkdir(parents=True, exist_ok=True)
    url = db.url.render_as_string(hide_password=False)
    runs: dict[str, ArmRun] = {}
    failed: list[tuple[str, str, str]] = []
    todo = []
    for cfg in side_by_side_order(cfgs):
        found = _stored_run(db, cfg)
        if found is not None and found.status == "finished":
            echo(f"{cfg.run_name}: finished before, skipped")
            runs[cfg.run_name] = ArmRun(cfg.arm or "", cfg.seed, cfg.run_name, "skipped")
        else:
            todo.append(cfg)
    if todo:
        import multiprocessing

        echo(f"training {len(todo)} run(s), {min(jobs, len(todo))} at a time; each one's output: {logs}/<run>.log")
        pool = ProcessPoolExecutor(
            max_workers=min(jobs, len(todo)),
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_ignore_sigint,
        )
        try:
            pending: dict[Future[tuple[ArmRun | None, str]], TrainConfig] = {
                pool.submit(_train_in_worker, cfg, url, str(logs / f"{cfg.run_name}.log")): cfg for cfg in todo
            }
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    cfg = pending.pop(future)
                    try:
                        run, error = future.result()
                    except BrokenProcessPool:  # a worker was killed (out of memory, kill -9): the pool stops them all
                        run, error = None, "its worker process died (killed: out of memory?); the pool stopped"
                    if run is None:
                        failed.append((cfg.run_name, error, str(logs / f"{cfg.run_name}.log")))
                        echo(f"{cfg.run_name}: failed: {error.splitlines()[0] if error else '?'}")
                    else:
                        runs[cfg.run_name] = run
                        echo(_finished_line(run))
        except BaseException:  # Ctrl-C or SIGTERM (lanpo.errors.Terminated): stop the runs, not wait for them
            _stop_workers(pool)
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
    if failed:
        name, error, log = failed[0]
        others = f" ({len(failed) - 1} more failed)" if len(failed) > 1 else ""
        raise LanpoError(
            f"run {name} failed{others}: {error.splitlines()[0] if error else 'no message'}",
            hint=f"its log: {log}; the experiment resumes where it stopped when run again",
        )
    return [runs[cfg.run_name] for cfg in cfgs]


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """SIGTERM to each of `pool`'s worker processes, whose run then stops as `lanpo train` does on SIGTERM
    (`_train_in_worker`: its open transaction rolled back, its heartbeat ended, resumable from its last checkpoint).
    ProcessPoolExecutor has no public way to stop a running task before Python 3.14's `terminate_workers`."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.terminate()


def _ignore_sigint() -> None:
    """A worker's first act: Ctrl-C in a terminal sends SIGINT to the whole process group, and the parent alone
    answers it (SIGTERM to each worker, `_stop_workers`), so each run stops one way, with its cleanup whole. A worker
    that also took the SIGINT began its rollback as KeyboardInterrupt, the parent's SIGTERM broke into it, and the
    command hung (tests/train/test_experiment.py)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _train_in_worker(cfg: TrainConfig, url: str, log: str) -> tuple[ArmRun | None, str]:
    """One run in a worker process: says on the experiment's terminal that it starts, then writes everything (C-level
    output too) to `log`. Returns the run, or None and the error (a LanpoError's message and hint, or a crash's
    last line; the traceback goes to the log). SIGTERM (the experiment stopped) raises Terminated in the run."""
    from lanpo.db.connection import connect
    from lanpo.train.loop import train

    db = None
    saved = os.dup(1), os.dup(2)
    try:
        db = connect(url)
        found = _stored_run(db, cfg)
        print(f"{cfg.run_name}: {'resuming' if found else 'training'} {cfg.steps} steps ({_what(cfg)}); log: {log}")
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        with sigterm_raises():
            return _run_arm(cfg, db, lambda line: print(line, flush=True), train), ""
    except LanpoError as exc:
        print(f"error: {exc}", flush=True)
        return None, str(exc)
    except BaseException as exc:  # a crash or an interrupt: the worker reports it, the parent decides
        traceback.print_exc()
        return None, f"{type(exc).__name__}: {exc}"
    finally:
        if db is not None:
            db.dispose()
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def shared_start(
    exp: ExperimentConfig, base: TrainConfig, db: Engine, folder: Path, echo: Callable[[str], None]
) -> Path:
    """The SFT adapter every run starts from: trained once (recipe [sft]) or the recipe's model.init_adapter."""
    if base.model.init_adapter:
        return Path(base.model.init_adapter).resolve()
    adapter = folder / "sft" / "adapter"
    if (adapter / "adapter_config.json").is_file():
        echo(f"shared start: {adapter} (trained before)")
        return adapter
    if not base.sft.enabled:
        raise ConfigError(
            "the arms need a shared start: the recipe enables [sft] or names model.init_adapter",
            hint="set sft.enabled = true in the recipe (or --set model.init_adapter=FOLDER)",
        )
    from lanpo.train.sft.warm_start import run_sft

    started = time.perf_counter()
    cfg = replace(base, run_name=f"{exp.name}-start", output_dir=str(folder), seed=exp.seeds[0])
    result = run_sft(cfg, cfg.sft.data, db=db, out_dir=folder / "sft", progress=False)
    echo(
        f"shared start: SFT on {result.pairs} pairs, loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f} "
        f"in {time.perf_counter() - started:.0f}s -> {result.adapter_dir}"
    )
    return result.adapter_dir


def _reads_relevance(arm: dict[str, Any], base: TrainConfig) -> bool:
    """Whether an arm's inter draws read relevance (the random draw of Fig. 2c reads none)."""
    inter = asks_inter(arm.get("feedback.mode", base.feedback.mode))
    return inter and arm.get("feedback.inter.draw", base.feedback.inter.draw) != "random"


def shared_relevance(exp: ExperimentConfig, base: TrainConfig, db: Engine, echo: Callable[[str], None]) -> str:
    """Problem-to-problem relevance of the training dataset, judged once; returns the scorer the arms read."""
    from lanpo.feedback.store import ensure_dataset
    from lanpo.retrieval.build import build_relevance
    from lanpo.retrieval.search import SearchParams

    with transaction(db) as session:
        ensure_dataset(session, base.data)
    rel = exp.relevance
    built = build_relevance(
        db,
        base.data.dataset,
        rel.judge,
        top_k=rel.top_k,
        params=SearchParams(stage1=rel.stage1),
        embed=rel.stage1 != "bm25",
    )
    echo(f"relevance: {built.report.scored} pairs judged, {built.report.cached} cached, by {built.scorer}")
    return built.scorer
