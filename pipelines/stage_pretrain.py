"""Stage 3, `bertflow pretrain`: DeepSpeed pretraining on the preprocessed shards.

    bertflow pretrain [CONFIG] --shards DIR --tokenizer DIR --output DIR [--preset tiny]
        [--zero-stage N] [--num-processes N] [--max-steps N] [--micro-batch-size N] [--set k=v]

Validates everything first (one UserError, nothing written), then launches `training.train` on
`pretrain.num_processes` ranks through the DeepSpeed launcher (or torchrun) and streams its output.
Output: OUT/checkpoints/global_stepN (last K), OUT/metrics.jsonl, OUT/wandb_files, OUT/model (HF
format), OUT/_COMPLETE.json last. Rerunning after a kill resumes from the newest verified
checkpoint; rerunning after completion does nothing.

Several nodes without a hostfile: run the same command on every node with `--node-rank R`
(0 .. pretrain.nnodes-1) and the same `pretrain.master_addr` / `master_port`; the output dir must
be one shared folder (checkpoints), the data cache may be node-local (`pretrain.data_cache_dir`).
Node 0 writes the model and the completion marker; the other nodes return once their ranks are done.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from common.atomic import MARKER_NAME, mark_in_progress, read_marker, write_marker
from common.console import warning_line
from common.dir_lock import exclusive_dir, lock_file_of
from common.errors import UserError, sigterm_as_interrupt
from common.stage_output import check_own_output, has_model, newest_verified_step, refuse_foreign_files
from common.tracking import WandbTarget
from model.config import BertConfig
from pipelines.config import PipelineConfig, bad_flag_value, flag_items, load_config, parse_overrides
from pipelines.pretrain_card import steps_before
from pipelines.stage_keys import (
    base_stage,
    code_change_note,
    flow_input,
    phase_stage,
    stage_code,
    stage_dirs,
    stage_key_inputs,
    with_phase_init,
    write_stage_key,
)
from training.ds_config import MUON_ZERO_FIX

if TYPE_CHECKING:
    from model.model_card import CardFacts, EvalFacts
    from training.config import PretrainConfig
    from training.run_spec import RunSpec

# what a pretraining run writes (or clears) in its output directory, besides its markers
OUTPUT_NAMES = (
    "run_spec.json",
    "metrics.jsonl",
    "launcher.log",
    "model",
    "checkpoints",
    "wandb_files",
    "data_cache",
)


def _device_caps() -> tuple[bool, bool]:
    import torch

    on_gpu = torch.cuda.is_available()
    return on_gpu, bool(on_gpu and torch.cuda.is_bf16_supported())


def run_pretrain_stage(
    cfg: PipelineConfig,
    shards_dir: Path,
    tokenizer_dir: Path,
    out_dir: Path,
    log_line: Callable[[str], None] = print,
    node_rank: int = 0,
    log_debug: Callable[[str], None] | None = None,
    wandb: WandbTarget | None = None,
    stage: str = "pretrain",
    announce: str | None = None,
    own_output: bool = False,
) -> Path:
    """Check everything, launch the ranks, return the model directory. The ranks' lines about the
    run go to `log_line`, DeepSpeed's and torch's talk about themselves to `log_debug` (dropped
    when None), every line to OUT/launcher.log. `wandb`: where the W&B run goes (the flow passes
    its run's group; alone, the group is `<config name>-pretrain`). `stage`: the flow's name of the
    stage (pretrain@NAME for a phase), which names the W&B run. `announce`: a line for `log_line`
    once every check has passed, as the ranks launch (none for a refusal or a finished run).
    `own_output`: `out_dir` is the user's --output, not the flow's folder of `cfg` (what a note on
    a finished run of other code says to recompute it with)."""
    from training import launch, preflight
    from training.ranks import resolve_ranks, split_text, visible_gpus

    out_dir = Path(out_dir).resolve()  # the launcher runs in the project root, not the caller's directory
    cfg = with_phase_init(cfg)  # a phase after the first starts from the one before's model
    check_own_output(out_dir, "pretrain", {"shards": shards_dir, "tokenizer": tokenizer_dir})
    refuse_a_users_folder(out_dir)
    on_gpu, bf16_ok = _device_caps()
    asked = cfg.pretrain
    p = resolve_ranks(asked, visible_gpus())
    cfg = cfg.model_copy(update={"pretrain": p})
    if asked.derived_layout:
        log_line(
            f"pretrain: {split_text(p)} (num_processes {asked.num_processes}, global_batch_size {asked.global_batch_size})"
        )
    check_nodes(cfg, node_rank)
    world = launch.world_size(p)
    wandb = wandb or cfg.wandb.target(group=f"{cfg.name}-pretrain")
    spec = preflight.build_spec(
        cfg, Path(shards_dir), Path(tokenizer_dir), out_dir, on_gpu, bf16_ok, world, wandb, stage
    )
    fingerprint = spec.fingerprint()
    rerun = {"own_output": out_dir} if own_output else {"cfg": cfg}
    if (finished := _finished_model(out_dir, spec, fingerprint, log_line, rerun)) is not None:
        return finished
    if not on_gpu and (note := cpu_run_note(cfg.model_copy(update={"pretrain": asked}))):
        log_line(warning_line(note))
    if note := preflight.resume_threads_note(spec, launch.cpu_threads_per_rank(launch.local_ranks(p, world))):
        log_line(warning_line(note))
    if p.master_port and node_rank == 0 and not p.hostfile:  # node 0's ranks listen on it
        launch.check_port_free(p.master_port)

    if announce:
        log_line(announce)
    # node 0 holds the lock of the (shared) output directory; other nodes only run ranks
    with exclusive_dir(out_dir, "pretrain") if node_rank == 0 else nullcontext():
        if node_rank == 0:  # the output's writer; other nodes' ranks only add their checkpoint shards
            mark_in_progress(out_dir)  # until _complete_output writes the marker
        spec_path = out_dir / "run_spec.json"
        spec.write(spec_path)
        started = _run_ranks(p, spec_path, world, node_rank, on_gpu, out_dir, log_line, log_debug)

        model_dir = out_dir / "model"
        if node_rank > 0:
            log_line(f"pretrain: node {node_rank} done (node 0 writes {model_dir})")
            return model_dir
        return _complete_output(out_dir, spec, p, fingerprint, started, log_line)


def _complete_output(
    out_dir: Path,
    spec: RunSpec,
    p: PretrainConfig,
    fingerprint: str,
    started: float,
    log_line: Callable[[str], None],
) -> Path:
    """Node 0, once the ranks are done: check that they wrote the model, add its model card and
    write the completion marker (last). Returns the model directory."""
    model_dir = out_dir / "model"
    if not (model_dir / "config.json").is_file() or not (model_dir / "model.safetensors").is_file():
        raise RuntimeError(f"pretraining ended without writing {model_dir}; see the log above.")
    card, facts = finish_model_dir(out_dir, seconds=time.time() - started)
    log_line(f"pretrain: model card {card}")
    if facts.evaluation is not None and (note := context_free_note(facts.evaluation)):
        log_line(warning_line(note))
    write_marker(
        out_dir,
        {
            "stage": "pretrain",
            "code": stage_code("pretrain"),
            "fingerprint": fingerprint,
            "settings": spec.settings(),
            "max_steps": p.max_steps,
            "steps_before": steps_before(p.init_from),
            "model": str(model_dir),
        },
    )
    log_line(f"pretrain: done, model at {model_dir}")
    return model_dir


def _finished_model(
    out_dir: Path, spec: RunSpec, fingerprint: str, log_line: Callable[[str], None], rerun: dict[str, Any]
) -> Path | None:
    """The model of a finished run with these settings (None: run or resume it). A finished run
    with other settings is refused; one whose model/ was deleted loses its marker, and its ranks
    resume at the end and export the model again. `rerun`: `code_change_note`'s cfg or own_output."""
    marker = read_marker(out_dir)
    if marker is None:
        return None
    if marker.get("fingerprint") != fingerprint:
        differences = spec.differences(marker["settings"]) if "settings" in marker else []
        raise UserError(
            f"{out_dir} holds a finished pretraining run with other settings"
            + (f": {'; '.join(differences)}." if differences else "."),
            fix=f"choose a new --output directory (to go on from this run's weights there, with a fresh "
            f"optimizer: --set pretrain.init_from={out_dir / 'model'}), or delete {out_dir} to retrain it "
            "with these settings.",
        )
    if has_model(out_dir):
        log_line(f"pretrain: {out_dir} is already complete (same settings); nothing to do.")
        if note := code_change_note("pretrain", [out_dir], **rerun):
            log_line(note)
        # the user's --output: delete it; the flow's folder of `cfg`: its flow command (as code_change_note)
        fix = (
            f"delete {out_dir} (or choose another --output) and run again."
            if "own_output" in rerun
            else force_pretrain_fix(rerun["cfg"])
        )
        if note := unapplied_settings_note("pretrain", out_dir, spec.pretrain, fix):
            log_line(warning_line(note))
        return out_dir / "model"
    log_line(f"pretrain: {out_dir} is complete but has no model/; writing it again from the last checkpoint.")
    (out_dir / MARKER_NAME).unlink()
    return None


def force_pretrain_fix(cfg: PipelineConfig, stage: str = "pretrain") -> str:
    """How to apply `unapplied_settings_note`'s settings to the flow's folder of `cfg`: its whole flow
    command with `--force` (a phase's stage, pretrain@NAME, is forced as its stage)."""
    return f"rerun with `{cfg.command_line('run', '--force', base_stage(stage))}` (it trains again)."


def unapplied_settings_note(stage: str, out_dir: Path, asked: PretrainConfig, fix: str) -> str:
    """The warning when a finished pretraining is reused although this run asks for other values of
    the run-only settings that show in its output (`PretrainConfig.shown_in_output`): they are not
    applied, and the reuse says so. '' when they agree (or the output has no readable run spec)."""
    try:
        made = json.loads((Path(out_dir) / "run_spec.json").read_text())["pretrain"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    changed = [
        f"pretrain.{name} {made[name]} (this run: {getattr(asked, name)})"
        for name in type(asked).shown_in_output
        if name in made and made[name] != getattr(asked, name)
    ]
    if not changed:
        return ""
    return (
        f"{stage}: reusing the finished run in {out_dir}, which was made with "
        + ", ".join(changed)
        + ". These settings are not applied to it: they change what the run logged and kept "
        "(the curve, the checkpoints), not the model, so the stage key is the same. To apply them, " + fix
    )


def _run_ranks(
    p: PretrainConfig,
    spec_path: Path,
    world: int,
    node_rank: int,
    on_gpu: bool,
    out_dir: Path,
    log_line: Callable[[str], None],
    log_debug: Callable[[str], None] | None,
) -> float:
    """This node's ranks through the launcher, their output streamed to `log_line` / `log_debug`
    and OUT/launcher.log; returns when they are done (the time.time() they started at), raises
    when they failed."""
    from pipelines.launcher_log import LauncherLog
    from training import launch

    port = p.master_port or launch.free_port()
    local = launch.local_ranks(p, world)
    hostfile = p.hostfile and str(Path(p.hostfile).resolve())
    cmd = launch.build_command(
        p.launcher, local, spec_path, port, hostfile, p.nnodes, node_rank, p.master_addr, p.dist_timeout_s
    )
    if p.nnodes > 1:
        waits = "waits for the other nodes" if node_rank == 0 else "joins node 0"
        log_line(
            f"pretrain: node {node_rank} of {p.nnodes} {waits} at {p.master_addr}:{port} "
            f"(up to pretrain.dist_timeout_s, {p.dist_timeout_s:g} s)"
        )
    if not on_gpu and (freed := launch.remove_stale_shm_buffers()):
        log_line(
            f"pretrain: removed {freed / 2**20:,.0f} MiB of shared memory that killed runs' ranks left in {launch.SHM_DIR}"
        )
    started = time.time()
    ranks = "1 rank" if local == 1 else f"{local} ranks"
    log_line(
        f"pretrain: starting {ranks}; each imports torch and DeepSpeed and reads the shards, then says 'ready to train'"
    )
    ranks_log = LauncherLog(log_line, log_debug, out_dir / "launcher.log")
    try:
        launch.run_launcher(cmd, launch.child_env(local, on_gpu, p.stop_grace_s), ranks_log, p.stop_grace_s)
    finally:
        ranks_log.close()
    return started


def refuse_a_users_folder(out_dir: Path) -> None:
    """OUT holding files of the names pretraining writes, and no sign of a run of its own (a verified
    checkpoint, its run spec: `_spec_of_a_run_here`), is the user's: refused before any work."""
    if newest_verified_step(out_dir) is None:
        own = ("run_spec.json",) if _spec_of_a_run_here(out_dir) else ()
        refuse_foreign_files(out_dir, "pretrain", OUTPUT_NAMES, own=own)


def _spec_of_a_run_here(out_dir: Path) -> bool:
    """OUT's run_spec.json is a pretraining run's: beside the lock node 0 holds while it writes OUT,
    or a run spec naming OUT itself (another node's, written before node 0 took the lock: the nodes
    start in any order). Not a spec copied in with the user's files (`{}`, or another run's)."""
    from training.run_spec import RunSpec

    if lock_file_of(out_dir).is_file():
        return True
    try:
        return RunSpec.read(out_dir / "run_spec.json").out_dir.resolve() == out_dir
    except (UserError, ValidationError, OSError):
        return False


def check_nodes(cfg: PipelineConfig, node_rank: int) -> None:
    """Multi-node and launcher settings that cannot work, refused before anything starts."""
    p = cfg.pretrain
    if p.launcher == "torchrun" and p.hostfile:
        raise UserError(
            "pretrain.hostfile needs launcher 'deepspeed'; torchrun takes --nnodes per node.",
            fix="set pretrain.launcher to deepspeed (or auto), or pretrain.nnodes with --node-rank per node.",
        )
    if p.launcher == "deepspeed" and p.nnodes > 1:
        raise UserError(
            "pretrain.nnodes > 1 starts one torchrun per node; DeepSpeed's launcher takes a hostfile instead.",
            fix="set pretrain.launcher to torchrun (or auto), or use pretrain.hostfile with nnodes 1.",
        )
    if not 0 <= node_rank < p.nnodes:
        raise UserError(
            f"--node-rank {node_rank} is outside 0..{p.nnodes - 1} (pretrain.nnodes {p.nnodes}).",
            fix="start node R of N with --node-rank R and the same pretrain.nnodes on every node.",
        )
    if p.nnodes > 1 and (p.master_addr is None or p.master_port is None):
        raise UserError(
            f"pretrain.nnodes {p.nnodes} needs pretrain.master_addr and pretrain.master_port: every node "
            "must meet node 0 at the same address.",
            fix="set both, e.g. --set pretrain.master_addr=node-001 --set pretrain.master_port=29500.",
        )
    if p.nnodes > 1 and p.hostfile:
        raise UserError(
            "pretrain.nnodes and pretrain.hostfile both describe the nodes.",
            fix="use one: a hostfile (DeepSpeed's launcher starts every node) or nnodes with --node-rank per node.",
        )


def check_pretrain_layouts(cfg: PipelineConfig) -> None:
    """Each phase's pretraining settings as its stage will resolve them on this machine, refused
    before the flow's first stage runs instead of after preprocessing: ranks and batch split (more
    ranks than GPUs, a global batch the ranks cannot share), nodes and launcher, the DeepSpeed config
    (ZeRO stage, Muon at ZeRO 1-3, precision for the device, a template contradicting the run), and
    sequences longer than the model's positions."""
    from training.ds_config import build_ds_config
    from training.launch import world_size
    from training.ranks import resolve_ranks, visible_gpus

    gpus = visible_gpus()
    on_gpu, bf16_ok = _device_caps() if gpus else (False, False)  # no torch import on a CPU machine
    for index in range(len(cfg.phases) + 1):  # the phases in order, then the main run
        phase = cfg.phase_config(index)
        try:
            p = resolve_ranks(phase.pretrain, gpus)
            check_nodes(phase.model_copy(update={"pretrain": p}), 0)
            build_ds_config(p, world_size(p), on_gpu, bf16_ok)
            check_positions(phase)
        except UserError as err:
            raise cfg.phase_error(index, err) from None


CPU_TFLOPS = 0.12  # what 2 cores sustain on the default's tiny model (its metrics' tflops, fp32)
CPU_WARN_HOURS = 24.0


def cpu_run_note(cfg: PipelineConfig) -> str:
    """The warning when no GPU is visible and the pretraining (every phase) would take more than
    `CPU_WARN_HOURS` at `CPU_TFLOPS` ('' otherwise): a GPU config run where torch sees no GPU
    (a CPU build of torch, a missing driver) would otherwise start weeks of CPU training unsaid."""
    from training.flops import step_flops
    from training.launch import world_size
    from training.ranks import CPU_RANKS, has_gpu_device, resolve_ranks, visible_gpus

    if visible_gpus():
        return ""
    flops, steps = 0.0, []
    for index in range(len(cfg.phases) + 1):
        phase = cfg.phase_config(index)
        p, seq = resolve_ranks(phase.pretrain, 0), phase.preprocess.max_seq_length
        batch = world_size(p) * p.micro_batch_size * p.gradient_accumulation_steps
        masked = batch * phase.preprocess.max_predictions_per_seq
        flops += p.max_steps * step_flops(model_shape(phase), batch, seq, masked)
        steps.append(f"{p.max_steps:,} steps of {batch:,} x {seq} tokens")
    hours = flops / (CPU_TFLOPS * 1e12) / 3600
    if hours <= CPU_WARN_HOURS:
        return ""
    took = f"{hours:,.0f} hours" if hours < 48 else f"{hours / 24:,.0f} days"
    shape = model_shape(cfg)
    if not has_gpu_device():
        why = "this machine shows no GPU device (/dev/nvidia*, /dev/kfd)"
    else:
        import torch

        why = f"this machine has GPU devices, but torch {torch.__version__} cannot use them (torch.version.cuda: {torch.version.cuda})"
    return (
        f"no GPU is visible: {why}. Pretraining would run on {CPU_RANKS} CPU ranks: "
        f"{' then '.join(steps)} of a {shape.num_hidden_layers}-layer, {shape.hidden_size}-wide BERT, "
        f"about {flops:.1e} FLOP, about {took} "
        f"at the {CPU_TFLOPS} TFLOP/s two CPU cores sustain. On a GPU machine, make torch see the GPU (a "
        "CUDA build of torch, `nvidia-smi` working); for a CPU run, lower pretrain.max_steps or model.preset."
    )


def model_shape(cfg: PipelineConfig) -> BertConfig:
    """The architecture of the model `cfg` pretrains, before its tokenizer exists: model.preset
    with model.max_position_embeddings, or pretrain.init_from's model."""
    if not cfg.pretrain.init_from:
        return BertConfig.from_preset(
            cfg.model.preset, max_position_embeddings=cfg.model.max_position_embeddings
        )
    from model.hf_io import read_config
    from training.preflight import check_init_from

    return read_config(check_init_from(cfg.pretrain.init_from))


def check_positions(cfg: PipelineConfig) -> None:
    """Preprocessed sequences no longer than the model's positions."""
    positions = model_shape(cfg).max_position_embeddings
    if cfg.preprocess.max_seq_length > positions:
        raise UserError(
            f"preprocess.max_seq_length {cfg.preprocess.max_seq_length} exceeds the model's {positions} "
            "positions (model.max_position_embeddings).",
            fix=f"set preprocess.max_seq_length to {positions} or less, or raise model.max_position_embeddings.",
        )


def finish_model_dir(out_dir: Path, seconds: float | None = None) -> tuple[Path, CardFacts]:
    """The trained model directory's last touches: `model_max_length` = the sequence length it was
    trained at, and its model card (README.md). Returns the card's path and facts."""
    from model.hf_io import set_model_max_length
    from model.model_card import write_model_card
    from pipelines.pretrain_card import pretraining_card

    facts = pretraining_card(out_dir, seconds=seconds)
    if facts.model_max_length:
        set_model_max_length(out_dir / "model", facts.model_max_length)
    return write_model_card(out_dir / "model", facts), facts


def context_free_note(e: EvalFacts) -> str | None:
    """What the stage says when its last held-out evaluation shows no use of context: a run that
    diverged (loss 7.6 -> 205, held-out 67.5) ended 'pretrain: done' with no word of it."""
    from model.model_card import context_shortfall

    _, entropy = e.loss_and_entropy  # unknown (no train split counts): nothing to say
    if not math.isfinite(entropy) or (shortfall := context_shortfall(e.metrics, e.baselines)) is None:
        return None
    return (
        f"pretrain: at step {e.step} {shortfall}: the model predicts no better than token frequencies "
        "without context (a diverged run, too high a lr, or too few steps); see metrics.jsonl and the "
        "model card."
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pipelines.config import add_set_argument

    parser.add_argument("config", nargs="?", help="pipeline YAML (optional)")
    parser.add_argument(
        "--shards",
        help="preprocess output dir (manifest.json, train/, validation/); default: the flow's for CONFIG",
    )
    parser.add_argument("--tokenizer", help="tokenizer dir with vocab.txt; default: the flow's for CONFIG")
    parser.add_argument(
        "--output", help="run dir for checkpoints, metrics and model/; default: the flow's for CONFIG"
    )
    parser.add_argument("--phase", help="pretrain this phase of the config's phases: (default: the main one)")
    parser.add_argument("--preset", help="model preset (tiny, mini, small, medium, base, large)")
    parser.add_argument(
        "--zero-stage",
        type=int,
        help="DeepSpeed ZeRO stage 0-3, overrides the JSON template (= pretrain.zero_stage)",
    )
    parser.add_argument(
        "--num-processes",
        help="ranks on this node: GPUs, or CPU processes; auto: one per GPU (= pretrain.num_processes)",
    )
    parser.add_argument("--max-steps", type=int, help="optimizer steps to train (= pretrain.max_steps)")
    parser.add_argument(
        "--micro-batch-size",
        type=int,
        help="examples per rank per forward pass (= pretrain.micro_batch_size)",
    )
    parser.add_argument("--nnodes", type=int, help="nodes in the run (each runs this command)")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's rank, 0 .. nnodes-1")
    add_set_argument(parser, dest="set")


# each flag and the setting it overrides
FLAG_KEYS = (
    ("preset", "model.preset"),
    ("zero_stage", "pretrain.zero_stage"),
    ("num_processes", "pretrain.num_processes"),
    ("max_steps", "pretrain.max_steps"),
    ("micro_batch_size", "pretrain.micro_batch_size"),
    ("nnodes", "pretrain.nnodes"),
)


# the settings of the model that --preset decides, as a refusal names them (a resume's differences)
PRESET_DECIDES = (
    "model.num_hidden_layers",
    "model.hidden_size",
    "model.num_attention_heads",
    "model.intermediate_size",
)


# a refusal's fix in the config's words, as this command's flag says it (whether typed or not)
FLAG_FIXES = {
    MUON_ZERO_FIX: "pass --zero-stage 0 (= pretrain.zero_stage), or --set pretrain.optimizer=adamw."
}


def name_the_flags(error: UserError, flags: list[tuple[str, str, Any]]) -> UserError:
    """`error` with the flags the user typed named next to the settings they gave: a refusal of
    `model.preset 'mini'` (or of the model.hidden_size its --preset decides) reads as the config's
    unless it says that here it is `--preset mini` to change or drop. A fix that sets a setting
    this command has a flag for is said as the flag (`FLAG_FIXES`), and that flag gets no note."""
    text = str(error)
    for said, as_flag in FLAG_FIXES.items():
        text = text.replace(said, as_flag)
    notes = []
    for flag, key, value in flags:
        decided = [k for k in PRESET_DECIDES if k in text] if key == "model.preset" else []
        if f"pass {flag} " in text:  # the fix says what to give it
            continue
        if key in text or decided:
            via = f", which decides {', '.join(decided)}" if decided and key not in text else ""
            notes.append(f"{key} is the `{flag} {value}` you typed{via}: change or drop {flag}")
    if not notes:
        return error if text == str(error) else UserError(text)
    return UserError(f"{text} (On this command line: {'; '.join(notes)}.)")


def flag_settings(args: argparse.Namespace) -> list[tuple[str, str, Any]]:
    """(flag, setting, value) of each flag given, `--nnodes`, `pretrain.nnodes`, 2."""
    given = [(flag, key, getattr(args, flag)) for flag, key in FLAG_KEYS]
    return [(f"--{flag.replace('_', '-')}", key, value) for flag, key, value in given if value is not None]


def check_flag_values(cfg: PipelineConfig, flags: list[tuple[str, str, Any]]) -> None:
    """Each flag's value validated as its setting of `cfg` (the config and --set, valid): a bad
    value is the flag's error, not the config file's."""
    for flag, key, value in flags:
        section, name = key.split(".", 1)
        current = getattr(cfg, section)
        try:
            type(current).model_validate(
                {**current.model_dump(), **parse_overrides(flag_items({key: value}))[section]}
            )
        except ValidationError as exc:
            raise bad_flag_value(flag, value, exc, key, getattr(current, name)) from None


def main(args: argparse.Namespace) -> int:
    flags = flag_settings(args)
    base = load_config(args.config, args.set)  # the file's and --set's own mistakes, named as theirs
    check_flag_values(base.phase_config(base.phase_index(args.phase)), flags)
    try:
        return _run(args, flags)
    except UserError as error:
        raise name_the_flags(error, flags) from None


def _run(args: argparse.Namespace, flags: list[tuple[str, str, Any]]) -> int:
    # the flags as --set items (a pretrain flag with --phase: that phase's), which its hints name
    cfg = load_config(
        args.config, [*args.set, *flag_items({key: value for _, key, value in flags}, args.phase)]
    )
    cfg = cfg.phase_config(cfg.phase_index(args.phase))
    # defaults: the directories the flow uses for this config (pipelines.stage_keys)
    flow = stage_dirs(cfg)
    tokenizer = (
        Path(args.tokenizer)
        if args.tokenizer
        else flow_input(cfg, flow["tokenizer"], "tokenizer", "--tokenizer")
    )
    shards = (
        Path(args.shards) if args.shards else flow_input(cfg, flow["preprocess"], "preprocess", "--shards")
    )
    others = [
        flag
        for flag, path, own in (
            ("--shards", shards, flow["preprocess"]),
            ("--tokenizer", tokenizer, flow["tokenizer"]),
        )
        if path.resolve() != own.resolve()
    ]
    # the flow's directory is keyed by its own inputs: it would take a model of others as its own
    if others and not args.output:
        raise UserError(
            f"{' and '.join(others)} other than the flow's for this config need --output: the flow's "
            f"pretraining directory ({flow['pretrain']}) holds the model of its own inputs, and "
            "the flow would take one trained on others as its own.",
            fix="add --output DIR.",
        )
    output = Path(args.output) if args.output else flow["pretrain"]
    announce = (  # said once the checks pass: a refused run writes no launcher.log
        f"pretrain: shards {shards}, tokenizer {tokenizer}, output {output} "
        f"(every line of the ranks, DeepSpeed's warnings included: {output / 'launcher.log'})"
    )
    # SIGTERM (a scheduler's preemption, `kill PID`): the ranks save the step they reached and exit
    # before this command does (training/stop_request.py)
    with sigterm_as_interrupt():
        stage = phase_stage("pretrain", args.phase or "")
        run_pretrain_stage(
            cfg,
            shards,
            tokenizer,
            output,
            node_rank=args.node_rank,
            stage=stage,
            announce=announce,
            own_output=bool(args.output),
        )
    if not args.output and args.node_rank == 0:
        write_stage_key(output, stage_key_inputs(cfg)["pretrain"])
    return 0
