"""The fine-tuning fan-out, the one used by `bertflow finetune` and by the flow: `plan` the units of
every checkpoint, then `run` them in worker processes (the flow instead maps one Prefect task over
each job, all sharing one `UnitPool`).

`plan` owns the units' directories and labels. A unit writes `ROOT/units/<unit>__<label>-<key>/`,
where the key (`common.fingerprint`) covers everything that determines its result: the unit's
task, lr and seed, the fine-tuning settings, the task definition and its data, the checkpoint
and the tokenizer, each by content, not by place. So a finished unit is found again by any plan
that needs it (adding a task, an lr or a seed; a flow run after `bertflow finetune CONFIG`; the
checkpoint's run directory moved or copied: the result it gives the scorecard then names the
checkpoint where it is now, `as_job_result`; its stored result.json keeps the path it was trained from),
and a changed setting or a model retrained in place never reuses a stale result. Random init of a
model directory's shape (random:DIR) takes DIR's architecture only, so its units also carry a `random_init_key` without DIR's path and
weights: `reuse_random_init_units` copies such a unit's result from an earlier pretraining run's
baseline of the same architecture instead of retraining it under the new model's label.

Workers run with bounded concurrency, each with its share of the CPU threads: `concurrency` of
them on CPU; on a GPU machine `units_per_gpu` share each GPU (a small model's unit leaves most of
one idle), as many as there are CPU cores at most. A
failed unit is recorded and the others go on; workers exit when the parent dies (a killed command
leaves no orphan finishing units behind); a stopped command (Ctrl-C, SIGTERM) ends the units in
flight with their workers (`UnitPool.stop`).
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from common.atomic import read_marker
from common.child_process import survive_a_lost_reader, watch_parent
from common.console import warning_line
from common.errors import UserError
from common.fingerprint import KEY_LENGTH, content_digest, digest, model_dir_content, model_dir_stamp
from common.temp_dir import named_temp_dir
from common.tracking import WandbTarget
from finetuning.checkpoints import (
    checkpoint_label,
    checkpoint_target,
    is_random,
    normalize_checkpoint,
    tokenizer_dir_for,
)
from finetuning.config import FinetuneConfig
from finetuning.tasks import get_task, task_data
from finetuning.units import (
    FinetuneUnit,
    Job,
    adopt_result,
    failed_result,
    finetune_units,
    run_finetune_unit,
    stored_result,
)
from model.config import BertConfig
from model.hf_io import TOKENIZER_FILES, iter_weights, normalize_keys
from model.model_dir import first_nonfinite
from preprocessing.wordpiece import load_tokenizer
from training.ranks import visible_gpus

# Fine-tuning settings left out of a unit's key: they pick which units run and how they are
# scheduled, not what one unit computes (a unit carries its own task, lr and seed, so growing a
# sweep reuses every finished unit).
NOT_IN_UNIT_KEY = {*FinetuneConfig.run_only, "tasks", "lrs", "seeds", "baselines", "task_config"}
WORKER_DIED = "the worker process died (out of memory or killed); rerun to retry this unit"
UNITS_STOPPED = "stopped with the command before it finished; rerun to train this unit"
WORKER_LOST = (
    "a fine-tuning worker process died (out of memory or killed), stopping the units in flight; "
    "they run again in new workers (a unit whose worker dies twice fails)"
)

# How unit keys held their inputs, newest first (`unit_key`): "content", since 2026-11-27 (a moved
# or copied checkpoint keeps its units); "stamps", since 2026-11-25: the checkpoint by its path and
# its weight files' stamps (path, size, mtime); "path", before: the task data by path too. `plan`
# finds a finished unit under any of them.
KEY_SCHEMES = ("content", "stamps", "path")


def plan(
    cfg: FinetuneConfig,
    checkpoints: list[str],
    root: Path,
    *,
    tokenizer_dir: Path | None = None,
    data_root: str | None = None,
    units: list[FinetuneUnit] | None = None,
) -> list[Job]:
    """One job per (checkpoint, unit), checkpoints in the given order; units default to every
    (task, lr, seed) of `cfg`. Bad checkpoints, tasks or tokenizers are UserErrors, raised here,
    before any unit runs."""
    units = finetune_units(cfg) if units is None else units
    if tokenizer_dir is not None:  # once here, not as a failure of every unit
        load_tokenizer(tokenizer_dir, key="--tokenizer")
    units_dir = Path(root) / "units"
    jobs = []
    for checkpoint in (normalize_checkpoint(c) for c in checkpoints):
        check_model_limits(cfg, checkpoint, {u.task for u in units})
        tokenizer = tokenizer_dir_for(checkpoint, tokenizer_dir)
        label = checkpoint_label(checkpoint)
        for unit in units:
            slug = _slug(f"{unit.name}__{label}")
            key = unit_key(cfg, unit, checkpoint, tokenizer, data_root)
            # a unit made before 2026-11-27 is under the key of its time
            if units_dir.is_dir() and not (units_dir / f"{slug}-{key}").exists():
                older = (unit_key(cfg, unit, checkpoint, tokenizer, data_root, s) for s in KEY_SCHEMES[1:])
                key = next((k for k in older if (units_dir / f"{slug}-{k}").is_dir()), key)
            out_dir = units_dir / f"{slug}-{key}"
            if not out_dir.exists() and not is_random(checkpoint):  # random:DIR: reuse_random_init_units
                out_dir = _finished_under_another_label(units_dir, unit, key) or out_dir
            shared = random_init_key(cfg, unit, checkpoint, tokenizer, data_root)
            jobs.append(Job(unit, checkpoint, label, tokenizer, out_dir, key, shared))
    return jobs


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _finished_under_another_label(units_dir: Path, unit: FinetuneUnit, key: str) -> Path | None:
    """A finished directory of `unit` under `key` named after another checkpoint label: the key
    holds the model's content, not its name, so a model copied or moved to a folder of another
    name (`--checkpoint COPY`) finds the units trained from the original."""
    if not units_dir.is_dir():
        return None
    found = sorted(units_dir.glob(f"{_slug(unit.name)}__*-{key}"))
    return next((d for d in found if read_marker(d) is not None), None)


def reuse_random_init_units(jobs: list[Job]) -> int:
    """Random-init units (random:DIR) not finished yet whose result another unit directory holds
    under the same `random_init_key` (the baseline of an earlier pretraining run of the same
    architecture, tokenizer, task data and settings: random weights do not depend on DIR's) are
    copied from it, not retrained. Returns how many were."""
    reused = 0
    for job in jobs:
        # (a unit that keeps its model trains: a copied result comes without one)
        if job.random_init_key is None or job.keep_model or read_marker(job.out_dir) is not None:
            continue
        for candidate in sorted(job.out_dir.parent.glob(_slug(f"{job.unit.name}__random:") + "*")):
            marker = read_marker(candidate)  # written last: its result is complete
            if candidate != job.out_dir and (marker or {}).get("random_init_key") == job.random_init_key:
                reused += adopt_result(job, candidate)
                break
    return reused


def check_model_limits(cfg: FinetuneConfig, checkpoint: str, tasks: set[str]) -> None:
    """Settings the checkpoint's architecture cannot serve, refused before any unit runs."""
    from model.hf_io import read_config

    target = checkpoint_target(checkpoint)
    model = read_config(Path(target)) if "/" in target else BertConfig.from_preset(target)
    check_architecture(cfg, model, f"checkpoint {checkpoint}", tasks)


def untrained_positions_notes(cfg: FinetuneConfig, jobs: list[Job]) -> list[str]:
    """One note per checkpoint that was pretrained on shorter sequences than `cfg.max_seq_length`
    (its `model_max_length`): fine-tuning inputs longer than that reach position embeddings that
    pretraining never trained. A warning, not a refusal: fine-tuning trains them too."""
    from model.model_dir import trained_length

    notes = []
    for checkpoint in sorted({j.checkpoint for j in jobs if not is_random(j.checkpoint)}):
        trained = trained_length(Path(checkpoint))
        if trained is not None and trained < cfg.max_seq_length:
            notes.append(
                f"{checkpoint} was pretrained on sequences of {trained} tokens, but "
                f"finetune.max_seq_length is {cfg.max_seq_length}: positions {trained}..{cfg.max_seq_length - 1} "
                f"of longer inputs start untrained. Set finetune.max_seq_length (--max-seq-length) to "
                f"{trained}, or pretrain on longer examples."
            )
    return notes


# task kinds whose head reads the pooled [CLS] vector; token and span heads use the encoder without
# its pooler (model/heads.py), so a NaN in the pooler alone does not reach their units
POOLED_KINDS = ("classification", "regression")


def nonfinite_encoder_weight(model_dir: Path, pooler: bool = True) -> str | None:
    """The first weight of the encoder (what a unit takes from a checkpoint; its heads are
    replaced), the pooler only with `pooler`, holding NaN or Inf, read one tensor at a time; None
    when all are finite."""
    prefixes = ("bert.",) if pooler else ("bert.embeddings.", "bert.encoder.")

    def encoder() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in iter_weights(model_dir):
            if any(key.startswith(prefixes) for key in normalize_keys({name: tensor})[0]):
                yield name, tensor

    return first_nonfinite(encoder())


def refuse_nonfinite_encoders(cfg: FinetuneConfig, jobs: list[Job], retrain: bool = False) -> None:
    """Before any unit runs: each checkpoint with units still to train (every unit, with
    `retrain`), refused when the part of its encoder those units take holds NaN or Inf
    (`check_encoder_finite`)."""
    to_train: dict[str, set[str]] = {}
    for job in jobs:
        if not is_random(job.checkpoint) and (retrain or read_marker(job.out_dir) is None):
            to_train.setdefault(job.checkpoint, set()).add(job.unit.task)
    for checkpoint, tasks in sorted(to_train.items()):
        pooled = any(get_task(task, cfg.task_config).kind in POOLED_KINDS for task in tasks)
        check_encoder_finite(checkpoint, pooler=pooled)


def check_encoder_finite(checkpoint: str, pooler: bool = True) -> None:
    """A checkpoint whose encoder (with its pooler, for tasks that read it) holds a NaN or Inf
    weight is refused, naming the weight: every unit of it would diverge."""
    if (name := nonfinite_encoder_weight(Path(checkpoint), pooler)) is not None:
        raise UserError(
            f"checkpoint {checkpoint}: weight {name!r} contains NaN or Inf; every unit would diverge.",
            fix="fine-tune an earlier checkpoint of that run (its training diverged after it), or another model.",
        )


def check_architecture(cfg: FinetuneConfig, model: BertConfig, name: str, tasks: set[str]) -> None:
    """Longer sequences than `model`'s position table, or sentence pairs without a second token
    type, are refused; `name` says which model (a checkpoint, or the one a flow will pretrain)."""
    positions = model.max_position_embeddings
    if cfg.max_seq_length > positions:
        raise UserError(
            f"finetune.max_seq_length {cfg.max_seq_length} exceeds the {positions} positions of "
            f"{name} (model.max_position_embeddings); longer inputs would index past its position table.",
            fix=f"set finetune.max_seq_length (--max-seq-length) to {positions} or less.",
        )
    pairs = sorted(
        t for t in tasks if (s := get_task(t, cfg.task_config)).text_b is not None or s.format == "squad"
    )
    if pairs and model.type_vocab_size < 2:
        raise UserError(
            f"{name} has type_vocab_size {model.type_vocab_size}, but the tasks "
            f"{pairs} feed sentence pairs (token type 1).",
            fix="drop those tasks for this model, or use a model with two token types.",
        )


def unit_key(
    cfg: FinetuneConfig,
    unit: FinetuneUnit,
    checkpoint: str,
    tokenizer_dir: Path,
    data_root: str | None,
    scheme: str = "content",
) -> str:
    """The key of `unit` of `checkpoint` (normalized) under `scheme` (`KEY_SCHEMES`). "content": a
    model directory by its config and weight files' names, sizes and sha256 (a model retrained in
    place is a new checkpoint; one moved or copied is not), random:DIR by DIR's architecture,
    random:PRESET by its name; the tokenizer files by content; the task's data files by size and
    sha256 under their configured path (an edited TSV is new data; a moved data root is not).
    The older schemes, to find the units made under them: "stamps" holds the checkpoint's path and
    its `model_dir_stamp`, and the tokenizer files' digests in a list; "path" the data files by
    resolved path too."""
    if scheme == "content":
        held = {"checkpoint": _content(checkpoint)}
    else:
        target = checkpoint_target(checkpoint)
        held = {"checkpoint": checkpoint, "weights": model_dir_stamp(target) if "/" in target else None}
    return digest({**_unit_inputs(cfg, unit, tokenizer_dir, data_root, scheme), **held}, KEY_LENGTH)


def _content(checkpoint: str) -> dict[str, Any]:
    """What a unit takes from `checkpoint`, without where it is (`unit_key`'s "content")."""
    target = checkpoint_target(checkpoint)
    if not is_random(checkpoint):
        return {"weights": model_dir_content(target)}
    return {"random": _architecture(target) if "/" in target else target}


def _architecture(model_dir: str) -> dict[str, Any]:
    """A model directory's architecture (its config.json, as read), what random init of it takes."""
    from model.hf_io import read_config

    return dataclasses.asdict(read_config(Path(model_dir)))


def random_init_key(
    cfg: FinetuneConfig, unit: FinetuneUnit, checkpoint: str, tokenizer_dir: Path, data_root: str | None
) -> str | None:
    """For random:DIR, what its unit's result depends on: `unit_key`'s inputs ("stamps", as since
    2026-11-25: the markers of finished units hold this key) with DIR's architecture (config.json)
    in place of DIR's path and weights; None for other checkpoints. A tokenizer file the tokenizer
    lacks is "missing", not `missing:<its path>` (a model with vocab.txt alone matched no copy of
    itself elsewhere); a tokenizer with both files gives the key it gave before."""
    target = checkpoint_target(checkpoint)
    if not is_random(checkpoint) or "/" not in target:
        return None
    inputs = _unit_inputs(cfg, unit, tokenizer_dir, data_root, "stamps")
    inputs["tokenizer"] = [d if not d.startswith("missing:") else "missing" for d in inputs["tokenizer"]]
    return digest({**inputs, "architecture": _architecture(target)}, KEY_LENGTH)


def _unit_inputs(
    cfg: FinetuneConfig, unit: FinetuneUnit, tokenizer_dir: Path, data_root: str | None, scheme: str
) -> dict[str, Any]:
    spec = get_task(unit.task, cfg.task_config)
    data = (
        [str(spec.path(split, data_root)) for split in ("train", "dev")]
        if scheme == "path"
        else task_data(spec, data_root)
    )
    files = [tokenizer_dir / name for name in TOKENIZER_FILES]
    tokenizer = (  # "content": the files it has, by name (content_digest names a missing one's path)
        {p.name: content_digest(p) for p in files if p.is_file()}
        if scheme == "content"
        else [content_digest(p) for p in files]
    )
    return {
        "unit": dataclasses.asdict(unit),
        "settings": cfg.settings_without(NOT_IN_UNIT_KEY),
        "task": spec.model_dump(mode="json", exclude={"source"}),
        "data": data,
        "tokenizer": tokenizer,
    }


UNITS_TMP = "bertflow-finetune-"  # + the bertflow's pid, "-", a random part (common.temp_dir)


class UnitPool:
    """Worker processes for fine-tuning units (`worker_count`: `cfg.concurrency` on CPU,
    `cfg.units_per_gpu` per GPU on a GPU machine, never more than jobs), each with `unit_threads`
    torch threads; worker i pinned to GPU i mod the GPUs. The workers start with the first unit that
    trains: a finished unit's result is read here, so a run whose units are all done starts none.
    Their temp directory is a folder of the pool's, removed when it closes or stops: W&B makes two
    folders there at import that only a normal exit removes, and a stop's terminated workers (Ctrl-C)
    or a killed one left them in /tmp."""

    def __init__(
        self,
        cfg: FinetuneConfig,
        n_jobs: int,
        *,
        data_root: str | None = None,
        wandb: WandbTarget | None = None,
    ) -> None:
        self.cfg, self.data_root, self.wandb = cfg, data_root, wandb or WandbTarget()
        n_gpus = visible_gpus()
        self.workers = worker_count(cfg, n_jobs, n_gpus)
        ctx = mp.get_context("spawn")
        devices = None
        if n_gpus:
            devices = ctx.Queue()
            for i in range(self.workers):
                devices.put(i % n_gpus)
        threads = unit_threads(cfg, self.workers, n_gpus)
        self._new_pool = lambda: ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=ctx,
            initializer=_init_worker,
            initargs=(os.getpid(), threads, devices, self._worker_temp_dir()),
        )
        self._pool: ProcessPoolExecutor | None = None
        self._temp = ExitStack()
        self._temp_dir: str | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def run(self, job: Job) -> dict[str, Any]:
        """Run one job in a worker and wait for it; never raises (a failure is an `error` result).
        A worker that dies (kill -9, the OOM killer) breaks the whole executor, failing every unit in
        flight or queued with it: those run again in a fresh one, once; a unit whose worker dies
        twice fails with WORKER_DIED."""
        try:
            if (done := stored_result(job)) is not None:
                return done
        except UserError as exc:
            return failed_result(job, str(exc), bad_input=True)
        for _ in range(2):
            if self._stopped:
                return failed_result(job, UNITS_STOPPED)
            pool = self._executor()
            try:
                return pool.submit(_run_job, self.cfg, job, self.data_root, self.wandb).result()
            except BrokenProcessPool:
                with self._lock:  # the first unit to see it replaces it
                    if self._stopped:
                        return failed_result(job, UNITS_STOPPED)
                    if self._pool is pool:
                        pool.shutdown(wait=False, cancel_futures=True)
                        self._pool = self._new_pool()
                        print(f"finetune: {warning_line(WORKER_LOST)}", file=sys.stderr, flush=True)
        return failed_result(job, WORKER_DIED)

    def _worker_temp_dir(self) -> str:
        if self._temp_dir is None:
            self._temp_dir = str(self._temp.enter_context(named_temp_dir(UNITS_TMP)))
        return self._temp_dir

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = self._new_pool()
            return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._temp.close()

    def stop(self) -> None:
        """Stop now (Ctrl-C, SIGTERM): the units in flight are ended with their workers
        (a unit is all or nothing: a rerun trains it again), none is started or retried."""
        with self._lock:
            self._stopped = True
            pool, self._pool = self._pool, None
        if pool is not None:
            for worker in list((pool._processes or {}).values()):  # no public way before Python 3.14
                worker.terminate()
            pool.shutdown(wait=True, cancel_futures=True)
        self._temp.close()

    def __enter__(self) -> UnitPool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None or issubclass(exc_type, Exception):  # a failure waits for the units in flight
            self.close()
        else:  # Ctrl-C, SIGTERM (Terminated, Prefect's TerminationSignal): BaseExceptions
            self.stop()


def worker_count(cfg: FinetuneConfig, n_jobs: int, gpus: int, cpus: int | None = None) -> int:
    """No more workers than jobs: on CPU `cfg.concurrency`; with `gpus` GPUs `cfg.units_per_gpu`
    per GPU, and no more than the CPU cores (each worker's Python and data need one)."""
    if gpus:
        want = min(gpus * cfg.units_per_gpu, cpus or os.cpu_count() or 1)
    else:
        want = cfg.concurrency
    return max(1, min(want, n_jobs))


def unit_threads(cfg: FinetuneConfig, workers: int, gpus: int) -> int:
    """Torch threads of each unit's worker: `cfg.threads`, else 1 on CPU (a unit's float sums, so
    its scores, are then the same on any machine and at any concurrency: its key holds no thread
    count), and on a GPU machine, where they only feed the GPU, the cores shared among the workers."""
    if cfg.threads is not None:
        return cfg.threads
    return max(1, (os.cpu_count() or 1) // workers) if gpus else 1


def run(
    cfg: FinetuneConfig,
    jobs: list[Job],
    *,
    data_root: str | None = None,
    wandb: WandbTarget | None = None,
    on_result: Callable[[Job, dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run `jobs` in a `UnitPool`; results in job order, as each finishes also passed to `on_result`."""
    results: list[dict[str, Any]] = [{}] * len(jobs)
    with UnitPool(cfg, len(jobs), data_root=data_root, wandb=wandb) as pool:
        # one thread per worker, each waiting on its unit: units start in job order, as before
        threads = ThreadPoolExecutor(max_workers=pool.workers)
        try:
            pending = {threads.submit(pool.run, job): i for i, job in enumerate(jobs)}
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    i = pending.pop(future)
                    results[i] = future.result()
                    if on_result is not None:
                        on_result(jobs[i], results[i])
        except BaseException as exc:
            if not isinstance(exc, Exception):  # Ctrl-C, SIGTERM: the threads wait on units stopped now
                pool.stop()
            raise
        finally:
            threads.shutdown(wait=True, cancel_futures=True)
    return results


def _init_worker(parent: int, threads: int, devices: Any, temp_dir: str) -> None:
    tempfile.tempdir, os.environ["TMPDIR"] = temp_dir, temp_dir  # the pool's (UnitPool)
    watch_parent(parent, lambda: os._exit(1))  # a killed command leaves no worker training on
    survive_a_lost_reader()  # the command's output, inherited: `bertflow run | tee`, tee gone
    import torch

    torch.set_num_threads(threads)
    if devices is not None:
        torch.cuda.set_device(devices.get())


def _run_job(cfg: FinetuneConfig, job: Job, data_root: str | None, wandb: WandbTarget) -> dict[str, Any]:
    """In a worker. Never raises: a failure becomes a result with an `error` key."""
    try:
        return run_finetune_unit(cfg, job, data_root, wandb)
    except UserError as exc:
        return failed_result(job, str(exc), bad_input=True)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # a bug or a crash in one unit (a Rust panic too) must not stop the others
        traceback.print_exc()
        return failed_result(job, f"{type(exc).__name__}: {exc} (traceback above)")
