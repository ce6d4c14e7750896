"""How the flow runs one stage: selection (`--only`, `--from`, `--force`), cache options, upstream
outputs, and the record of what happened.

`FlowRun.stage(name, task, upstream=[...])` runs a selected stage's task, passing it the outputs of
the stages it reads: the Prefect state of an upstream task run of this flow run (Prefect resolves
it to the task's return value and records the edge in the task run's `task_inputs`), or, for an
upstream stage this flow run does not execute, its complete output on disk (`stage_plan.flow_inputs`
says which stage reads which; a flow run missing one is refused before it starts, naming them
all). `FlowRun.fan_out` maps one Prefect task over the fine-tuning plan with at most the unit
pool's workers in flight (`finetuning.fanout.worker_count`).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect import get_run_logger
from prefect.futures import as_completed, wait
from prefect.states import State

from common.atomic import MARKER_NAME, read_marker, refuse_other_writer
from common.errors import UserError, stop_request
from common.stage_output import STAGES
from common.tracking import WandbTarget
from pipelines.config import PipelineConfig
from pipelines.flow_records import failed_record, stage_record, write_record
from pipelines.key_change import key_change_note
from pipelines.prefect_killed_runs import RECORDED
from pipelines.run_history import update_latest
from pipelines.stage_keys import (
    base_stage,
    code_change_note,
    complete,
    run_root,
    stage_dirs,
    stage_key_inputs,
    write_stage_key,
)
from pipelines.stage_plan import SUMMARY_STAGES, plan_stages, refuse_missing_inputs, selection_flags


def clear(directory: Path) -> None:
    """Forget a stage output: marker first (a kill midway leaves it incomplete), then the rest;
    refused while another live process writes it (`--force` must not delete a running pretraining)."""
    refuse_other_writer(directory)
    (directory / MARKER_NAME).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


def value_of(output: Any) -> Any:
    """An upstream output as its task's return value (a state's result, or the on-disk dict)."""
    return output.result() if isinstance(output, State) else output


class UnitsFailed(UserError):
    """Fine-tuning units failed in a flow run: the CLI says which, as one paragraph; exit 2 when every
    one failed on bad input (a rerun as it is fails again), else 1, as `bertflow finetune` exits."""

    def __init__(self, failed: list[dict[str, Any]], total: int) -> None:
        self.failed, self.total = failed, total
        self.exit_code = 2 if all(u["bad_input"] for u in failed) else 1
        lines = [
            f"- {u['unit']} [{u['checkpoint']}] (its folder {u['out_dir']}): {u['error']}" for u in failed
        ]
        kept = "; the other units are complete and kept" if len(failed) < total else ""
        super().__init__(
            f"{len(failed)} of {total} fine-tuning units failed (the lines of their task runs above are "
            f"their logs{kept}):\n" + "\n".join(lines) + f"\nFix: {UNITS_FIX}"
        )

    def record_row(self, row: dict[str, Any]) -> dict[str, Any]:
        """The `finetune-units` row of the flow-run record: the count and the fix as its error, and
        one entry per failed unit (its error's first line), which `bertflow runs show` lists."""
        first_lines = [{**u, "error": (u["error"].strip().splitlines() or [""])[0]} for u in self.failed]
        error = f"{len(self.failed)} of {self.total} fine-tuning units failed. Fix: {UNITS_FIX}"
        return {**row, "error": error, "failed_units": first_lines}


UNITS_FIX = "fix what each error names, then rerun the same command: it runs only the failed units again."


def failed_units(jobs: list[Any], futures: list[Any]) -> list[dict[str, Any]]:
    """The units whose task runs failed (each after its retries): name, checkpoint label, what the
    error says (its task's prefix off, its first 500 characters), folder, and whether it was bad
    input (a UserError: not retried, and a rerun as it is fails again)."""
    failed = []
    for job, future in zip(jobs, futures, strict=True):
        if not future.state.is_completed():
            error = future.state.result(raise_on_failure=False)
            said = str(error).removeprefix(f"fine-tuning unit {job.name} failed: ") or future.state.name
            failed.append(
                {"unit": job.unit.name, "checkpoint": job.label, "error": said[:500], "out_dir": str(job.out_dir),
                 "bad_input": isinstance(error, UserError)}
            )  # fmt: skip
    return failed


class FlowRun:
    def __init__(
        self,
        cfg: PipelineConfig,
        run_name: str,
        only: str | list[str] | None,
        from_stage: str | None,
        force: list[str] | None,
        flow_run_id: str | None = None,
    ) -> None:
        self.cfg, self.run_name, self.flow_run_id = cfg, run_name, flow_run_id
        self.selected, self.forced = plan_stages(only, from_stage, force)
        # the command of these settings (a deployment's flow run: the one that runs the same)
        self.command = cfg.command_line("run", *selection_flags(only, from_stage, force))
        self.only = [only] if isinstance(only, str) else list(only or [])
        self.group = f"{cfg.name}-{run_name}"
        self.wandb: WandbTarget = cfg.wandb.target(self.group)  # every W&B run of this flow run
        self.dirs = stage_dirs(cfg)
        # before any record (`bertflow run`'s preflight refuses it before Prefect starts)
        refuse_missing_inputs(cfg, self.selected, self.dirs)
        self.root = run_root(cfg)
        self.outputs: dict[str, Any] = {}  # stage -> State (ran in this flow run) or list of futures
        self.records: list[dict[str, Any]] = []
        self.started = time.time()
        self.record_path: Path | None = None
        self.status = "running"
        self.stopped_by: str | None = None
        self.unit_dirs: list[str] = []
        self.made_here: set[str] = set()  # the outputs this flow run computed (not cached, not reused)
        self.noted: set[str] = set()  # the stages whose key change this flow run has said

    def task_run_ids(self) -> list[str]:
        """The task runs this flow run has made so far: one per stage that ran, one per unit."""
        ids: list[str] = []
        for output in self.outputs.values():
            if isinstance(output, State):
                ids.append(str(output.state_details.task_run_id))
            else:  # the fine-tuning units' futures
                ids += [str(future.task_run_id) for future in output]
        return ids

    def wanted(self, stage: str) -> bool:
        """Whether this flow run executes `stage` (a phase's stages go with their stage's name)."""
        return base_stage(stage) in self.selected

    def upstream(self, stage: str) -> Any:
        """The output of `stage` for a downstream task: this flow run's, else the one on disk."""
        if stage in self.outputs:
            return self.outputs[stage]
        out = self.dirs[stage]
        if not complete(stage, out):  # it was when the flow run started (`__init__`): since deleted
            refuse_missing_inputs(self.cfg, self.selected, self.dirs)
        self._code_note(stage, [out])
        return {"stage": stage, "out_dir": str(out), "status": "reused", "seconds": 0.0, "result": {}}

    def _options(self, complete: bool) -> dict[str, Any]:
        return dict(
            refresh_cache=not complete,
            retries=self.cfg.flow.retries,
            retry_delay_seconds=self.cfg.flow.retry_delay_seconds,
        )

    def stage(
        self,
        name: str,
        task_fn: Any,
        *,
        upstream: tuple[str, ...] | dict[str, str] = (),
        after: tuple[str, ...] = (),
        **params: Any,
    ) -> None:
        """Run stage `name` when selected. `upstream`: stages whose outputs the task takes (as
        parameters of the same names, or parameter → stage, for a phase's stages); `after`: stages
        it only follows when they ran here."""
        if not self.wanted(name):
            return
        pairs = list(upstream.items() if isinstance(upstream, dict) else ((s, s) for s in upstream))
        inputs = {param: self.upstream(stage) for param, stage in pairs}
        out = self.dirs[name]
        inputs_made_here = any(stage in self.made_here for _, stage in pairs)
        if (
            base_stage(name) in self.forced
            or (name in SUMMARY_STAGES and inputs_made_here)
            or built_alone(name, out)
        ):
            clear(out)
        elif read_marker(out) is not None and not complete(name, out):  # the stage resumes and exports it
            (out / MARKER_NAME).unlink()
        key_inputs = stage_key_inputs(self.cfg)[name]
        if not complete(name, out):  # finetune's was said by fan_out, before its units
            self._key_change_note(name, out, key_inputs)
        out.mkdir(parents=True, exist_ok=True)
        write_stage_key(out, key_inputs)
        wait_for = [self.outputs[s] for s in after if s in self.outputs]
        options = self._options(read_marker(out) is not None)
        with self._row(name, out) as t0:
            state = task_fn.with_options(task_run_name=name, **options)(
                stage=name, out_dir=str(out), **inputs, **params, wait_for=wait_for, return_state=True
            )
            value = state.result()  # raises the stage's exception if it failed (after retries)
        status = "reused" if value.get("status") == "reused" else _cache_status(state)
        if status == "ran":
            self.made_here.add(name)
        elif base_stage(name) == "pretrain":
            self._unapplied_note(name, out, params["cfg"])
        self.records[-1] = stage_record(
            name,
            out,
            status,
            time.time() - t0,
            float(value.get("seconds", 0.0)),
            self._code_note(name, [out]),
        )
        self.outputs[name] = state
        self.write_record()

    def _key_change_note(self, stage: str, out: Path, key_inputs: dict[str, Any]) -> None:
        """Say why `stage` computes again, and what the last flow run of this config left under the
        old key (a warning when that is progress only the old settings resume); once a flow run."""
        if stage in self.noted:
            return
        self.noted.add(stage)
        phase = stage.partition("@")[2]
        own = next((ph for ph in self.cfg.phases if ph.name == phase), None)
        phase_own = set(getattr(own, base_stage(stage))) if own is not None else None
        note, lost = key_change_note(self.root, self.cfg.name, stage, out, key_inputs, phase_own)
        if note:
            get_run_logger().log(logging.WARNING if lost else logging.INFO, note)

    def _unapplied_note(self, stage: str, out: Path, cfg: PipelineConfig) -> None:
        """Say which of this run's pretrain settings a reused finished pretraining does not have."""
        from pipelines.stage_pretrain import force_pretrain_fix, unapplied_settings_note

        if note := unapplied_settings_note(stage, out, cfg.pretrain, force_pretrain_fix(self.cfg, stage)):
            get_run_logger().warning(note)

    def _code_note(self, stage: str, out_dirs: list[Path]) -> str:
        """The warning when complete outputs this run reuses were made by other code ('' if none)."""
        note = code_change_note(stage, out_dirs, cfg=self.cfg)
        if note:
            get_run_logger().warning(note)
        return note

    def fan_out(self, task_fn: Any, *, upstream: dict[str, str]) -> None:
        """One task per fine-tuning unit of the flow's plan (`units` output: their futures);
        `upstream`: the stages of its pretraining and tokenizer (`flow_inputs`)."""
        if not self.wanted("finetune"):
            return
        from finetuning import keep
        from finetuning.fanout import UnitPool

        pretrain, tokenizer = self.upstream(upstream["pretrain"]), self.upstream(upstream["tokenizer"])
        if not complete("finetune", out := self.dirs["finetune"]):  # why the units train again
            self._key_change_note("finetune", out, stage_key_inputs(self.cfg)["finetune"])
        jobs, copied = self._prepare_units(pretrain, tokenizer)
        wait_for = [o for o in (pretrain, tokenizer) if isinstance(o, State)]
        complete_before = [keep.unit_complete(job) for job in jobs]
        with self._row("finetune-units", self.root / "finetune" / "units", key="-") as t0:
            with UnitPool(
                self.cfg.finetune, len(jobs), data_root=self.cfg.data_root, wandb=self.wandb
            ) as pool:
                first = self._submit_bounded(task_fn, jobs, complete_before, pool, wait_for)
                futures = self._keep_models(task_fn, jobs, first, pool, wait_for)
            if failed := failed_units(jobs, futures):
                raise UnitsFailed(failed, len(futures))
        # a unit trained again for its model ran here
        complete_before = [
            done and f is f0 for done, f, f0 in zip(complete_before, futures, first, strict=True)
        ]
        self._record_units(jobs, futures, complete_before, copied, t0)
        self.outputs["units"] = futures
        self._log_kept_models(jobs)

    def _prepare_units(self, pretrain: Any, tokenizer: Any) -> tuple[list[Any], int]:
        """The plan's units (recorded before they are used), with its warnings said and, under
        `--force finetune`, their outputs cleared; returns them and how many random-init units
        were copied from a model of the same shape."""
        from finetuning import keep
        from finetuning.fanout import (
            refuse_nonfinite_encoders,
            reuse_random_init_units,
            untrained_positions_notes,
        )
        from pipelines.stage_finetune import flow_plan

        forced = "finetune" in self.forced
        model_dir = Path(value_of(pretrain)["out_dir"]) / "model"
        jobs = keep.first_pass(
            self.cfg.finetune, flow_plan(self.cfg, model_dir, Path(value_of(tokenizer)["out_dir"]))
        )
        self.unit_dirs = [str(job.out_dir) for job in jobs]
        self.write_record()  # the units it is about to use
        # before --force clears any finished unit
        refuse_nonfinite_encoders(self.cfg.finetune, jobs, retrain=forced)
        for note in untrained_positions_notes(self.cfg.finetune, jobs):
            get_run_logger().warning(note)
        if not forced and (note := keep.retrain_note(jobs, self.cfg.finetune.save_models)):
            get_run_logger().info("finetune: %s", note)
        if forced:
            for job in jobs:
                clear(job.out_dir)
        copied = 0 if forced else reuse_random_init_units(jobs)
        return jobs, copied

    def _record_units(
        self, jobs: list[Any], futures: list[Any], complete_before: list[bool], copied: int, t0: float
    ) -> None:
        """The `finetune-units` record: how many units ran, were cached or reused, and their time
        (since `t0`)."""
        cached = [f.state.name == "Cached" for f in futures]
        reused = sum(done and not hit for done, hit in zip(complete_before, cached, strict=True))
        units_dir = self.root / "finetune" / "units"
        seconds = sum(float(f.result().get("wall_time_s", 0.0)) for f in futures)
        # ran: trained in this flow run; cached: Prefect cache hit; reused: found complete on disk
        # (written by `bertflow finetune` or an earlier flow run with other settings)
        ran = len(futures) - sum(cached) - reused
        if ran or copied:
            self.made_here.add("units")
        status = f"{ran} ran, {sum(cached)} cached"
        status += f", {reused} reused" if reused else ""
        note = self._code_note(
            "finetune", [j.out_dir for j, done in zip(jobs, complete_before, strict=True) if done]
        )
        self.records[-1] = {
            **stage_record("finetune-units", units_dir, status, time.time() - t0, seconds, note),
            "key": "-",
        }
        self.write_record()

    def _log_kept_models(self, jobs: list[Any]) -> None:
        """List the fine-tuned models the units kept (`finetune.save_models`)."""
        from finetuning import keep

        if note := keep.kept_models_note(jobs, self.cfg.finetune.save_models):
            get_run_logger().info("finetune: %s", note)

    def _keep_models(
        self, task_fn: Any, jobs: list[Any], futures: list[Any], pool: Any, wait_for: list[Any]
    ) -> list[Any]:
        """`finetune.save_models: best`, once every unit is done: the best lr's units without a
        model train again keeping it, the others' models are removed (`finetuning.keep`); returns
        the units' futures, those trained again replaced."""
        from finetuning import keep

        if self.cfg.finetune.save_models != "best" or any(not f.state.is_completed() for f in futures):
            return futures
        again = keep.to_retrain(self.cfg.finetune, jobs, [f.result() for f in futures])
        if again:
            get_run_logger().info("finetune: %s", keep.retrain_best_note(len(again)))
            redone = dict(
                zip(
                    (j.out_dir for j in again),
                    self._submit_bounded(task_fn, again, [False] * len(again), pool, wait_for),
                    strict=True,
                )
            )
            futures = [redone.get(j.out_dir, f) for j, f in zip(jobs, futures, strict=True)]
        if not any(not f.state.is_completed() for f in futures):
            if removed := keep.prune(self.cfg.finetune, jobs, [f.result() for f in futures]):
                get_run_logger().info("finetune: %s", keep.removed_note(removed))
        return futures

    def _submit_bounded(
        self, task_fn: Any, jobs: list[Any], complete: list[bool], pool: Any, wait_for: list[Any]
    ) -> list[Any]:
        """Submit with at most `pool.workers` units in flight (`complete[i]`: job i was complete on
        disk before); log each unit that trains as it finishes, with how many are left to run and
        about how long that takes at the rate so far."""
        from common.progress import Progress

        logger = get_run_logger()
        to_run = [job for job, done in zip(jobs, complete, strict=True) if not done]
        logger.info(
            "finetune: %d units, %d already complete, %d to run on %d worker(s)",
            len(jobs), len(jobs) - len(to_run), len(to_run), pool.workers,
        )  # fmt: skip
        progress = Progress(len(to_run), "units to run")
        names: dict[int, str] = {}

        def finished(future: Any) -> None:
            name = names.pop(id(future), None)
            if name is not None:
                future.wait()  # sets the final state; before that `state` asks the API, which lags
                state = "done" if future.state.is_completed() else "FAILED"
                logger.info("finetune: %s %s; %s", name, state, progress.step())

        in_flight: list[Any] = []
        futures: list[Any] = []
        for job, done in zip(jobs, complete, strict=True):
            if len(in_flight) >= pool.workers:  # bounded fan-out: wait for a free slot
                first = next(as_completed(in_flight))
                in_flight = [f for f in in_flight if f is not first]
                finished(first)
            job.out_dir.mkdir(parents=True, exist_ok=True)
            future = task_fn.with_options(**self._options(done)).submit(job=job, pool=pool, wait_for=wait_for)
            if not done:  # progress counts only the units that train here
                names[id(future)] = job.name
            in_flight.append(future)
            futures.append(future)
        for future in as_completed(futures):
            finished(future)
        wait(futures)
        return futures

    @contextmanager
    def _row(self, name: str, out: Path, **extra: str) -> Iterator[float]:
        """A stage's row while it runs (`running`: what a killed flow run was doing; yields its start
        time): failed when it raises, still `running` and `stopped` with the seconds it ran when the
        user stops it (SIGTERM, Ctrl-C). The caller replaces the row once the stage is done."""
        t0 = time.time()
        self.records.append({**stage_record(name, out, "running", 0.0, 0.0), **extra})
        self.write_record()
        try:
            yield t0
        except Exception as exc:
            row = {**failed_record(name, out, time.time() - t0, exc), **extra}
            self.records[-1] = exc.record_row(row) if isinstance(exc, UnitsFailed) else row
            raise
        except BaseException:
            self.records[-1] = {
                **stage_record(name, out, "running", time.time() - t0, 0.0),
                **extra,
                "stopped": True,
            }
            raise

    def write_record(self) -> Path:
        """What this flow run did so far, stage by stage (rewritten in place on later calls)."""
        self.record_path = write_record(
            self.root, self.run_name, self.group, self.records, self.started,
            path=self.record_path, status=self.status, units=self.unit_dirs,
            planned=[str(d) for d in self.dirs.values()], flow_run_id=self.flow_run_id,
            stopped_by=self.stopped_by, command=self.command, resume=self.resume_command(),
        )  # fmt: skip
        return self.record_path

    def resume_command(self) -> str:
        """The command that resumes this flow run where it stops: its own, less the --force (and
        --from) of the stages it has begun, which would recompute them from scratch (an interrupted
        pretraining's checkpoints deleted); a forced stage it has not begun stays forced."""
        begun = {
            "finetune" if r["stage"] == "finetune-units" else base_stage(r["stage"]) for r in self.records
        }
        force = [s for s in STAGES if s in self.forced and s not in begun]
        return self.cfg.command_line("run", *selection_flags(self.only, None, force))

    @contextmanager
    def recorded(self) -> Iterator[None]:
        """The flow run's record from its first moment (status running), then completed, failed, or
        stopped (SIGTERM, Ctrl-C: the user asked; `stopped_by` says which); on completion
        `run_dir/latest/` points at this run's outputs."""
        self.write_record()
        if self.flow_run_id:  # a stop from now on is settled by its record
            RECORDED.add(self.flow_run_id)
        try:
            yield
        except BaseException as exc:
            self.stopped_by = stop_request(exc)
            self.status = "stopped" if self.stopped_by else "failed"
            self.write_record()
            raise
        self.status = "completed"
        update_latest(self.root, self.dirs, self.write_record())


def _cache_status(state: Any) -> str:
    """Prefect state → 'cached' (Prefect skipped the task: cache hit) or 'ran'."""
    return "cached" if state.name == "Cached" else "ran"


def built_alone(name: str, out: Path) -> bool:
    """A report that `bertflow report` built outside any flow run: its page says that no flow-run
    record was found, so the flow builds it again with its own record (seconds), rather than
    present it as the flow's result."""
    return name == "report" and (read_marker(out) or {}).get("by") == "bertflow report"
