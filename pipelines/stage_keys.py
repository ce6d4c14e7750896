"""Where each stage's output goes for a config: `run_dir/<stage>/<key>/`.

A stage's key is a short hash of everything that determines its output: its own config section
(plus the `model:` section where the model is built), the keys of the stages it reads from, and
fingerprints of the files it reads (corpus files by label, size and sha256, so a corpus copied
again, touched, or moved to another folder keeps its key; the label is the path relative to the
files' common folder, which names their documents; see common/fingerprint.py). Settings that say how a stage runs, not what
it produces (`Section.run_only`: workers, logging and checkpoint cadence, ports, the data cache's
place), are not in it: a pretraining killed after hours resumes under a new port or timeout, and a
finished one is found again. Change anything else and the key changes,
so the stage (and only the stages downstream of it) recompute; change nothing and every completed
stage is found again. A stage directory is complete when its `_COMPLETE.json` marker exists (the
marker is written last, so a killed run never looks finished).

The code is not in the key (an upgrade must not cost an hour of pretraining, nor a killed run its
progress), but every marker records the digests of the code that made the output (`STAGE_CODE`),
and reusing an output that other code made is said out loud (`code_change_note`), in the log, the
flow's summary and the report.

The flow AND the single-stage commands (`bertflow pretrain CONFIG`, ...) call `stage_dir` so a stage
run alone writes exactly where the flow would look for it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common.atomic import MARKER_NAME, atomic_write_json, read_marker
from common.errors import UserError
from common.fingerprint import KEY_LENGTH, content_digest, content_stamp, digest, model_dir_stamp
from common.paths import PROJECT_ROOT
from common.settings import Section
from common.stage_output import PHASE_MARK, STAGES, base_stage, has_model
from common.version import changed_sources, source_digests
from finetuning.config import UNIT_CODE
from pipelines.config import PipelineConfig
from preprocessing.corpus import file_labels, match_inputs

# The code that determines each stage's output (globs under the project root), recorded in its marker.
STAGE_CODE: dict[str, tuple[str, ...]] = {
    "verify": ("pipelines/verify_data.py",),
    "tokenizer": ("preprocessing/corpus.py", "preprocessing/wordpiece.py", "pipelines/stage_tokenizer.py"),
    "preprocess": ("preprocessing/*.py", "pipelines/stage_preprocess.py"),
    "pretrain": ("model/*.py", "training/*.py", "pipelines/stage_pretrain.py", "pipelines/pretrain_card.py"),
    "finetune": UNIT_CODE,  # the scorecard and every fine-tuning unit
    # and the modules whose text and figures the page renders (the scorecard's headline and tables,
    # the model card's held-out figures): the flow's end summary renders them anew from this code
    "report": (
        "pipelines/report_*.py",
        "pipelines/stage_report.py",
        "finetuning/scorecard.py",
        "model/model_card.py",
        "pipelines/pretrain_card.py",
    ),
}


def stage_code(stage: str) -> dict[str, str]:
    """What a stage's marker records as `code`: file → digest of the code that made the output
    (a phase's stage, pretrain@NAME: the pretrain stage's)."""
    return source_digests(STAGE_CODE[base_stage(stage)])


def code_change_note(
    stage: str,
    out_dirs: Sequence[str | os.PathLike],
    read: Callable[[Any], dict[str, Any] | None] = read_marker,
    cfg: PipelineConfig | None = None,
    own_output: str | os.PathLike | None = None,
) -> str:
    """'' when every complete output in `out_dirs` (a stage directory, or fine-tuning units) was made
    by this code, else one line saying which were made by other code, which files differ, and how
    to recompute them: in a stage command's `--output` (`own_output`, the user's folder, which no
    flow writes), by deleting it and running the command again; else the flow command of `cfg`,
    the config whose outputs they are (None: one with CONFIG for its file). `read`: how to read an
    output's marker (None: not complete)."""
    current = stage_code(stage)
    markers = [m for m in map(read, out_dirs) if m is not None]
    # per complete output: the files changed since it was made, or None when it recorded no code
    differences = [changed_sources(m["code"], current) if "code" in m else None for m in markers]
    stale = [d for d in differences if d != []]
    if not stale:
        return ""
    files = sorted({f for d in stale if d for f in d})
    made_by = "a bertflow that did not record its code"
    if files:
        shown = ", ".join(files[:4]) + (f" and {len(files) - 4} more" if len(files) > 4 else "")
        made_by = f"other code (changed since: {shown}{'; some by ' + made_by if None in stale else ''})"
    what = str(out_dirs[0]) if len(out_dirs) == 1 else f"{len(stale)} of {len(markers)} complete outputs"
    # a phase's stage (pretrain@NAME) is forced as its stage: `--force` takes no phase
    rerun = (
        f"delete {own_output} and run this command again"
        if own_output is not None
        else (cfg or PipelineConfig()).command_line("run", "--force", base_stage(stage))
    )
    return f"{stage}: reusing {what} made by {made_by}; to recompute with this code: {rerun}"


def corpus_stamps(cfg: PipelineConfig, patterns: list[str], *, earlier: bool = False) -> list[dict[str, Any]]:
    """Size and sha256 of each file the corpus entries name, under its label (its path relative to
    the files' common folder, which names its documents and the shards' manifest: a corpus moved
    or mounted elsewhere keeps its keys; `earlier`: the absolute path), plus one `missing` entry
    per entry naming none."""
    files, unmatched = match_inputs(patterns, cfg.data_root)
    labels = file_labels(files)
    stamps = [{**content_stamp(p), **({} if earlier else {"path": labels[p]})} for p in files]
    return stamps + [{"path": str(cfg.data_path(p)), "missing": True} for p in unmatched]


def _config_file_digest(path: str | None) -> str | None:
    """Small config files (DeepSpeed JSON, task YAML, hostfile) enter a key by content; a relative
    path that does not exist here is looked up in the project."""
    if path is None:
        return None
    p = Path(path)
    if not p.is_absolute() and not p.exists():
        p = PROJECT_ROOT / p
    return content_digest(p) if p.is_file() else f"missing:{path}"


def _hostfile_ranks(path: str) -> dict[str, Any]:
    """What a hostfile decides about the weights: the number of ranks (its slots)."""
    from training.launch import hostfile_slots

    return {"slots": hostfile_slots(Path(path))} if Path(path).is_file() else {"missing": path}


def _checksum_file_digest(cfg: PipelineConfig) -> str:
    from common.paths import resolve_data_path

    path = resolve_data_path(cfg.verify.checksum_file, cfg.data_root)
    return content_digest(path) if path.is_file() else f"missing:{path}"


def _task_stamps(cfg: PipelineConfig) -> dict[str, Any]:
    """Each configured task's definition and data files (`finetuning.tasks.task_data`); a task
    that does not exist is left for the fine-tuning stage to name."""
    from common.errors import UserError
    from finetuning.tasks import get_task, task_data

    stamps: dict[str, Any] = {}
    for name in cfg.finetune.tasks:
        try:
            spec = get_task(name, cfg.finetune.task_config)
        except UserError:
            stamps[name] = None
            continue
        stamps[name] = {
            "task": spec.model_dump(mode="json", exclude={"source"}),
            "data": task_data(spec, cfg.data_root),
        }
    return stamps


# run-only settings added since 2026-11-25, when they left the keys: no earlier key holds them
RUN_ONLY_SINCE = ("stop_grace_s",)


def stage_key_inputs(
    cfg: PipelineConfig, *, earlier: bool = False, hostfile_by_file: bool = False
) -> dict[str, dict[str, Any]]:
    """What each stage's key is a hash of (written next to the outputs as `stage_key.json`): each
    section without its run-only settings (`Section.run_only`: workers, logging cadence, ports...),
    so changing one of those finds the same output, and the corpus files by label and content.
    `earlier`: the inputs as bertflow hashed them before 2026-11-25, with the run-only settings and
    the corpus files' absolute paths, to find the outputs it made (`stage_dirs`). A pretraining
    hostfile enters by the ranks it gives, not by its path and hosts (a run requeued on other nodes
    is the same run); `hostfile_by_file` (and `earlier`): by path and content, as before 2026-11-27."""

    def settings(section: Section) -> dict[str, Any]:
        if earlier:
            return section.settings_without(RUN_ONLY_SINCE)
        return section.output_settings()

    tok = {
        "stage": "tokenizer",
        "config": settings(cfg.tokenizer),
        "inputs": corpus_stamps(cfg, cfg.tokenizer.input, earlier=earlier),
        "vocab": content_stamp(cfg.data_path(cfg.tokenizer.vocab)) if cfg.tokenizer.vocab else None,
    }
    tok_key = digest(tok, KEY_LENGTH)
    phases = _phase_key_inputs(cfg, settings, tok_key, earlier=earlier, hostfile_by_file=hostfile_by_file)
    pre_key = digest(phases["pretrain"], KEY_LENGTH)  # the main phase's
    fin = {
        "stage": "finetune",
        "config": settings(cfg.finetune),
        "task_config": _config_file_digest(cfg.finetune.task_config),
        "model": settings(cfg.model),
        "data_root": str(cfg.resolved_data_root()),
        "pretrain": pre_key,
        "tokenizer": tok_key,
        # the tasks' definitions and data, as the units' keys hold them (since 2026-11-27: an edited
        # task file retrained the units but reused the scorecard that came before)
        **({} if earlier else {"tasks": _task_stamps(cfg)}),
    }
    fin_key = digest(fin, KEY_LENGTH)
    rep = {
        "stage": "report",
        "config": settings(cfg.report),
        "pretrain": pre_key,
        "finetune": fin_key,
    }
    verify = _verify_key_inputs(cfg, settings, tok, phases, fin, earlier=earlier)
    return {"verify": verify, "tokenizer": tok, **phases, "finetune": fin, "report": rep}


def _phase_key_inputs(
    cfg: PipelineConfig,
    settings: Callable[[Section], dict[str, Any]],
    tok_key: str,
    *,
    earlier: bool,
    hostfile_by_file: bool,
) -> dict[str, dict[str, Any]]:
    """The key inputs of each pretraining phase's preprocess@NAME and pretrain@NAME, in order, the
    main phase's last (as preprocess and pretrain). The first phase starts from init_from's model
    (by content), each later one from the one before."""
    phases: dict[str, dict[str, Any]] = {}
    init_from = model_dir_stamp(cfg.pretrain.init_from) if cfg.pretrain.init_from else None
    for index, name in enumerate(phase_names(cfg)):
        phase = cfg.phase_config(index)
        prep = {
            "stage": "preprocess",
            "config": settings(phase.preprocess),
            "inputs": corpus_stamps(cfg, phase.preprocess.input, earlier=earlier),
            "tokenizer": tok_key,
        }
        prep_key = digest(prep, KEY_LENGTH)
        hostfile, by_file = phase.pretrain.hostfile, earlier or hostfile_by_file
        pre = {
            "stage": "pretrain",
            "config": {
                **settings(phase.pretrain),
                **({"hostfile": None} if hostfile and not by_file else {}),
            },
            "model": settings(cfg.model),
            "deepspeed_config": _config_file_digest(phase.pretrain.deepspeed_config),
            "hostfile": _config_file_digest(hostfile)
            if by_file or not hostfile
            else _hostfile_ranks(hostfile),
            "init_from": init_from,
            "preprocess": prep_key,
            "tokenizer": tok_key,
        }
        pre_key = digest(pre, KEY_LENGTH)
        phases[phase_stage("preprocess", name)], phases[phase_stage("pretrain", name)] = prep, pre
        init_from = {"phase": name, "pretrain": pre_key}
    return phases


def _verify_key_inputs(
    cfg: PipelineConfig,
    settings: Callable[[Section], dict[str, Any]],
    tok: dict[str, Any],
    phases: dict[str, dict[str, Any]],
    fin: dict[str, Any],
    *,
    earlier: bool,
) -> dict[str, Any]:
    """The verify stage's key inputs: the files every other stage reads (corpus, tasks' data) by
    content, and the checksums they are verified against."""
    return {
        "stage": "verify",
        "config": settings(cfg.verify),
        "tokenizer": tok["inputs"],
        "preprocess": phases["preprocess"]["inputs"],
        **(
            {"phases": [phases[phase_stage("preprocess", n)]["inputs"] for n in phase_names(cfg)[:-1]]}
            if cfg.phases
            else {}
        ),
        # the tasks' data by content, and the checksums they are verified against: a task file
        # damaged after a verified run was not verified again, and its units trained on it
        "tasks": cfg.finetune.tasks if earlier else fin["tasks"],
        **({} if earlier or not cfg.verify.checksums else {"checksum_file": _checksum_file_digest(cfg)}),
        "task_config": fin["task_config"],
        "data_root": str(cfg.resolved_data_root()),
    }


def phase_names(cfg: PipelineConfig) -> list[str]:
    """The pretraining phases in order: each of `phases` by name, then the main one ('')."""
    return [phase.name for phase in cfg.phases] + [""]


def phase_stage(stage: str, phase: str) -> str:
    """The flow's name of a phase's preprocess or pretrain stage (the main phase's: the stage's)."""
    return f"{stage}{PHASE_MARK}{phase}" if phase else stage


def with_phase_init(cfg: PipelineConfig) -> PipelineConfig:
    """`cfg` with `pretrain.init_from` the model of the phase before its main one (unchanged when it
    has no phases): what the pretrain stage starts from. A UserError naming that phase while it
    has no model."""
    if not cfg.phases:
        return cfg
    name = cfg.phases[-1].name
    previous = stage_dirs(cfg.phase_config(len(cfg.phases) - 1))["pretrain"] / "model"
    if not (previous.parent / MARKER_NAME).is_file():
        raise UserError(
            f"this pretraining starts from the model of phase {name!r}, which has none yet ({previous}).",
            fix=f"run that phase first: `{cfg.command_line('pretrain', '--phase', name)}` (after "
            f"`{cfg.command_line('preprocess', '--phase', name)}`), or the whole flow: `{cfg.command_line('run')}`.",
        )
    return cfg.model_copy(update={"pretrain": cfg.pretrain.model_copy(update={"init_from": str(previous)})})


def stage_keys(
    cfg: PipelineConfig, *, earlier: bool = False, hostfile_by_file: bool = False
) -> dict[str, str]:
    """stage name → key, for every stage in `STAGES` (`earlier`, `hostfile_by_file`: see
    `stage_key_inputs`)."""
    inputs = stage_key_inputs(cfg, earlier=earlier, hostfile_by_file=hostfile_by_file)
    return {stage: digest(stage_inputs, KEY_LENGTH) for stage, stage_inputs in inputs.items()}


def run_root(cfg: PipelineConfig) -> Path:
    """The run directory (relative paths are relative to the current directory)."""
    return Path(cfg.run_dir).expanduser().resolve()


def write_stage_key(out: Path, inputs: dict[str, Any]) -> None:
    """`out/stage_key.json`: what the output's key hashes (`stage_key_inputs`), written by the flow
    before each stage and by a stage command that wrote where the flow looks. Not into an output
    found under an earlier release's key (`stage_dirs`), which these inputs do not name."""
    if Path(out).name == digest(inputs, KEY_LENGTH):
        atomic_write_json(Path(out) / "stage_key.json", inputs)


def stage_dir(cfg: PipelineConfig, stage: str) -> Path:
    """THE output directory of `stage` for this config (see `stage_dirs`)."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
    return stage_dirs(cfg)[stage]


def stage_dirs(cfg: PipelineConfig) -> dict[str, Path]:
    """stage → `run_dir/<stage>/<key>/` (a phase's stage, pretrain@NAME: `run_dir/pretrain/<key>/`).
    Where no output has that key yet but one made by an earlier bertflow has (same config and
    corpus, the key computed as then: before 2026-11-25, or the shipped configs' ranks and batch
    split as they spelled them out before 2026-11-26), that one: an upgrade must not cost a
    finished or half-done pretraining."""
    root = run_root(cfg)
    dirs = {stage: root / base_stage(stage) / key for stage, key in stage_keys(cfg).items()}
    if all(d.exists() or not d.parent.is_dir() for d in dirs.values()):
        return dirs  # nothing an earlier output could be: no second round of corpus stamps
    earlier = [stage_keys(cfg, earlier=True)]
    if (
        any(cfg.phase_section(i, "pretrain").hostfile for i in range(len(cfg.phases)))
        or cfg.pretrain.hostfile
    ):
        earlier.append(stage_keys(cfg, hostfile_by_file=True))
    earlier += [
        stage_keys(config, earlier=when) for config in explicit_layouts(cfg) for when in (False, True)
    ]
    for stage, current in dirs.items():
        found = [d for keys in earlier if (d := root / base_stage(stage) / keys[stage]).is_dir()]
        if found and not current.exists():
            dirs[stage] = found[0]
    return dirs


# GPUs under which `training/ranks.py` gives the ranks and batch split that the shipped configs
# spelled out before `num_processes: auto` and `global_batch_size` (2026-11-26): 2 CPU ranks
# (default.yaml, cpu-hour.yaml) and 8 GPUs (bert-base-gpu.yaml, bert-large-gpu.yaml)
LAYOUTS_BEFORE_AUTO = (0, 8)


def explicit_layouts(cfg: PipelineConfig) -> list[PipelineConfig]:
    """When a pretraining phase of `cfg` says `num_processes: auto` or a `global_batch_size`: `cfg`
    with every phase's ranks and batch split written out, for each of `LAYOUTS_BEFORE_AUTO`."""
    sections = [cfg.phase_section(i, "pretrain") for i in range(len(cfg.phases))] + [cfg.pretrain]
    if not any(p.derived_layout for p in sections):
        return []
    from training.ranks import resolve_ranks

    def explicit(pretrain: Section, gpus: int) -> dict[str, Any]:
        p = resolve_ranks(pretrain, gpus)
        layout = ("num_processes", "micro_batch_size", "gradient_accumulation_steps")
        return {**{name: getattr(p, name) for name in layout}, "global_batch_size": None}

    configs = []
    for gpus in LAYOUTS_BEFORE_AUTO:
        try:
            phases = [
                ph.model_copy(update={"pretrain": {**ph.pretrain, **explicit(sections[i], gpus)}})
                for i, ph in enumerate(cfg.phases)
            ]
            main = cfg.pretrain.model_copy(update=explicit(cfg.pretrain, gpus))
        except UserError:
            continue  # a global batch these ranks cannot share: no such earlier output
        configs.append(cfg.model_copy(update={"pretrain": main, "phases": phases}))
    return configs


def is_complete(directory: str | os.PathLike) -> bool:
    return read_marker(directory) is not None


def complete(stage: str, out: Path) -> bool:
    """A stage output the flow reuses: marked complete, and for pretraining with its model (a
    deleted model/ is written again from the last checkpoint, `run_pretrain_stage`)."""
    return is_complete(out) and (base_stage(stage) != "pretrain" or has_model(out))


def flow_input(cfg: PipelineConfig, directory: Path, stage: str, flag: str) -> Path:
    """A stage command's default input: the flow's output of `stage` for its config `cfg`, which must
    be complete (a UserError says how to make it, or which flag names another)."""
    if not is_complete(directory):
        raise UserError(
            f"the flow has no complete {stage} output for this config ({directory}).",
            fix=f"run `{cfg.command_line('run', '--only', stage)}` (or the stages before it) first, "
            f"or pass {flag} DIR.",
        )
    return directory
