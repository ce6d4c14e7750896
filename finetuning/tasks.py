"""Task definitions (`tasks.yaml` + a user's `--task-config`) and the GLUE-format TSV reader.

A task is data, not code: files, columns, label set or regression, metrics. Adding a GLUE-format
TSV task is one YAML entry. Every malformed row is a UserError naming the file and line.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from common.errors import UserError
from common.fingerprint import content_stamp
from common.paths import check_input_file, resolve_data_path
from common.textfile import read_user_text
from common.yamlfile import read_user_yaml

BUILTIN_TASKS_FILE = Path(__file__).with_name("tasks.yaml")
TASK_CONFIG = "--task-config / finetune.task_config"  # the flag of `bertflow finetune`, the key of a config
METRICS_BY_KIND = {
    "classification": {"accuracy", "f1", "mcc"},
    "regression": {"pearson", "spearman"},
    "token_classification": {"entity_f1"},
    "span_extraction": {"exact_match", "f1"},
}


class TaskSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    format: Literal["tsv", "conll", "squad"]
    kind: Literal["classification", "regression", "token_classification", "span_extraction"]
    train: str
    dev: str
    header: bool = True
    num_columns: int | None = Field(None, ge=1, description="expected columns (default: header width)")
    text_a: str | int | None = None
    text_b: str | int | None = None
    label: str | int | None = None
    labels: list[str] | None = None
    metrics: list[str]
    glue: bool = False
    squad_train_articles: int = Field(38, ge=1)
    source: str = Field("builtin", description="file the definition came from")

    @field_validator("labels", mode="before")
    @classmethod
    def _integer_labels_as_text(cls, value: Any) -> Any:
        """`labels: [0, 1]` is `["0", "1"]`: a TSV's labels are read as text."""
        if isinstance(value, list):
            return [str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
        return value

    @model_validator(mode="after")
    def _check(self) -> TaskSpec:
        allowed = METRICS_BY_KIND[self.kind]
        bad = [m for m in self.metrics if m not in allowed]
        if bad or not self.metrics:
            raise ValueError(
                f"metrics {bad or '[]'} do not fit kind {self.kind}; use some of {sorted(allowed)}"
            )
        if (
            self.format == "squad"
            and "squad_train_articles" in self.model_fields_set
            and not self.splits_train_file()
        ):
            raise ValueError(
                "squad_train_articles splits the train file when `dev` is that same file; this task "
                "has its own dev file, so remove squad_train_articles (or set `dev` to the train file)"
            )
        if self.kind in ("classification", "token_classification") and not self.labels:
            raise ValueError(f"kind {self.kind} needs a `labels` list")
        if self.kind == "classification" and len(self.labels or []) < 2:
            raise ValueError(
                f"kind classification needs two labels or more, this task has 1 {self.labels} (a model "
                "of one label can only predict it); add the other labels, or use kind regression for scores"
            )
        if self.kind == "regression" and self.labels:
            raise ValueError("kind regression takes no `labels`")
        if self.labels is not None and len(set(self.labels)) != len(self.labels):
            raise ValueError("`labels` has duplicates")
        if self.kind == "classification" and "f1" in self.metrics and len(self.labels or []) != 2:
            raise ValueError(
                f"metric f1 is the F1 of the positive class, the last of two labels, but the task has "
                f"{len(self.labels or [])} labels {self.labels}; use mcc or accuracy"
            )
        if self.format == "tsv":
            if self.kind not in ("classification", "regression"):
                raise ValueError("format tsv is for classification or regression")
            if self.text_a is None or self.label is None:
                raise ValueError("format tsv needs `text_a` and `label` columns")
            by_number = all(isinstance(c, int) for c in self.columns())
            if not self.header and not by_number:
                raise ValueError("without a header, columns must be 0-based indices")
            if by_number and "header" not in self.model_fields_set:
                # the first line was read as a header and skipped: a header-less file lost a row
                raise ValueError(
                    "columns are given by number but `header` is not set, so the file's first line "
                    "would be skipped as a header; add `header: false` for a file without a header "
                    "line (or `header: true` if its first line is one)"
                )
        if self.kind == "token_classification":
            # entity F1 reads IOB2 chunks (finetuning.metrics.entity_spans): an E- or S- tag was
            # read as O, so BIOES labels scored far below seqeval's figure
            other = [t for t in self.labels or [] if t != "O" and not t.startswith(("B-", "I-"))]
            if other:
                raise ValueError(
                    f"labels {other[:3]} are not IOB2 tags (O, B-X, I-X); convert BIOES/IOBES tags to IOB2"
                )
            if self.format == "conll" and not isinstance(self.label, int):
                raise ValueError(
                    "format conll takes `label` as a 0-based column index (e.g. 3 for CoNLL-2003's NER tag)"
                )
        return self

    def columns(self) -> list[str | int]:
        return [c for c in (self.text_a, self.text_b, self.label) if c is not None]

    @property
    def num_labels(self) -> int:
        return 1 if self.kind == "regression" else len(self.labels or [])

    def splits_train_file(self) -> bool:
        """A SQuAD task whose `dev` is its `train` file (the built-in one: only dev-v1.1.json is
        available offline) is split by article (`squad_train_articles`); one with its own dev file
        trains on `train` and evaluates on `dev`."""
        return self.format == "squad" and self.train == self.dev

    def path(self, split: str, data_root: str | None = None) -> Path:
        return resolve_data_path(self.train if split == "train" else self.dev, data_root)


def _parse_task_file(path: Path, source: str) -> dict[str, TaskSpec]:
    try:
        raw = read_user_yaml(path, "task config")
    except OSError as exc:
        raise UserError(
            f"task config {path} cannot be read: {exc}", fix="pass a readable YAML file."
        ) from None
    if raw is None or raw == {}:  # the built-in tasks of the same names would run in place of the user's
        what = "it is empty or only comments" if raw is None else f"it holds only {raw!r}"
        raise UserError(
            f"task config {path} defines no task ({what}); the built-in "
            "definitions would run in place of yours.",
            fix=f"define your tasks in it (finetuning/tasks.yaml shows the schema), or drop {TASK_CONFIG}.",
        )
    if not isinstance(raw, dict):
        raise UserError(
            f"task config {path} must map task names to definitions.", fix="see finetuning/tasks.yaml."
        )
    specs: dict[str, TaskSpec] = {}
    for name, body in raw.items():
        if not isinstance(body, dict):
            raise UserError(
                f"task config {path}: task {name!r} must be a mapping.", fix="see finetuning/tasks.yaml."
            )
        body = dict(body)
        for key in ("train", "dev"):  # relative paths in a user file are relative to that file
            value = body.get(key)
            if (
                isinstance(value, str)
                and not value.startswith("data:")
                and not Path(value).expanduser().is_absolute()
            ):
                body[key] = str(path.parent / value)
        try:
            specs[str(name)] = TaskSpec.model_validate({**body, "name": str(name), "source": source})
        except ValidationError as exc:
            msgs = "; ".join(
                f"{'.'.join(str(x) for x in e['loc']) or 'definition'}: "
                f"{'unknown key' if e['type'] == 'extra_forbidden' else e['msg']}"
                for e in exc.errors()
            )
            raise UserError(
                f"task config {path}: task {name!r} is invalid: {msgs}.",
                fix=f"fix or remove the entry {name!r} (see finetuning/tasks.yaml); the file's other "
                "tasks are refused until it parses.",
            ) from None
    return specs


def load_task_specs(task_config: str | None = None) -> dict[str, TaskSpec]:
    """Built-in tasks, plus (overriding by name) the ones in a user's task config file."""
    specs = dict(_task_file(BUILTIN_TASKS_FILE, "builtin"))
    if task_config:
        path = Path(task_config).expanduser()
        where = "" if path.is_absolute() else f" (relative to the current directory, {Path.cwd()})"
        check_input_file(
            path,
            "task config",
            fix=f"pass an existing YAML file to {TASK_CONFIG}.",
            missing=f"task config {path} does not exist{where}.",
        )
        specs.update(_task_file(path, str(path)))
    return specs


def _task_file(path: Path, source: str) -> dict[str, TaskSpec]:
    """`_parse_task_file`, parsed again only when the file changed: a plan asks for a task per unit
    (hundreds of times for a sweep), and parsing the YAML each time took seconds."""
    stat = path.stat()
    return _parsed_task_file(path, source, (path.resolve(), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=16)
def _parsed_task_file(path: Path, source: str, file_stamp: tuple[Path, int, int]) -> dict[str, TaskSpec]:
    return _parse_task_file(path, source)


def get_task(name: str, task_config: str | None = None) -> TaskSpec:
    specs = load_task_specs(task_config)
    if name not in specs:
        raise UserError(
            f"unknown task {name!r}.",
            fix=f"use one of {', '.join(sorted(specs))} or add it with {TASK_CONFIG}.",
        )
    return specs[name]


def redefined_builtin_note(spec: TaskSpec) -> dict[str, str]:
    """{"redefined": why} when `spec` takes a built-in task's name but not its data files and
    labels: its scores are not comparable with the paper's figures for that name."""
    builtin = _task_file(BUILTIN_TASKS_FILE, "builtin").get(spec.name)
    if builtin is None or spec.source == "builtin":
        return {}
    files = [(t.path("train").resolve(), t.path("dev").resolve()) for t in (builtin, spec)]
    if (builtin.format, builtin.labels, files[0]) == (spec.format, spec.labels, files[1]):
        return {}  # the same files, however spelled (`data:glue/...` or an absolute path)
    return {
        "redefined": f"{spec.name} is redefined in {spec.source} (other data files or labels than the "
        "built-in task of that name), so it has no BERT-base reference figure."
    }


def dev_is_train_note(spec: TaskSpec, data_root: str | None) -> dict[str, str]:
    """{"dev": why} when a TSV or CoNLL task evaluates on its own train file (WNLI's built-in entry
    does, having no other labelled file): its dev scores are then training-set scores. A SQuAD task
    with one file is split by article instead."""
    train_path, dev_path = spec.path("train", data_root), spec.path("dev", data_root)
    if spec.format == "squad" or train_path.resolve() != dev_path.resolve():
        return {}
    return {
        "dev": f"task {spec.name!r}: its dev file is its train file {dev_path}, so its dev scores are "
        "measured on examples it was trained on, not on held-out ones."
    }


@dataclass(frozen=True)
class TextExample:
    text_a: str
    text_b: str | None
    label: int | float
    line: int


def check_file(path: Path, spec: TaskSpec) -> None:
    if not path.is_file():
        raise UserError(
            f"task {spec.name!r}: data file {path} does not exist (defined in {spec.source}).",
            path=str(path),
            fix="fix the path in the task definition or set the data root (BERTFLOW_DATA).",
        )


def read_tsv_examples(spec: TaskSpec, path: Path, limit: int | None = None) -> list[TextExample]:
    """Read a GLUE-format TSV: tab separated, no quoting (csv.QUOTE_NONE), optional BOM and header."""
    check_file(path, spec)
    text = read_user_text(path, "task data file")
    lines = text.splitlines()
    if not lines or not any(line.strip() for line in lines):
        raise UserError(
            f"task {spec.name!r}: {path} is empty.", fix="point the task at a file with examples."
        )
    _check_tab_separated(spec, path, lines)
    index, width = _tsv_columns(spec, path, lines[0])
    first_row = 2 if spec.header else 1
    label_ids = {lab: i for i, lab in enumerate(spec.labels or [])}
    out: list[TextExample] = []
    for offset, line in enumerate(lines[first_row - 1 :]):
        lineno = first_row + offset
        if not line.strip():
            continue
        cells = line.split("\t")
        if len(cells) != width:
            raise UserError(
                f"{path} line {lineno}: {len(cells)} tab-separated columns, expected {width} (task {spec.name!r}).",
                fix="fix or remove that line (fields must not contain tabs).",
            )
        label = _tsv_label(spec, cells[index[spec.label]].strip(), label_ids, f"{path} line {lineno}")
        text_b = cells[index[spec.text_b]] if spec.text_b is not None else None
        out.append(TextExample(cells[index[spec.text_a]], text_b, label, lineno))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise UserError(
            f"task {spec.name!r}: {path} has a header but no examples.", fix="add examples to the file."
        )
    return out


def _check_tab_separated(spec: TaskSpec, path: Path, lines: list[str]) -> None:
    """A task reads two columns at least (text and label): a first line without a tab is another
    format (a CSV, JSON lines), which the column messages only called a missing column."""
    lineno, first_line = next((i, line) for i, line in enumerate(lines, start=1) if line.strip())
    if "\t" in first_line or len(set(spec.columns())) < 2:
        return
    stripped = first_line.lstrip("\ufeff").strip()
    kind = (
        "JSON lines"
        if stripped.startswith("{")
        else "comma-separated (CSV)"
        if "," in stripped
        else "one column"
    )
    raise UserError(
        f"{path} line {lineno} has no tab: it looks {kind}, but format tsv reads tab-separated columns and "
        f"task {spec.name!r} needs {len(set(spec.columns()))} ({', '.join(map(repr, spec.columns()))}).",
        fix="convert the file to TSV: one example per line, its columns separated by tabs, a header line "
        "naming them (or `header: false` and column numbers), no quoting.",
    )


def _tsv_columns(spec: TaskSpec, path: Path, first_line: str) -> tuple[dict[str | int, int], int]:
    """Where each of the task's columns is in a row (by name in the header, or by number), and how
    many columns a row has."""
    if not spec.header:
        index: dict[str | int, int] = {c: int(c) for c in spec.columns()}
        return index, spec.num_columns or (max(index.values()) + 1)
    header = first_line.split("\t")
    index = {}
    for col in spec.columns():
        if isinstance(col, int):
            index[col] = col
        elif col in header:
            index[col] = header.index(col)
        else:
            raise UserError(
                f"{path} line 1: header has no column {col!r} (task {spec.name!r}); it has {header}.",
                fix="name an existing column in the task definition.",
            )
    return index, spec.num_columns or len(header)


def _tsv_label(spec: TaskSpec, raw_label: str, label_ids: dict[str, int], where: str) -> int | float:
    """A row's label: a number for a regression, else the index of one of the task's labels.
    `where`: 'PATH line N', for the messages."""
    if raw_label == "":
        raise UserError(
            f"{where}: the label is missing (task {spec.name!r}).", fix="fix or remove that line."
        )
    if spec.kind == "regression":
        try:
            label = float(raw_label)
        except ValueError:
            label = math.nan
        if not math.isfinite(label):
            raise UserError(
                f"{where}: label {raw_label!r} is not a number (task {spec.name!r} is a regression).",
                fix="fix or remove that line.",
            )
        return label
    if raw_label not in label_ids:
        raise UserError(
            f"{where}: unknown label {raw_label!r} (task {spec.name!r} has labels {spec.labels}).",
            fix="fix the line or add the label to the task's `labels`.",
        )
    return label_ids[raw_label]


def label_warnings(
    spec: TaskSpec, train: list[TextExample], dev: list[TextExample], train_path: Path, dev_path: Path
) -> list[str]:
    """What a classification task's labels leave unmeasured: a declared label absent from the
    training examples (never predicted), a dev set of one class (MCC and F1 undefined, accuracy
    that of one class). Said when the data is read; the scores alone looked normal."""
    if spec.kind != "classification":
        return []
    names = spec.labels or []
    seen = {e.label for e in train}
    unseen = [name for i, name in enumerate(names) if i not in seen]
    notes = []
    if unseen:
        notes.append(
            f"task {spec.name!r}: label {', '.join(map(repr, unseen))} never occurs in the {len(train)} "
            f"training examples read from {train_path}; the model cannot learn to predict it."
        )
    dev_labels = {e.label for e in dev}
    if len(dev_labels) == 1:
        only = names[next(iter(dev_labels))]
        notes.append(
            f"task {spec.name!r}: every example of {dev_path} has label {only!r}; "
            + _one_class_metrics(spec.metrics, [int(e.label) for e in dev])
        )
    return notes


def _one_class_metrics(metrics: list[str], labels: list[int]) -> str:
    """What a one-class dev set leaves of a task's metrics: those it cannot define (MCC; F1 unless the
    class is the positive label) and those that measure that class only (`classification_metrics`)."""
    from finetuning.metrics import classification_metrics

    names = {"accuracy": "accuracy", "f1": "F1", "mcc": "MCC"}
    values = classification_metrics(metrics, labels, labels)
    undefined = [names[m] for m in metrics if values[m] is None]
    measured = [names[m] for m in metrics if values[m] is not None]
    parts = (
        [f"{' and '.join(undefined)} {'is' if len(undefined) == 1 else 'are'} undefined there"]
        if undefined
        else []
    )
    if measured:
        verb = "measures" if len(measured) == 1 else "measure"
        parts.append(f"{' and '.join(measured)} {verb} that one class only")
    return " and ".join(parts) + "."


def check_task_data(
    spec: TaskSpec, data_root: str | None, max_train: int | None, max_eval: int | None
) -> list[str]:
    """Read a task's train and dev data as its units will (the same caps), so that a wrong column,
    an empty file, an unknown label or a SQuAD file too small for its split is refused before
    compute starts, with the units' own messages; returns the label warnings (`label_warnings`,
    `ner.tag_warnings`)."""
    train_path, dev_path = spec.path("train", data_root), spec.path("dev", data_root)
    same_file = list(dev_is_train_note(spec, data_root).values())
    if spec.format == "tsv":
        train = read_tsv_examples(spec, train_path, max_train)
        dev = read_tsv_examples(spec, dev_path, max_eval)
        return label_warnings(spec, train, dev, train_path, dev_path) + same_file
    if spec.format == "conll":
        from finetuning.ner import read_conll, tag_warnings

        sentences = read_conll(spec, train_path, max_train), read_conll(spec, dev_path, max_eval)
        return tag_warnings(spec, *sentences, train_path, dev_path) + same_file
    from finetuning.squad import read_squad_split

    read_squad_split(spec, data_root, max_train, max_eval)
    return []


def check_requested_tasks(
    names: list[str],
    task_config: str | None,
    data_root: str | None,
    max_train: int | None,
    max_eval: int | None,
) -> list[str]:
    """`check_task_data` for each requested task the definitions know (unknown names are refused
    where units are planned): the problems of all of them in one UserError, else the label warnings
    of all."""
    specs = load_task_specs(task_config)
    notes: list[str] = []
    problems: list[UserError] = []
    for name in dict.fromkeys(names):
        if name in specs:
            try:
                notes += check_task_data(specs[name], data_root, max_train, max_eval)
            except UserError as exc:
                problems.append(exc)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise UserError(
            f"{len(problems)} fine-tuning tasks cannot be read:\n" + "\n".join(f"- {p}" for p in problems)
        )
    return notes


def task_data(spec: TaskSpec, data_root: str | None) -> list[dict[str, Any]]:
    """A task's train and dev files by size and sha256, under their configured path (an edited TSV
    is new data; a moved data root is not): what the units' keys and the scorecard's key hold."""
    configured = {"train": spec.train, "dev": spec.dev}
    return [{**content_stamp(spec.path(split, data_root)), "path": configured[split]} for split in configured]
