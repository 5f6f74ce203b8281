"""The `lanpo` command line. Each command group lives in its own module and registers itself here."""

from __future__ import annotations

import importlib
import logging
import sys
import traceback

import click

from lanpo import __version__
from lanpo.errors import LanpoError, Terminated, indented, sigterm_raises

# Command modules, each exposing `command` (a click.Command or Group). Imported lazily so that
# `lanpo db status` does not pay for torch.
COMMAND_MODULES = {
    "db": "lanpo.cli.db",
    "demo": "lanpo.cli.demo",
    "data": "lanpo.cli.data",
    "pool": "lanpo.cli.pool",
    "sql": "lanpo.cli.sql",
    "model": "lanpo.cli.model",
    "embed": "lanpo.cli.embed",
    "relevance": "lanpo.cli.relevance",
    "retrieve": "lanpo.cli.retrieve",
    "infer": "lanpo.cli.infer",
    "eval": "lanpo.cli.eval",
    "plan": "lanpo.cli.plan",
    "train": "lanpo.cli.train",
    "experiment": "lanpo.cli.experiment",
    "sft": "lanpo.cli.sft",
    "report": "lanpo.cli.report",
    "runs": "lanpo.cli.runs",
    "worker": "lanpo.cli.worker",
    "serve": "lanpo.cli.serve",
}


class LazyGroup(click.Group):
    """A group whose sub-commands are imported only when used (or listed by --help)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMAND_MODULES)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = COMMAND_MODULES.get(name)
        if module is None:
            return None
        return importlib.import_module(module).command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="lanpo")
@click.option("-v", "--verbose", count=True, help="More logging; -vv: debug logs, and the traceback of any error.")
def cli(verbose: int) -> None:
    """lanpo: LANPO training with a Postgres + pgvector experience store.

    \b
    Typical session:
      lanpo demo                              # all of it on a CPU: its training run is named demo
      lanpo db upgrade                        # create / migrate the store
      lanpo data gen --task chain_sum --n 200 --out p.jsonl
      lanpo data import p.jsonl --dataset chain_sum
      lanpo train --config train/configs/demo-cpu.toml   # the run demo-cpu (the recipe's run_name)
      lanpo sql "SELECT * FROM run_rewards"
      lanpo report demo-cpu --out report/     # figures + report.md from the store
      lanpo infer --mode retrieval --pool demo --input q.jsonl --out a.jsonl

    The database is $LANPO_DATABASE_URL when set, else an embedded Postgres under $LANPO_HOME (~/.lanpo).
    """
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if verbose == 0:
        _quiet_libraries()


def _quiet_libraries() -> None:
    """Keep library chatter (weight-loading bars, deprecation notices, debug logs) out of lanpo's output."""
    import os
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"(transformers|peft|torch)\.")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # read when vllm is imported, after this
    for name in ("bm25s", "transformers", "peft", "sentence_transformers", "httpx", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


def verbosity(argv: list[str]) -> int:
    """How many -v the group options carry, read before click parses them (a failure may come first)."""
    count = 0
    for arg in argv:
        if arg == "--verbose":
            count += 1
        elif len(arg) > 1 and arg.startswith("-") and not arg.startswith("--") and set(arg[1:]) == {"v"}:
            count += len(arg) - 1
        elif not arg.startswith("-") or arg == "--":
            break  # the sub-command: group options end here
    return count


def _fail(message: str, hint: str | None, code: int, verbose: int, detail: str | None = None) -> int:
    """Print `error:` + `hint:` (after the traceback of the exception being handled, under -vv), then the text the
    hint points at (`LanpoError.detail`); return `code`."""
    if verbose >= 2:
        click.echo(traceback.format_exc().rstrip(), err=True)
    click.echo(f"error: {message}", err=True)
    if hint:
        click.echo(f"  hint: {hint}", err=True)  # indented under its error, as str(LanpoError) has it
    if detail:
        click.echo(indented(detail), err=True)
    return code


def _usage_error(exc: click.UsageError) -> tuple[str, str]:
    """Click's own parse errors in the project's shape: the message, and where the options are listed."""
    message = exc.format_message()
    if message[:1].isupper() and message[1:2].islower():
        message = message[0].lower() + message[1:]
    path = exc.ctx.command_path if exc.ctx is not None else "lanpo"
    return message, f"see `{path} --help`"


def main(argv: list[str] | None = None) -> int:
    """Console entry point: every failure is `error: ...` + `hint: ...` on stderr, the traceback only with -vv.

    Exit status: 0 success; 2 bad input, configuration or environment (LanpoError, click usage errors,
    database / driver / Alembic errors, files that cannot be read or written); 1 an internal error (a bug:
    please report it with the -vv traceback); 130 interrupted (Ctrl-C); 143 terminated (SIGTERM). Either way a
    training run is marked failed and `--resume` continues it from its last checkpointed step.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    verbose = verbosity(args)
    try:
        # Commands return None; a command that exits with a status (`ctx.exit(n)`, `lanpo db psql` passing on
        # psql's) comes back here as that int, since click does not exit in non-standalone mode.
        with sigterm_raises():
            status = cli.main(args=args, prog_name="lanpo", standalone_mode=False)
    except LanpoError as exc:
        return _fail(exc.message, exc.hint, 2, verbose, exc.detail)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("aborted", err=True)
        return 130
    except Terminated:
        click.echo("terminated", err=True)
        return 143
    except click.UsageError as exc:
        return _fail(*_usage_error(exc), 2, verbose)
    except click.ClickException as exc:
        return _fail(exc.format_message(), None, exc.exit_code, verbose)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        return _fail(
            f"{exc.strerror or exc}{where}", "check that the path exists and can be read or written", 2, verbose
        )
    except Exception as exc:
        from lanpo.db.errors import as_user_error

        known = as_user_error(exc)
        if known is not None:
            return _fail(known.message, known.hint, 2, verbose, known.detail)
        first_line = next(iter(str(exc).strip().splitlines()), "")
        return _fail(
            f"internal error: {type(exc).__name__}: {first_line}",
            "rerun with -vv for the traceback and report it",
            1,
            verbose,
        )
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    sys.exit(main())
