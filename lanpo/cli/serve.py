"""`lanpo serve`: retrieval-augmented answers behind an OpenAI-compatible API, every answer kept in the store."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from lanpo.cli.params import VLLM_SETTINGS, Float, Int, field_option
from lanpo.config import DTYPE_NAMES, apply_overrides, from_mapping
from lanpo.db.repo.sampling import PRIORS, RANKS
from lanpo.errors import ConfigError
from lanpo.inference.config import BACKENDS, INFERENCE_MODES, EvalConfig, RetrievalSettings, SamplingSettings
from lanpo.retrieval import STAGE1

MODE_CHOICES = [m.replace("_", "-") for m in INFERENCE_MODES] + list(INFERENCE_MODES)


@click.command("serve")
@field_option(EvalConfig, "model")
@click.option("--adapter", type=click.Path(path_type=Path), help="PEFT LoRA adapter folder to serve.")
@field_option(EvalConfig, "backend", type=click.Choice(BACKENDS))
@VLLM_SETTINGS
@field_option(EvalConfig, "dtype", type=click.Choice(DTYPE_NAMES))
@field_option(EvalConfig, "device", help="torch device for the hf backend (default: cuda when available, else cpu).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind; beyond loopback, keys needed.")
@click.option("--port", default=8000, show_default=True, type=Int(1, 65535), help="TCP port.")
@click.option("--pool", "pool_name", default=None, help="Default pool of /v1/... (default: the store's only pool).")
@click.option(
    "--mode",
    type=click.Choice(MODE_CHOICES),
    default="retrieval",
    show_default=True,
    help="Default answer mode (a request may set lanpo.mode).",
)
@field_option(RetrievalSettings, "stage1", type=click.Choice(STAGE1))
@field_option(RetrievalSettings, "top_k", type=Int(1))
@field_option(RetrievalSettings, "gamma", type=Float(0, 1))
@field_option(RetrievalSettings, "m", "--m", "m", type=Int(1))
@field_option(RetrievalSettings, "judge")
@field_option(
    RetrievalSettings,
    "rank",
    type=click.Choice(RANKS),
    default="value",
    help="Relevance (the paper) | value (the default here: lessons known to hurt are never read; docs/concepts.md).",
)
@field_option(RetrievalSettings, "value_bound", type=Float(-1, 1))
@field_option(RetrievalSettings, "prior", type=click.Choice(PRIORS))
@field_option(SamplingSettings, "max_new_tokens", type=Int(1), help="max_tokens of a request that sets none.")
@field_option(SamplingSettings, "temperature", type=Float(0, 2), help="temperature of a request that sets none.")
@field_option(SamplingSettings, "top_p", type=Float(0, 1, min_open=True), help="top_p of a request that sets none.")
@click.option(
    "--api-key",
    "api_keys",
    multiple=True,
    envvar="LANPO_SERVE_API_KEY",
    help="A key callers send as `Authorization: Bearer KEY`; reads every pool (repeatable; env LANPO_SERVE_API_KEY).",
)
@click.option(
    "--keys",
    "keys_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help='TOML of named keys and the pools each may read: [keys.NAME] key = "..." pools = ["demo"].',
)
@click.option("--run-name", default=None, help="Name of the serving run in the store (default: serve-<UTC time>).")
@click.option("--served-model-name", default=None, help="The model id clients send (default: --model).")
@click.option("--max-batch", default=8, show_default=True, type=Int(1, 1024), help="hf backend: requests per batch.")
@click.option("--max-tokens-limit", default=4096, show_default=True, type=Int(1), help="Largest max_tokens accepted.")
@click.option(
    "--max-question-tokens", default=4096, show_default=True, type=Int(1), help="Longest messages accepted (413)."
)
@click.option("--max-body-bytes", default=1 << 20, show_default=True, type=Int(1024), help="Largest body (413).")
@click.option(
    "--max-pending", default=256, show_default=True, type=Int(1), help="Requests in flight before 503 (backpressure)."
)
@click.option(
    "--learn",
    default="off",
    show_default=True,
    metavar="off|on|POOL[,POOL]",
    help="Learn lessons from answers marked good: off, on (every pool), or these pools.",
)
@click.option(
    "--learn-min-reward",
    default=1.0,
    show_default=True,
    type=Float(),
    help="Feedback with no verdict is good at a reward >= this.",
)
@click.option(
    "--learn-max-new-tokens", default=256, show_default=True, type=Int(1), help="Longest lesson written (tokens)."
)
@click.option(
    "--learn-scaffold/--no-learn-scaffold",
    default=False,
    show_default=True,
    help="Write the lesson's headers for the model (summarizer.scaffold: for a weak served model).",
)
@click.option(
    "--engine-stats/--no-engine-stats",
    default=False,
    show_default=True,
    help="vllm backend: gather vLLM's scheduler stats every step, for /health's engine.peak_running (about 2 % of "
    "its tokens a second on a 2-core CPU).",
)
@click.option(
    "--learn-require-format/--no-learn-require-format",
    default=True,
    show_default=True,
    help="Admit only a lesson in the summary format (summarizer.require_format).",
)
def command(**options: Any) -> None:
    """Serve MODEL behind an OpenAI-compatible API whose answers read the experience store.

    \b
    Routes (any OpenAI client works by its base_url):
      /v1/chat/completions              the default pool (--pool, else the store's only pool)
      /pools/NAME/v1/chat/completions   pool NAME
      /v1/models, /v1/feedback, /health
    A request's question is its last user message, after any system prompt and earlier turns. lanpo writes
    the prompt as `lanpo infer` does, in --mode (a request may set `lanpo: {mode, gamma, m, top_k, judge,
    stage1}`), inside the client's conversation: retrieval puts the lessons relevant to the question into it;
    with none relevant it answers zero-shot and says why (`lanpo.fallback`). Tools and images are a 400.

    \b
    Every answer is stored before its response is sent: an attempt of the serving run (one per pool), with the
    lessons its prompt read; the response's `lanpo.answer_ids` name them. POST /v1/feedback
    {"answer_id", "verdict" | "reward" | "gold_answer"} records how an answer did: experience_usage, lanpo report
    and SQL then show which lessons helped.

    \b
    Keys: none needed on a loopback address; binding any other needs --api-key or --keys. Requests run their
    SQL as the serving role (`lanpo db serve-role`): it reads pools and inserts answers and feedback, nothing else.
    Ctrl-C (or SIGTERM) drains: requests in flight finish and are stored, then the runs are marked finished.

    \b
    Learning (--learn): an answer whose feedback is good (a verdict correct, a matching gold answer, or a reward
    at --learn-min-reward) is summarised by the served model into a lesson, admitted by training's rules and the
    pool's caps, on probation; the feedback's response says what became of it (`lesson`). Scopes: a request in
    /scopes/NAME/v1/... (or lanpo.scope) reads NAME's lessons and the shared ones, and its lessons are NAME's;
    a key in --keys may be bound to scopes (scopes = ["alice"]).
    """
    start(**options)


def start(
    model: str,
    adapter: Path | None,
    backend: str,
    vllm_settings: tuple[str, ...],
    dtype: str,
    device: str | None,
    host: str,
    port: int,
    pool_name: str | None,
    mode: str,
    stage1: str,
    top_k: int,
    gamma: float,
    m: int,
    judge: str,
    rank: str,
    value_bound: float,
    prior: str,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    api_keys: tuple[str, ...],
    keys_file: Path | None,
    run_name: str | None,
    served_model_name: str | None,
    max_batch: int,
    learn: str,
    learn_min_reward: float,
    learn_max_new_tokens: int,
    learn_scaffold: bool,
    learn_require_format: bool,
    engine_stats: bool,
    **limits: int,
) -> None:
    """The options checked (what a typo can break fails before the store or a model is touched), then `serve`."""
    from lanpo.feedback.config import SummarizerConfig
    from lanpo.inference.config import normalise_mode
    from lanpo.models import check_model_ref
    from lanpo.rollout.config import VLLMConfig
    from lanpo.serve.keys import KeyRing, is_loopback
    from lanpo.serve.learn import LearnPolicy

    keys = KeyRing.build(api_keys, keys_file)
    if not keys.required and not is_loopback(host):
        raise ConfigError(
            f"binding {host} serves other machines, and no API key is set",
            hint="pass --api-key KEY or --keys FILE, or bind 127.0.0.1",
        )
    ranking = {"rank": rank, "value_bound": value_bound, "prior": prior}
    retrieval = RetrievalSettings(stage1=stage1, top_k=max(top_k, m), gamma=gamma, m=m, judge=judge, **ranking)
    sampling = SamplingSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=None)
    vllm = from_mapping(VLLMConfig, apply_overrides({}, list(vllm_settings)), prefix="vllm.")
    if sampling.max_new_tokens > limits["max_tokens_limit"]:
        raise ConfigError(
            f"--max-new-tokens ({max_new_tokens}) is over --max-tokens-limit ({limits['max_tokens_limit']})",
            hint="raise --max-tokens-limit or lower --max-new-tokens",
        )
    if adapter is not None and not (adapter / "adapter_config.json").is_file():
        raise ConfigError(f"{adapter} holds no PEFT adapter (adapter_config.json)", hint="pass a trainer's adapter")
    check_model_ref(model)
    summarizer = SummarizerConfig(
        max_new_tokens=learn_max_new_tokens,
        min_reward=learn_min_reward,
        scaffold=learn_scaffold,
        require_format=learn_require_format,
    )
    settings_kwargs: dict[str, Any] = {
        "learn": LearnPolicy.parse(learn, summarizer),
        "model": model,
        "served_name": served_model_name or model,
        "backend": backend,
        "mode": normalise_mode(mode),
        "retrieval": retrieval,
        "sampling": sampling,
        "engine_stats": engine_stats,
        **limits,
    }
    serve(settings_kwargs, keys, host, port, pool_name, run_name, adapter, dtype, device, max_batch, vllm)


def serve(
    settings_kwargs: dict[str, Any],
    keys: Any,
    host: str,
    port: int,
    pool_name: str | None,
    run_name: str | None,
    adapter: Path | None,
    dtype: str,
    device: str | None,
    max_batch: int,
    vllm: Any,
) -> None:
    import uvicorn

    from lanpo.db.connection import open_store, transaction
    from lanpo.db.repo.pools import pool_names, resolve_pool
    from lanpo.db.serve_role import serve_engine
    from lanpo.inference.run import default_name
    from lanpo.serve.app import Server, create_app
    from lanpo.serve.settings import ServeSettings

    owner = open_store()  # a fresh home's store is created, as every command does
    with transaction(owner) as session:
        if pool_name is not None:
            resolve_pool(session, pool_name)  # an unknown name: exit 2 with the pools there are
            default_pool = pool_name
        else:
            names = pool_names(session)
            default_pool = names[0] if len(names) == 1 else None
    if default_pool is None:
        click.echo(
            "note: no default pool (the store holds none, or several): /v1/... answers zero-shot; "
            "/pools/NAME/v1/... reads NAME",
            err=True,
        )
    role = serve_engine(owner)
    settings = ServeSettings(**settings_kwargs, run_name=run_name or default_name("serve"))
    from lanpo.inference.run import InferenceRun

    InferenceRun.check(role, settings.run_name, "serve", settings.model)  # a taken name fails before the model loads

    async def start_engine() -> Any:
        import asyncio

        if settings.backend == "vllm":
            from lanpo.serve.vllm_engine import AsyncVLLMEngine

            name, stats = settings.model, settings.engine_stats
            return await AsyncVLLMEngine.start(name, vllm, adapter, model_id=name, engine_stats=stats)
        from lanpo.serve.engine import load_hf

        return await asyncio.to_thread(
            load_hf, settings.model, None if adapter is None else str(adapter), dtype, device, max_batch
        )

    _log_requests()
    server = Server(settings, keys, owner, role, start_engine, default_pool)
    app = create_app(server)
    click.echo(f"lanpo serve: {settings.model} on http://{host}:{port}/v1 (run {settings.run_name})", err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, timeout_graceful_shutdown=30)
    if server.engine is None:
        raise SystemExit(1)  # the engine failed to start: uvicorn printed why


def _log_requests() -> None:
    """One JSON line per answered request on stderr (`lanpo.serve.access`), whatever -v says."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access = logging.getLogger("lanpo.serve.access")
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    access.propagate = False
    info = logging.getLogger("lanpo.serve")
    info.setLevel(logging.INFO)
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its per-call timeout warnings, at every graded answer
