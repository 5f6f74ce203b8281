"""The `lanpo` command line. Each command group lives in its own module and registers itself here."""

from __future__ import annotations

import importlib
import logging
import sys

import click

from lanpo import __version__
from lanpo.errors import LanpoError

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
    "train": "lanpo.cli.train",
    "sft": "lanpo.cli.sft",
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
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
def cli(verbose: int) -> None:
    """lanpo: LANPO training with a Postgres + pgvector experience store.

    \b
    Typical session:
      lanpo db upgrade                        # create / migrate the store
      lanpo data gen --task chain_sum --n 200 --out p.jsonl
      lanpo data import p.jsonl --dataset chain_sum
      lanpo train --config train/configs/demo-cpu.toml
      lanpo sql "SELECT * FROM run_rewards"
      lanpo infer --mode retrieval --input q.jsonl --out a.jsonl

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


def main(argv: list[str] | None = None) -> int:
    """Console entry point: LanpoError -> `error: ...` on stderr and exit status 2, no traceback."""
    try:
        # Commands return None; a command that exits with a status (`ctx.exit(n)`, `lanpo db psql` passing on
        # psql's) comes back here as that int, since click does not exit in non-standalone mode.
        status = cli.main(args=argv, prog_name="lanpo", standalone_mode=False)
    except LanpoError as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    sys.exit(main())
