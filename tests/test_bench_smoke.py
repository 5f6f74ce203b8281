"""Every script in bench/ at its smallest size, each in a subprocess with a timeout: it exits 0 and prints the line
that holds its ratio. Nothing else runs the benches, and two of them had stopped running unnoticed (issue 24).

The tiny random model wherever a bench takes one; each bench starts its own embedded Postgres where it needs one
(LANPO_DATABASE_URL is not passed on). bench/rollout.py times vLLM against HF `generate` on the real SmolLM2: it
runs in the vLLM lane (`pytest -m vllm`) and is skipped where vllm is not importable.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240  # a bench that hangs fails instead of holding the lane
VLLM_TIMEOUT_S = 540  # the lane's vLLM benches, run at once (each starts engines of ~10-45 s on two cores); under
# pytest-timeout's 600, so that the benches are ended here, by name

# bench -> (its smallest arguments, a regex for the line with its ratio)
BENCHES: dict[str, tuple[str, str]] = {
    "decode": ("--model tiny-random --rounds 1 --shapes step", r"\| lanpo loop \| [\d.]+ \| [\d.]+x \|"),
    "full_ft": (
        "--steps 1 --prompts 1 --n 2 --prompt-tokens 4 --completion-tokens 4",
        r"update, s \(median\)\s+[\d.]+\s+[\d.]+\s+[\d.]+x",
    ),
    "update_dtype": (
        "--model tiny-random --prompts 1 --n 2 --max-new-tokens 4 --rounds 2",
        r"\| bf16 weights \|.*\| [\d.]+x \|",
    ),
    "shared_prompts": (
        "--model tiny-random --synthetic 2 --n 2 --max-new-tokens 4 --rounds 2",
        r"\| all three \| [\d.]+ \| [\d.]+ \| [\d.]+x \|",
    ),
    "inference": (
        "--model tiny-random --n 1 --max-new-tokens 4 --pool 10 --top-k 3 --batch 1 --repeats 1 --threads 1",
        r"retrieval mode vs zero-shot, s/question +\| [\d.]+ +\| [\d.]+ +\| [+-][\d.]+ s",
    ),
    "retrieval": (
        "--n 200 --problems 20 --queries 3 --ref-queries 1 --vector-queries 3 --exact-queries 2 --ef 40 "
        "--scorer-problems 1 --top-k 2 --judge tiny-random",
        r"\| query p50 \(ms\) \| [\d.e+-]+ \| [\d.e+-]+ \| [\d.]+x \|",
    ),
    "train_step": (
        "--steps 1 --prompts 1 --n 2 --max-new-tokens 4 --threads 1 --model tiny-random",
        r"(?m)^step +[\d.]+ +[\d.]+ +[\d.]+x",
    ),
    "engine_sleep": ("--device cpu", r"plan asleep/awake peak: grpo-baseline [\d.]+x"),  # the engine: GPU only
    "fresh_stats": (
        "--steps 2 --rounds 1",
        r"target: first draw lanpo / analyze <= 1.5x -> inter [\d.]+x, intra [\d.]+x",
    ),
    "transfer_lesson": (
        "--model tiny-random --n 2 --k 1 --max-new-tokens 4",
        r"\| right lesson \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [+-][\d.]+ \([\d.]+\) \|",
    ),
    "lesson_similarity": ("--model tiny-random --per-problem 2", r"different problems: (no pair|\d+ pairs)"),
    "usefulness": ("--steps 2 --groups 4 --versions 8 --rounds 1", r"lanpo / reference: [\d.]+x"),
    "value": ("--steps 2 --problems 8 --batch 4", r"\| value \| \d+ \| [+-]?[\d.na]+ \| [+-]?[\d.na]+ \| [\d.na]+ \|"),
    "pool_ops": ("--scale small --steps 1", r"target: whole step <= 1.5x in-memory -> wall [\d.]+x"),
    "logprob_memory": (  # two fresh processes (~5 s each, most of it importing torch and transformers)
        "--response-tokens 64 --chunk 16 --rounds 1 --phases update",
        r"target: update peak full / chunked >= 4x -> [\d.]+x",
    ),
    "logprob_train": (  # four `lanpo train` processes of 2 x 16 or 32 tokens (most of it starting them)
        "--rows 2 --response-tokens 32 --arms default --threads 1",
        r"target: the default adds <= 1 full-logits copy \(the fused head: <= 0.25\) -> default -?[\d.]+ copies",
    ),
    # exit 1 when a case leaves its band (under the verdict's WORST_RATIO, or over 1.5); fsdp: 2 ranks
    "plan_check": ("--small --case chunked-update --case fsdp-update", r"within 0\.\d\d to 1\.50: yes"),
    "staged_weights": ("--model tiny-random --rounds 1", r"full: staged/checkpoint [\d.]+x bytes"),
    "async": (
        "--model tiny-random --no-sft --rounds 1 --steps 2 --set batch_size=2 --set rollout.n=2 "
        "--set rollout.max_new_tokens=4 --set grpo.minibatch_size=4 --set data.n=8",
        r"async/sync: throughput [\d.]+x",
    ),
}
# bench/gpu_check.py is smoked through its wrapper, bench/gpu_check.sh, as the device runs it: every row in one run
# (test_the_gpu_check_wrapper_runs_every_row_and_refuses_a_missing_gpu). bf16 weights, as on a GPU; the engine-asleep
# row needs vLLM on CUDA, and says it skipped.
GPU_CHECK = ("--device cpu --small --dtype bfloat16", r"gpu check: 7 of 7 ok, 1 skipped")
# The vLLM benches of the rollout and the weight sync, side by side (bash .ci/run --full, in the vllm venv): 89 s of
# one vLLM-lane worker on the slowest 2-core machine, when the suite ran over its budget (docs/log.md, 2026-12-07).
# Twins in the vLLM lane: tests/vllm_engine/test_generate.py and test_adapters.py (the engine's seeded groups, its
# log-probs against the trainer's, the served adapter the trained one), test_train.py and test_full_weights.py (the
# weights a sync moves are the ones served, a failed transfer leaves the old ones whole). What only the benches add
# is their ratio line, and that the scripts still run: run the full lane when a change touches bench/rollout.py,
# bench/weight_sync.py or what they call.
VLLM_BENCHES: dict[str, tuple[str, str]] = {
    "rollout": ("--shape 1x1x4 --repeats 1 --threads 1 --lora", r"\| vllm merged LoRA \| [\d.]+ \| \d+ \| [\d.]+× \|"),
    "weight_sync": ("--rounds 1 --max-new-tokens 4 --threads 1", r"sync lanpo in memory/vLLM reload: [\d.]+x"),
}
# The full lane's vLLM benches (bash .ci/run --full, in the vllm venv). Each starts two engines in processes of its
# own, and the two were 318 s of the vLLM lane's work on the slowest 2-core machine (the lane itself 681 s):
# - reproducible: a fresh process per side, the switch on (engine in process) and off (engine core in a process of
#   its own). Twin in the vLLM lane: tests/vllm_engine/test_reproducible.py, which starts both kinds of engine and
#   fails when the switch stops giving a repeat a fresh engine's answer, or the default engine another distribution.
# - serve: plain `vllm serve` and `lanpo serve --backend vllm`, two engines on one embedded Postgres, 2 requests an
#   arm. Twin: tests/vllm_engine/test_serve_vllm.py, `lanpo serve --backend vllm` under concurrent `openai` clients,
#   batched by the engine, every answer stored once, the judge on the same engine.
# What only the benches add is their ratio line, and that the scripts still run: run the full lane when a change
# touches bench/reproducible.py, bench/serve.py or what they call.
VLLM_FULL_BENCHES: dict[str, tuple[str, str]] = {
    "reproducible": (
        "--shape 2x4x16 --rounds 1 --prompt-tokens 64",
        r"reproducible on/off: decode time [\d.]+x",
    ),
}
# Two servers (plain `vllm serve` and `lanpo serve --backend vllm`, two engines) on one embedded Postgres, 2 requests
# an arm: run alone, never beside other benches' engines, which ran the lane out of memory (an OOM-killed xdist
# worker on a 24 GiB machine).
SERVE_BENCH = (  # one question of each rep's two asked in the warm-up: the judge cache's path, judge share printed
    "--clients 2 --requests 2 --reps 1 --max-tokens 4 --pool 10 --top-k 2 --repeat 0.5 --timeout 400",
    r"target: zero-shot tok/s >= 0\.9x plain vLLM -> [\d.]+x(.|\n)*judge's share of p50 \(retrieval\): \d+%",
)


def _bench_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LANPO_DATABASE_URL"}
    env.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return env


def _bench_cmd(name: str, args: str) -> list[str]:
    return [sys.executable, str(ROOT / "bench" / f"{name}.py"), *args.split()]


def _checked(name: str, returncode: int, stdout: str, stderr: str) -> str:
    assert returncode == 0, f"bench/{name}.py exited {returncode}:\n{stdout[-2000:]}\n{stderr[-4000:]}"
    return stdout


def run_bench(name: str, args: str, tmp_path: Path, timeout: int = TIMEOUT_S) -> str:
    out = subprocess.run(
        _bench_cmd(name, args), capture_output=True, text=True, timeout=timeout, env=_bench_env(), cwd=tmp_path
    )
    return _checked(name, out.returncode, out.stdout, out.stderr)


def _gpu_check_env(tmp_path: Path) -> dict[str, str]:
    """bench/gpu_check.sh's environment as the device runs it (no wheels carried here: the venv has the store's
    packages), its log to $OUT."""
    env = {k: v for k, v in os.environ.items() if k != "LANPO_DATABASE_URL"}
    env.update(PYTHON=sys.executable, GPU_CHECK_WHEELS=str(tmp_path / "none"), OUT=str(tmp_path), OMP_NUM_THREADS="1")
    return env


# The full lane (65 s on the slowest 2-core machine): every row of bench/gpu_check.py, each a part of lanpo's GPU
# path tested on its own in the main lane (the update and its mixed precision, the log-prob chunks, the weight sync
# to the engine, the plan's check). Its twin for the wrapper, test_the_gpu_check_wrapper_refuses_a_missing_gpu, stays.
@pytest.mark.full
@pytest.mark.long("every row of the GPU check on the CPU, bf16 weights")
def test_the_gpu_check_wrapper_runs_every_row(tmp_path: Path) -> None:
    """bench/gpu_check.sh with bench/gpu_check.py's every row at its smallest size: the smoke of both (one run,
    where a smoke of the script and a second run of the wrapper with two of its rows set up the store twice)."""
    args, ratio = GPU_CHECK
    script = str(ROOT / "bench" / "gpu_check.sh")
    env = _gpu_check_env(tmp_path)
    run = subprocess.run(["bash", script, *args.split()], capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "| sync to engine | ok |" in run.stdout
    assert re.search(ratio, run.stdout), f"bench/gpu_check.sh printed no ratio line ({ratio}):\n{run.stdout[-3000:]}"
    assert re.search(ratio, (tmp_path / "gpu_check.log").read_text())  # the log lands in $OUT


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_the_gpu_check_wrapper_refuses_a_missing_gpu(tmp_path: Path) -> None:
    refused = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=_gpu_check_env(tmp_path),
    )
    assert refused.returncode == 2 and "error: no CUDA device here" in refused.stdout + refused.stderr


def test_every_bench_is_smoked() -> None:
    smoked = set(BENCHES) | set(VLLM_BENCHES) | set(VLLM_FULL_BENCHES) | {"gpu_check", "serve"}  # gpu_check: above
    assert {p.stem for p in (ROOT / "bench").glob("*.py")} - {"harness"} == smoked


# The full lane's benches (bash .ci/run --full): 58, 51 and 32 s on the slowest 2-core machine, each several
# processes of its own. What each measures has its twin in the main lane, which fails on the same defect of lanpo's:
# - plan_check (the plan's peaks against measured ones): tests/train/test_plan_verdict.py (the documented
#   predictions are today's plan; the verdict's margin is the worst measured under-prediction);
# - logprob_train (the copies of the logits `lanpo train` holds): tests/train/test_chunked_logprobs.py (the chunked
#   and fused log-probs against the per-token loop, at, below and above the chunk, at Qwen's vocabulary);
# - async (rollout workers against the synchronous run): tests/train/test_workers.py (one worker at staleness 0 is
#   the synchronous run; killed workers and trainers lose nothing).
# What only the benches add is their ratio line, and that the scripts still run.
# value: two training runs on the simulated policy (15 s); twins tests/train/test_sim_policy.py (the sim through
# lanpo's trainer) and tests/db/test_value_draw.py (the value-aware draw and its bound).
# Six more when a fresh clone's CI ran past its budget (98 s of a main-lane worker here, without the bytecode cache:
# 10-20 s each, most of it starting fresh processes and Postgres servers):
# - full_ft (LoRA against full fine-tuning, seconds and peak memory): tests/train/test_full_ft.py (every weight
#   trains, the frozen reference, the whole-model checkpoint and its resume);
# - fresh_stats (the first draws planned on the statistics lanpo refreshed): tests/db/test_stats.py and
#   tests/db/test_stats_cli.py (each bulk writer leaves the planner its rows);
# - train_step (lanpo's step beside TRL's GRPOTrainer, with and without the store): tests/train/test_trl.py (TRL's
#   trainer with lanpo's store, drawn and written through) and the trainer's own step tests;
# - logprob_memory (the chunked head's peak against the full logits): tests/train/test_chunked_logprobs.py, as for
#   logprob_train;
# - lesson_similarity (would a summariser's lessons merge): tests/test_merging.py (the merge's cosine and its
#   guard, `same_terms`);
# - update_dtype (bf16 against fp32 for the update): tests/train/test_autocast.py and test_mixed_precision.py (the
#   bf16 update is measured, taken only where it pays, and computes with the bf16 cast of the weights).
FULL_BENCHES = {
    "plan_check",
    "logprob_train",
    "async",
    "value",
    "full_ft",
    "fresh_stats",
    "train_step",
    "logprob_memory",
    "lesson_similarity",
    "update_dtype",
}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.full) if n in FULL_BENCHES else n for n in sorted(BENCHES)]
)
def test_bench_runs_at_its_smallest_size(name: str, tmp_path: Path) -> None:
    args, ratio = BENCHES[name]
    stdout = run_bench(name, args, tmp_path)
    assert re.search(ratio, stdout), f"bench/{name}.py printed no ratio line ({ratio}):\n{stdout[-3000:]}"


@pytest.fixture(scope="module")
def vllm_benches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int | None, str, str]]:
    """The lane's vLLM benches run at once, each in a folder of its own, its output to files there (a pipe nobody reads
    yet would stall it); {name: (exit status, None past the timeout; stdout; stderr)}. A bench spends most of its
    smoke starting engines, waiting on one spawned process after another with a core idle, so side by side on 2
    cores they take about the longest one's time, not the sum. Only the ratio line is checked here, never a
    figure, so the benches may share the cores. All have ended when this returns: no test's processes are the
    benches'."""
    started = {}
    for name, (args, _) in sorted(VLLM_BENCHES.items()):
        cwd = tmp_path_factory.mktemp(f"bench-{name}")
        with open(cwd / "stdout", "w") as out, open(cwd / "stderr", "w") as err:
            started[name] = (
                subprocess.Popen(_bench_cmd(name, args), stdout=out, stderr=err, env=_bench_env(), cwd=cwd),
                cwd,
            )
    deadline = time.monotonic() + VLLM_TIMEOUT_S
    results: dict[str, tuple[int | None, str, str]] = {}
    for name, (proc, cwd) in started.items():
        try:
            code: int | None = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
            proc.kill()
            proc.wait()
        results[name] = (code, (cwd / "stdout").read_text(), (cwd / "stderr").read_text())
    return results


@pytest.mark.vllm
@pytest.mark.full
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="bench/rollout.py needs vLLM (the vllm venv)")
@pytest.mark.parametrize("name", sorted(VLLM_BENCHES))
def test_vllm_bench_runs_at_its_smallest_size(name: str, vllm_benches: dict[str, tuple[int | None, str, str]]) -> None:
    _, ratio = VLLM_BENCHES[name]
    code, stdout, stderr = vllm_benches[name]
    if code is None:
        pytest.fail(f"bench/{name}.py ran past {VLLM_TIMEOUT_S} s:\n{stdout[-2000:]}\n{stderr[-4000:]}")
    stdout = _checked(name, code, stdout, stderr)
    assert re.search(ratio, stdout), f"bench/{name}.py printed no ratio line ({ratio}):\n{stdout[-3000:]}"


@pytest.mark.vllm
@pytest.mark.full
@pytest.mark.long("two fresh processes, each starting a vLLM engine (one with its core in a process of its own)")
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="the vLLM benches need vLLM (the vllm venv)")
@pytest.mark.parametrize("name", sorted(VLLM_FULL_BENCHES))
def test_full_lane_vllm_bench_runs_at_its_smallest_size(name: str, tmp_path: Path) -> None:
    args, ratio = VLLM_FULL_BENCHES[name]
    stdout = run_bench(name, args, tmp_path, timeout=VLLM_TIMEOUT_S)
    assert re.search(ratio, stdout), f"bench/{name}.py printed no ratio line ({ratio}):\n{stdout[-3000:]}"


@pytest.mark.vllm
@pytest.mark.full
@pytest.mark.long("two servers, each with a vLLM engine in processes of its own")
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="bench/serve.py needs vLLM (the vllm venv)")
def test_the_serving_bench_runs_at_its_smallest_size(tmp_path: Path) -> None:
    """Alone (the full lane runs one test at a time), so that its two engines run beside no other bench's."""
    args, ratio = SERVE_BENCH
    stdout = run_bench("serve", args, tmp_path, timeout=VLLM_TIMEOUT_S)
    assert re.search(ratio, stdout), f"bench/serve.py printed no ratio line ({ratio}):\n{stdout[-3000:]}"
