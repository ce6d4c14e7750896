"""The flow's first step: are the configured data files there (and, optionally, intact)?

Checks every corpus entry of `tokenizer.input` / `preprocess.input`, a given `tokenizer.vocab`,
and the data of each requested fine-tuning task (read as its units will: columns, labels, SQuAD
split), before hours of compute start. With
`verify.checksums: true` it also compares each file's sha256 with the checksum file
(`../shared/data/SHA256SUMS`, `sha256sum` format). Problems are one UserError naming the key,
the path and the fix.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from common.atomic import sha256_file
from common.errors import UserError
from common.textfile import read_user_text
from pipelines.config import PipelineConfig
from preprocessing.corpus import match_inputs

log = logging.getLogger("bertflow.verify")

# Built-in fine-tuning task → the folder (under the data root) it reads.
TASK_DATA: dict[str, str] = {
    "sst2": "glue/SST-2",
    "cola": "glue/CoLA",
    "mrpc": "glue/MRPC",
    "rte": "glue/RTE",
    "stsb": "glue/STS-B",
    "wnli": "glue/WNLI",
    "squad": "squad-v1.1",
    "conll2003": "conll2003",
    "ner": "conll2003",
}


def _task_folder(task: str) -> str | None:
    return TASK_DATA.get(task.lower().replace("-", "").replace("_", ""))


def check_data_paths(cfg: PipelineConfig) -> list[Path]:
    """Every data file the config names; raises a UserError naming the first missing one."""
    root = cfg.resolved_data_root()
    files: list[Path] = []
    phase_inputs = [
        (f"phases.{phase.name}.preprocess.input", cfg.phase_config(index).preprocess.input)
        for index, phase in enumerate(cfg.phases)
        if "input" in phase.preprocess
    ]
    for key, patterns in (
        ("tokenizer.input", cfg.tokenizer.input),
        ("preprocess.input", cfg.preprocess.input),
        *phase_inputs,
    ):
        if not patterns:
            raise UserError(f"config key {key} is empty.", fix=f"list at least one corpus file under {key}.")
        for pattern in patterns:
            found, unmatched = match_inputs([pattern], cfg.data_root)
            if unmatched:
                root_fix = (  # only a data: path is read under the data root
                    f", or point the data root (now {root}) elsewhere with `data_root:` in the config or the "
                    "BERTFLOW_DATA environment variable"
                    if str(pattern).startswith("data:")
                    else ""
                )
                raise UserError(
                    f"config key {key}: data path {pattern!r} ({cfg.data_path(pattern)}) does not exist.",
                    fix=f"correct {key}{root_fix}.",
                )
            files.extend(found)
    if cfg.tokenizer.vocab:
        vocab = cfg.data_path(cfg.tokenizer.vocab)
        if vocab.is_dir() and (vocab / "vocab.txt").is_file():
            raise UserError(
                f"config key tokenizer.vocab: {vocab} is a folder; name its vocab.txt: {vocab / 'vocab.txt'}.",
                fix=f"set tokenizer.vocab: {vocab / 'vocab.txt'}.",
            )
        if not vocab.is_file():
            raise UserError(
                f"config key tokenizer.vocab: {vocab} does not exist.",
                fix="give an existing vocab.txt / tokenizer.json, or remove the key to train one.",
            )
        files.append(vocab)
    for task, path in _task_files(cfg):
        if not path.exists():
            raise UserError(
                f"config key finetune.tasks: task {task!r} needs {path}, which does not exist.",
                fix=f"remove {task!r} from finetune.tasks or point the data root (now {root}) at a "
                "folder that has it.",
            )
        files.extend(sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path])
    return files


def _task_files(cfg: PipelineConfig) -> list[tuple[str, Path]]:
    """(task, file or folder) pairs the fine-tuning tasks read: from the task definitions when the
    fine-tuning package provides them, else from the built-in table."""
    try:
        from finetuning.tasks import load_task_specs
    except ImportError:
        load_task_specs = None
    if load_task_specs is not None:
        specs = load_task_specs(cfg.finetune.task_config)
        pairs = []
        for task in cfg.finetune.tasks:
            spec = specs.get(task)
            if spec is not None:  # unknown names: the finetune stage reports them
                pairs += [(task, cfg.data_path(spec.train)), (task, cfg.data_path(spec.dev))]
        return pairs
    pairs = []
    for task in cfg.finetune.tasks:
        folder = _task_folder(task)
        if folder is not None:
            pairs.append((task, cfg.resolved_data_root() / folder))
    return pairs


def read_checksums(path: Path) -> dict[Path, str]:
    """`sha256sum` output → {absolute path: hex digest}."""
    sums: dict[Path, str] = {}
    for n, line in enumerate(read_user_text(path, "checksum file").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(None, 1)
        if len(parts) != 2 or len(parts[0]) != 64:
            raise UserError(f"{path} line {n} is not `SHA256  PATH`.", fix="regenerate it with sha256sum.")
        sums[(path.parent / parts[1].strip().lstrip("*")).resolve()] = parts[0].lower()
    return sums


def check_finetune_task_data(cfg: PipelineConfig) -> None:
    """Read each requested fine-tuning task's data as its units will: a wrong column, an empty
    file, an unknown label or a SQuAD file too small for its split is refused now, with the units'
    own message, not after pretraining; label warnings (a label never trained on, a one-class dev
    set) are logged."""
    from finetuning.tasks import check_requested_tasks

    ft = cfg.finetune
    for note in check_requested_tasks(
        ft.tasks, ft.task_config, cfg.data_root, ft.max_train_examples, ft.max_eval_examples
    ):
        log.warning("verify: %s", note)


def verify_data(cfg: PipelineConfig) -> dict[str, Any]:
    """Check existence (always), the fine-tuning tasks' data (`check_finetune_task_data`) and
    checksums (if `verify.checksums`); returns a small summary."""
    files = sorted(set(check_data_paths(cfg)))
    check_finetune_task_data(cfg)
    summary: dict[str, Any] = {
        "data_root": str(cfg.resolved_data_root()),
        "files": len(files),
        "bytes": sum(p.stat().st_size for p in files),
        "checksummed": 0,
        "not_listed": 0,
    }
    if not cfg.verify.checksums:
        return summary
    sums_path = cfg.data_path(cfg.verify.checksum_file)
    if not sums_path.is_file():
        raise UserError(
            f"config key verify.checksum_file: {sums_path} does not exist.",
            fix="point verify.checksum_file at a sha256sum file, or set verify.checksums: false.",
        )
    sums = read_checksums(sums_path)
    unlisted = []
    for path in files:
        expected = sums.get(path.resolve())
        if expected is None:
            unlisted.append(path)
            continue
        actual = sha256_file(path)
        if actual != expected:
            raise UserError(
                f"data file {path} is corrupt: sha256 {actual[:16]}... differs from {expected[:16]}... "
                f"listed in {sums_path}.",
                fix="restore the file from the original data release.",
            )
        summary["checksummed"] += 1
    summary["not_listed"] = len(unlisted)
    if unlisted:
        shown = ", ".join(map(str, unlisted[:3])) + (
            f" and {len(unlisted) - 3} more" if len(unlisted) > 3 else ""
        )
        log.warning(
            "verify: %d of %d data files are not listed in %s, so their checksums were not checked: %s "
            "(verify.checksum_file: a sha256sum file that lists them too checks them)",
            len(unlisted), len(files), sums_path, shown,
        )  # fmt: skip
    return summary
