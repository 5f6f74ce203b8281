"""The README and every docs/*.md page hold true against the code.

- the generated pages (docs/cli.md, docs/configuration.md) equal what `python -m lanpo.docgen` makes now;
- every `lanpo` command in a ```bash fence that finishes in seconds (`lanpo sql`, `lanpo runs`, the read-only
  `lanpo db` and `lanpo pool` commands, `--help`) runs, against a store filled the way a demo run leaves it;
  every other one (`train`, `demo`, `experiment`, `eval`, `infer`, ...) is parsed by the real click command without
  running it, so an unknown option, a bad choice or a `--set` key no config has fails;
- every option named in backticks exists on a lanpo command (or a script of bench/, examples/, docs/learning/, or
  one of the few other tools in OTHER_TOOLS), and every config key in backticks (`grpo.beta`) exists in a config
  dataclass;
- every statement in a ```sql fence runs as the read-only role, and the SQL recipes (`lanpo sql "..."`,
  `lanpo sql --file F`) are there;
- a measured figure sits in a section with a `Reproduce:` line (values cited from the papers are exempt; the
  generated pages are exempt too: their figures are the code's help texts);
- every relative link resolves to a file.

The store is filled once for the module (the `migrated_db` fixture's database, emptied at the end).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lanpo.config import load_toml, parse_override
from lanpo.db.connection import ENV_URL, transaction
from lanpo.db.readonly import query_readonly
from lanpo.docgen import REGENERATE, stale
from lanpo.docgen import cli as cli_doc
from lanpo.docgen.configuration import FAMILIES, config_keys
from lanpo.errors import LanpoError
from tests.conftest import truncate_all

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GENERATED = {ROOT / "docs" / "cli.md", ROOT / "docs" / "configuration.md"}  # their text is the code's own
HAND_WRITTEN = [p for p in DOCS if p not in GENERATED]


# --------------------------------------------------------------------------- reading Markdown


@dataclass(frozen=True)
class Line:
    path: Path
    number: int  # 1-based
    text: str
    fence: str | None  # the language of the fence it sits in ("" for a bare fence), None outside one


def lines_of(path: Path) -> list[Line]:
    out, fence = [], None
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        opener = re.match(r"\s*(```+|~~~+)\s*([\w+-]*)", text)
        if opener:
            out.append(Line(path, number, text, fence if fence is not None else opener.group(2)))
            fence = opener.group(2) if fence is None else None
            continue
        out.append(Line(path, number, text, fence))
    return out


def where(line: Line) -> str:
    return f"{line.path.relative_to(ROOT)}:{line.number}"


@dataclass(frozen=True)
class Command:
    line: Line  # where it starts
    args: tuple[str, ...]  # after `lanpo`

    def __str__(self) -> str:
        return f"{where(self.line)}: lanpo {shlex.join(self.args)}"


SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")"}
WRAPPERS = {"taskset", "time", "/usr/bin/time", "env", "nohup", "timeout", "uv", "run", "exec"}


def _logical_lines(block: list[Line]) -> Iterator[tuple[Line, str]]:
    """The shell lines of a fence: continuations (`\\`) joined, a quote left open carried to the next line."""
    start, text = None, ""
    for line in block:
        start = start or line
        text += line.text.removesuffix("\\") + (" " if line.text.endswith("\\") else "\n")
        if line.text.endswith("\\"):
            continue
        try:
            shlex.split(text, comments=True)
        except ValueError:  # an open quote: the statement goes on
            continue
        yield start, text
        start, text = None, ""


def _segments(text: str) -> Iterator[list[str]]:
    lexer = shlex.shlex(text.replace("\n", " ; "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    segment: list[str] = []
    for token in lexer:
        if token in SEPARATORS or set(token) <= set(";&|()"):
            yield segment
            segment = []
        else:
            segment.append(token)
    yield segment


def commands_in(path: Path) -> list[Command]:
    """Every `lanpo ...` of the ```bash / ```sh / ```console fences of `path`."""
    lines = lines_of(path)
    blocks: list[list[Line]] = []
    for line in lines:
        if line.fence in ("bash", "sh", "shell", "console") and not line.text.lstrip().startswith(("```", "~~~")):
            if blocks and blocks[-1][-1].number == line.number - 1:
                blocks[-1].append(line)
            else:
                blocks.append([line])
    found = []
    for block in blocks:
        for start, text in _logical_lines([Line(b.path, b.number, b.text.removeprefix("$ "), b.fence) for b in block]):
            for segment in _segments(text):
                while segment and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", segment[0]):
                    segment = segment[1:]  # VAR=value lanpo ...
                if segment[:3] == ["python", "-m", "lanpo"]:
                    segment = segment[2:]
                if segment and segment[0] in WRAPPERS and "lanpo" in segment:
                    segment = segment[segment.index("lanpo") :]
                if segment and segment[0] == "lanpo":
                    found.append(Command(start, tuple(segment[1:])))
    return found


def inline_code(path: Path) -> list[tuple[Line, str]]:
    """The `code spans` of the prose of `path` (outside fences)."""
    out = []
    for line in lines_of(path):
        if line.fence is None:
            out += [(line, m.group(1).strip()) for m in re.finditer(r"(?<!`)`([^`\n]+)`(?!`)", line.text)]
    return out


ALL_COMMANDS = [c for path in DOCS for c in commands_in(path)]


# --------------------------------------------------------------------------- the CLI


def resolve(args: tuple[str, ...]) -> tuple[click.Command, tuple[str, ...], list[str]]:
    """The command `args` names (sub-commands followed while they name one), its path and the rest of the args."""
    command: click.Command = cli_doc.root()
    path: list[str] = []
    rest = list(args)
    ctx = click.Context(command, info_name="lanpo")
    while isinstance(command, click.Group):
        index = next((i for i, a in enumerate(rest) if not a.startswith("-")), None)
        if index is None:
            break
        sub = command.get_command(ctx, rest[index])
        if sub is None:
            break
        path.append(rest[index])
        command, rest = sub, rest[:index] + rest[index + 1 :]
        ctx = click.Context(command, info_name=path[-1], parent=ctx)
    return command, tuple(path), rest


def parse(args: tuple[str, ...]) -> click.Context:
    """`lanpo ARGS` parsed by the real click commands, sub-command by sub-command, without invoking anything.

    Unknown options, bad choices, missing required options and bad types raise click.UsageError; `--help` and
    `--keys` (eager options) print and raise click.exceptions.Exit(0)."""
    command: click.Command = cli_doc.root()
    ctx = command.make_context("lanpo", list(args), resilient_parsing=False)
    while isinstance(command, click.Group):
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not rest:
            break
        name, sub, rest = command.resolve_command(ctx, rest)
        assert sub is not None and name is not None
        ctx = sub.make_context(name, rest, parent=ctx, resilient_parsing=False)
        command = sub
    return ctx


def command_path(ctx: click.Context) -> tuple[str, ...]:
    return cli_doc.parent_path(ctx)[1:]


SET_FAMILY = {"train": "train", "sft": "train", "demo": "train", "experiment": "train", "eval": "eval"}
KEYS = {f.name: config_keys(f.name) for f in FAMILIES}
ANY_KEY = set().union(*KEYS.values())
TABLES = {k.split(".")[0] for keys in KEYS.values() for k in keys if "." in k}  # top-level tables: grpo, rollout...
OPTIONS = cli_doc.option_names()


def check_overrides(ctx: click.Context, problems: list[str]) -> None:
    """Each `--set key=value` of the command names a key of its config."""
    family = SET_FAMILY.get(command_path(ctx)[0]) if command_path(ctx) else None
    for text in ctx.params.get("overrides") or ():
        key = ".".join(parse_override(text)[0])
        if key not in (KEYS[family] if family else ANY_KEY):
            problems.append(f"--set {text}: {key} is no {family or 'config'} key (see docs/configuration.md)")


# Commands that finish in seconds and write nothing: run for real. (group, sub-command); None: any sub-command.
FAST = {("sql", None), ("runs", None), ("runs", "workers"), ("pool", "list"), ("pool", "stats"), ("pool", "sample"),
        ("pool", "context"), ("relevance", "status"), ("db", "status"), ("db", "current"), ("db", "url"),
        ("db", "psql"), ("db", "reader"), ("db", "history")}  # fmt: skip
EAGER = {"--help", "-h", "--keys", "--version"}


def is_fast(args: tuple[str, ...]) -> bool:
    if EAGER & set(args):
        return True
    _, path, rest = resolve(args)
    if path[:1] == ("db",) and path[1:] == ("reader",) and "--renew" in rest:
        return False
    key = (path[0], path[1] if len(path) > 1 else None) if path else None
    return key in FAST


# --------------------------------------------------------------------------- the store a demo leaves


DEMO_RUN = "demo"  # what `lanpo demo` names its training run (and its pool) on a store that has none yet


def fill_demo_store(db: Engine) -> None:
    """What `lanpo demo` leaves: the demo's two datasets, relevance scores by the demo's judge, the trained run
    `demo` with its pool (groups in every training mode, attempts, lessons, contexts, metrics, committed steps), its
    SFT run and an infer run over the held-out set."""
    from lanpo.config import to_mapping
    from lanpo.db.repo import runs as runs_repo
    from lanpo.db.repo import steps as steps_repo
    from lanpo.db.repo.attempts import ContextRef, NewAttempt, NewGroup, record_groups
    from lanpo.db.repo.experiences import NewExperience, add_experiences
    from lanpo.db.repo.pools import ensure_pool
    from lanpo.db.repo.problems import Question, upsert_problems
    from lanpo.retrieval.judge import PROMPT_VERSION
    from lanpo.train.config import TrainConfig
    from tests.report.helpers import train_metrics

    cfg = load_toml(TrainConfig, ROOT / "train" / "configs" / "demo-cpu.toml")
    dataset = cfg.data.dataset
    scorer = f"smollm2|{PROMPT_VERSION}"
    with transaction(db) as session:
        questions = [Question(str(i), f"What is {i} + {i + 2}?", str(2 * i + 2)) for i in range(8)]
        upsert_problems(session, dataset, questions)
        upsert_problems(
            session, f"{dataset}-test", [Question(str(i), f"What is {i} - 1?", str(i - 1)) for i in (5, 6)]
        )
        ids = [int(i) for i in session.scalars(_select_ids(), {"d": dataset})]
        test_ids = [int(i) for i in session.scalars(_select_ids(), {"d": f"{dataset}-test"})]
        for p in ids:
            for q in ids:
                if p != q:
                    _relevance(session, p, q, 0.95 if abs(p - q) == 1 else 0.3, scorer)
        sft = runs_repo.create_run(session, f"{DEMO_RUN}-sft", "sft", {}, model=cfg.model.name).id
        runs_repo.finish_run(session, sft)
        pool = ensure_pool(session, DEMO_RUN, cfg.store)
        run = runs_repo.create_run(session, DEMO_RUN, "train", to_mapping(cfg), cfg.model.name, pool.id).id
    lesson_version, earlier = None, {}
    for step in (1, 2):
        with transaction(db) as session:
            version = steps_repo.add_policy_version(session, run, step, f"{step:064x}")
            groups = []
            for i, p in enumerate(ids[:4]):
                mode = "zero_shot" if step == 1 or i < 2 else ("intra" if i == 2 else "inter")
                contexts = {
                    "inter": [ContextRef(0, lesson_version, score=0.95)],
                    "intra": [ContextRef(0, context_attempt_id=earlier.get(p))],
                }.get(mode, [])
                rollouts = [NewAttempt(f"... \\boxed{{{j}}}", float(j == 0), j == 0, j == 0, 12) for j in range(2)]
                groups.append(NewGroup(p, mode, f"prompt {p}", rollouts, f"{mode}-v1", 20, step, run, version,
                                       contexts))  # fmt: skip
            attempt_ids = record_groups(session, groups)
            earlier |= {g.problem_id: ids_[0] for g, ids_ in zip(groups, attempt_ids, strict=True)}
            lesson = NewExperience(ids[step], f"## Flow\nadd\n## Principles\ncarry\n## Pitfalls\nnone {step}", 1.0,
                                   attempt_ids[step][0], run_id=run, step=step, policy_version_id=version)  # fmt: skip
            lesson_version = add_experiences(session, pool, [lesson]).version_ids[0]
            runs_repo.record_metrics(session, run, step, train_metrics(step, 0, "both"))
            steps_repo.commit_step(session, run, step, version)
    with transaction(db) as session:
        runs_repo.finish_run(session, run)
        infer = runs_repo.create_run(session, f"{DEMO_RUN}-infer", "infer", {}, model=cfg.model.name, pool_id=pool.id)
        answers = [NewAttempt("\\boxed{4}", 1.0, True, True, 8), NewAttempt("5", 0.0, False, False, 4)]
        record_groups(session, [NewGroup(p, m, "q", answers, run_id=infer.id) for p in test_ids
                                for m in ("zero_shot", "retrieval")])  # fmt: skip
        runs_repo.finish_run(session, infer.id)


def _select_ids() -> sa.TextClause:
    return sa.text("SELECT id FROM problems WHERE dataset = :d ORDER BY id")


def _relevance(session: Session, problem: int, candidate: int, score: float, scorer: str) -> None:
    session.execute(
        sa.text(
            "INSERT INTO relevance_scores (problem_id, candidate_problem_id, scorer, score) VALUES (:p, :c, :s, :v)"
        ),
        {"p": problem, "c": candidate, "s": scorer, "v": score},
    )


@pytest.fixture(scope="module")
def store(migrated_db: Engine, pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The demo's store, and a working folder that sees the checkout (`sql/recipes/...` resolve) in which the
    commands' outputs land; HOME and LANPO_HOME are fresh folders under it."""
    work = tmp_path_factory.mktemp("docs")
    for entry in ROOT.iterdir():
        if not entry.name.startswith("."):
            (work / entry.name).symlink_to(entry)
    home = work / "home"
    home.mkdir()
    truncate_all(migrated_db)
    fill_demo_store(migrated_db)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV_URL, pg_url)
        mp.setenv("HOME", str(home))
        mp.setenv("LANPO_HOME", str(home / ".lanpo"))
        mp.chdir(work)
        yield work
    truncate_all(migrated_db)


def expand(args: tuple[str, ...]) -> list[str]:
    """What the shell would pass: `~` and `$VARS` expanded."""
    return [os.path.expandvars(os.path.expanduser(a)) for a in args]


def make_inputs(args: list[str]) -> None:
    """Create the files and folders a command's `click.Path(exists=True)` parameters name, where they are missing
    and can be made here (under the working folder or HOME): their content is not what is checked."""
    command, _, rest = resolve(tuple(args))
    ctx = click.Context(command, info_name=command.name, resilient_parsing=True)
    try:
        values, _, _ = command.make_parser(ctx).parse_args(list(rest))
    except click.UsageError:
        return  # the real parse reports it
    for param in command.get_params(ctx):
        kind = param.type
        if not isinstance(kind, click.Path) or not kind.exists or param.name not in values:
            continue
        raw = values[param.name]
        for value in raw if isinstance(raw, list | tuple) else [raw]:
            path = Path(str(value)).resolve()
            if path.exists() or path.is_relative_to(ROOT) or not path.is_relative_to(Path.cwd().resolve()):
                continue  # the checkout's own files are never made: the docs must name ones that exist
            if kind.dir_okay and not kind.file_okay:
                path.mkdir(parents=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()


# --------------------------------------------------------------------------- the tests


def test_generated_pages_match_the_code() -> None:
    changed = stale()
    assert not changed, f"{', '.join('docs/' + n for n in changed)} differ from the code: run `{REGENERATE}`"


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=str)
def test_command(store: Path, command: Command) -> None:
    """A fast command runs and succeeds on the demo's store; a long one parses, with real options and keys."""
    args = expand(command.args)
    problems: list[str] = []
    if is_fast(command.args):
        result = CliRunner().invoke(cli_doc.root(), args, catch_exceptions=True)
        if isinstance(result.exception, LanpoError):
            problems.append(str(result.exception))
        elif result.exit_code != 0:
            problems.append(f"exit {result.exit_code}: {result.output[-800:]} {result.exception!r}")
    else:
        make_inputs(args)
        try:
            check_overrides(parse(tuple(args)), problems)
        except click.exceptions.Exit as exc:
            assert exc.exit_code == 0
        except click.UsageError as exc:
            problems.append(exc.format_message())
    assert not problems, f"{command}: " + "; ".join(problems)


def _names_of(args: list[str]) -> list[str]:
    """The runs and pools a command reads: `--pool NAME`, and the NAMEs of `lanpo report NAME...`."""
    names = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--pool"]
    if args[:1] == ["report"]:
        names += args[1 : next((i for i, a in enumerate(args) if a.startswith("-")), len(args))]
    return names


def _trained_name(args: list[str]) -> str:
    """The run a `lanpo train --config FILE [--set run_name=X]` trains (its pool has the same name)."""
    from lanpo.train.config import TrainConfig

    sets = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--set"]
    named = [value for key, value in (parse_override(text) for text in sets) if key == ["run_name"]]
    return str(named[-1]) if named else load_toml(TrainConfig, ROOT / args[args.index("--config") + 1]).run_name


def test_the_readme_names_runs_and_pools_that_exist_when_it_uses_them() -> None:
    """After `lanpo demo` the store holds the run and pool `lanpo.demo.DEFAULT_RUN`; every other name the README's
    commands read must be trained by a `lanpo train` above them."""
    from lanpo.demo import DEFAULT_RUN

    assert DEMO_RUN == DEFAULT_RUN  # the store these tests fill is the one a demo leaves
    made, problems = {DEFAULT_RUN}, []
    for command in commands_in(ROOT / "README.md"):
        args = expand(command.args)
        if args[:1] == ["train"]:
            made.add(_trained_name(args))
        problems += [f"{command}: no run or pool {name!r} yet" for name in _names_of(args) if name not in made]
    assert not problems, "\n".join(problems)


def test_docs_show_commands() -> None:
    assert any(path.name == "README.md" for path in (c.line.path for c in ALL_COMMANDS))


# Options of the scripts in the checkout (bench/, examples/, docs/learning/: argparse), which the docs name too
SCRIPT_OPTIONS = {
    m.group(1)
    for folder in ("bench", "examples", "docs/learning")
    for script in (ROOT / folder).rglob("*.py")
    for m in re.finditer(r'add_argument\(\s*(?:"-[^"]*",\s*)*"(--[a-z0-9_-]+)"', script.read_text(encoding="utf-8"))
}
# Options of other tools that the docs name in backticks, with the tool (every other `--x` must be lanpo's)
OTHER_TOOLS = {"--no-deps": "pip", "--nproc_per_node": "torchrun", "--nproc-per-node": "torchrun",
               "--durations": "pytest", "--full": ".ci/run", "--check": "python -m lanpo.docgen"}  # fmt: skip
PLACEHOLDER_KEY = re.compile(r"key|key\.path|section\.key|a\.b|[A-Z_.]+")  # `--set KEY=VALUE` in prose


def _option_problems(line: Line, code: str) -> list[str]:
    """The sub-command of a `lanpo ...` span that lanpo does not have, the options of a `--x ...` or `lanpo ... --x`
    span that no lanpo command (or not that command) has, and the keys of its `--set key=value` that no config
    has."""
    try:
        tokens = shlex.split(code)
    except ValueError:
        tokens = code.split()
    if not tokens or not (tokens[0] == "lanpo" or tokens[0].startswith("--")):
        return []
    known, of = OPTIONS | SCRIPT_OPTIONS | set(OTHER_TOOLS), "any lanpo command or script"
    if tokens[0] == "lanpo":
        command, path, rest = resolve(tuple(tokens[1:]))
        word = next((t for t in rest if not t.startswith("-")), None)  # lanpo's own options take no value
        if not path and word is not None and not word.isupper():  # `lanpo watch`: named, never built
            return [f"{where(line)}: `{code}`: {word!r} is no lanpo command"]
        ctx = click.Context(command)
        known = {o for p in command.get_params(ctx) if isinstance(p, click.Option) for o in p.opts + p.secondary_opts}
        known |= {o for p in cli_doc.root().get_params(ctx) for o in getattr(p, "opts", [])}
        of = f"lanpo {' '.join(path)}".strip()
    out = []
    for i, token in enumerate(tokens):
        option = token.split("=", 1)[0]
        if re.fullmatch(r"--[a-z][a-z0-9_-]*", option) and option not in known:
            out.append(f"{where(line)}: `{code}`: {option} is no option of {of}")
        if option == "--set" and i + 1 < len(tokens) and "=" in tokens[i + 1]:
            key = tokens[i + 1].split("=", 1)[0]
            if key not in ANY_KEY and not PLACEHOLDER_KEY.fullmatch(key):
                out.append(f"{where(line)}: `{code}`: --set {key}: no such config key")
    return out


CONFIG_KEY = re.compile(r"\[{0,2}([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+)\]{0,2}(?:\s*=.*)?")
FILE_SUFFIXES = (".py", ".toml", ".md", ".sql", ".json", ".jsonl", ".csv", ".txt", ".yaml", ".yml", ".parquet",
                 ".png", ".log", ".out", ".gguf", ".sh", ".safetensors", ".bin", ".pt", ".cfg", ".lock")  # fmt: skip


def _key_problems(line: Line, code: str) -> list[str]:
    """A dotted name in backticks whose first part is a config table (`grpo.x`) must be a config key."""
    match = CONFIG_KEY.fullmatch(code)
    if not match or code.endswith(FILE_SUFFIXES):
        return []
    key = match.group(1)
    if key.split(".")[0] not in TABLES or key in ANY_KEY:
        return []
    return [f"{where(line)}: `{code}`: {key} is no config key (see docs/configuration.md)"]


def test_options_and_config_keys_named_in_prose_exist() -> None:
    problems = []
    for path in DOCS:
        for line, code in inline_code(path):
            problems += _option_problems(line, code) + _key_problems(line, code)
    assert not problems, "\n".join(problems)


def sql_statements() -> list[tuple[str, str]]:
    """(where, statement) of every ```sql fence statement, and of every `lanpo sql "..."` / `--file F` recipe."""
    out = []
    for path in DOCS:
        block: list[Line] = []
        for line in [*lines_of(path), Line(path, 0, "", None)]:
            if line.fence == "sql" and not line.text.lstrip().startswith("```"):
                block.append(line)
                continue
            if block:
                text = "\n".join(b.text for b in block)
                for statement in re.split(r";\s*(?:\n|$)", text):
                    if re.sub(r"--[^\n]*", "", statement).strip():
                        out.append((where(block[0]), statement))
                block = []
    return out


def sql_recipes() -> list[Command]:
    return [c for c in ALL_COMMANDS if c.args[:1] == ("sql",) and c.line.path.name in ("README.md", "sql.md")]


def test_readme_and_sql_page_show_at_least_five_sql_recipes() -> None:
    assert len(sql_recipes()) >= 5, [str(c) for c in sql_recipes()]


@pytest.mark.parametrize(("at", "statement"), sql_statements(), ids=lambda v: v if ":" in v else None)
def test_sql_fence_runs_as_the_reader(store: Path, migrated_db: Engine, at: str, statement: str) -> None:
    result = query_readonly(migrated_db, statement)
    assert result.columns, f"{at}: no result set"


FIGURE = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:ms|s|min|h|tokens/s|it/s|KB|MB|GB|KiB|MiB|GiB|%)(?![\w/])"
    r"|(?<![\w.])\d+(?:\.\d+)?[x×](?!\w)"
)
CITES_PAPER = re.compile(r"Table \d|Section \d|§|appendix|paper", re.IGNORECASE)
RESULTS_HEADER = re.compile(r"mean@|pass@|avg@|accuracy|result|±", re.IGNORECASE)


def _sections(path: Path) -> list[list[Line]]:
    out: list[list[Line]] = [[]]
    for line in lines_of(path):
        if line.fence is None and re.match(r"#{1,4} ", line.text):
            out.append([])
        out[-1].append(line)
    return out


def _figures(section: list[Line]) -> list[Line]:
    """The lines of a section that carry a measured figure (not a value cited from a paper)."""
    found, header = [], None
    for line in section:
        row = line.fence is None and line.text.lstrip().startswith("|")
        header = (header or line) if row else None  # the first row of a table is its header
        if CITES_PAPER.search(line.text) or (row and header is not None and CITES_PAPER.search(header.text)):
            continue
        in_results = row and header is not line and header is not None and RESULTS_HEADER.search(header.text)
        if FIGURE.search(line.text) or (in_results and re.search(r"\d\.\d|±", line.text)):
            found.append(line)
    return found


def test_every_figure_has_a_reproduce_line() -> None:
    problems = []
    for path in HAND_WRITTEN:
        for section in _sections(path):
            if any(re.match(r"\s*Reproduce:.*`[^`]+`", line.text) for line in section):
                continue
            title = section[0].text if section and section[0].text.startswith("#") else "(top of the page)"
            problems += [f"{where(line)}: in {title!r}: {line.text.strip()[:100]}" for line in _figures(section)]
    assert not problems, "figures without a `Reproduce:` line in their section:\n" + "\n".join(problems)


LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_relative_links_resolve() -> None:
    problems = []
    for path in DOCS:
        for line in lines_of(path):
            if line.fence is not None:
                continue
            for target in LINK.findall(line.text):
                if re.match(r"[a-z]+:", target) or target.startswith("#"):
                    continue
                file = target.split("#", 1)[0]
                if not (path.parent / file).exists():
                    problems.append(f"{where(line)}: {target} does not exist")
    assert not problems, "\n".join(problems)
