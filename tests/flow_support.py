"""Helpers shared by the flow tests: a tiny pipeline config on a slice of the real corpus, and a
clean stop of Prefect's in-process temporary API."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

import yaml

from common.paths import PROJECT_ROOT

# each pytest-xdist worker's Prefect home (tests/conftest.py) and the template of fresh_prefect_home
PREFECT_TESTS_DIR = PROJECT_ROOT / ".cache" / "prefect-tests"


def write_small_corpus(data_dir: Path, out: Path, documents: int = 300) -> Path:
    """The first `documents` documents of the real summaries corpus (blank line between documents)."""
    docs, current = [], []
    with open(data_dir / "wiki" / "summaries_en.txt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                current.append(line)
            elif current:
                docs.append("".join(current))
                current = []
                if len(docs) == documents:
                    break
    out.write_text("\n".join(docs), encoding="utf-8")
    return out


def tiny_config(tmp_path: Path, data_dir: Path, **sections: dict) -> Path:
    """A whole-pipeline config that runs in a couple of minutes on 2 CPU cores."""
    corpus = write_small_corpus(data_dir, tmp_path / "corpus.txt")
    cfg = {
        "name": "tiny-test",
        "run_dir": str(tmp_path / "run"),
        "flow": {"retries": 0},
        "tokenizer": {"input": [str(corpus)], "vocab_size": 2000},
        "preprocess": {
            "input": [str(corpus)],
            "max_seq_length": 64,
            "max_predictions_per_seq": 10,
            "dupe_factor": 1,
            "num_shards": 2,
            "workers": 1,
            "validation_fraction": 0.05,
        },
        "model": {"preset": "tiny"},
        "pretrain": {
            "num_processes": 1,
            "micro_batch_size": 8,
            "max_steps": 8,
            "warmup_steps": 2,
            "lr": 1e-3,
            "checkpoint_every": 4,
            "eval_every": 4,
            "eval_batches": 2,
            "log_every": 2,
        },
        "finetune": {
            "tasks": ["rte", "stsb"],
            "baselines": ["random"],
            "max_train_examples": 48,
            "max_eval_examples": 48,
            "epochs": 1,
            "batch_size": 16,
            "max_seq_length": 64,
            "concurrency": 2,
        },
        "report": {"title": "tiny test run"},
    }
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def fresh_prefect_home(home: Path) -> Path:
    """A Prefect home of its own (for a test that kills its flow's server or starts its own server),
    with its database already migrated: a copy of a template that the first caller migrates. Every
    new home used to migrate its own database, about 25 s on 2 cores. Returns `home`; an existing
    one is left as it is."""
    if (home / "prefect.db").is_file():
        return home
    template = PREFECT_TESTS_DIR / f"template-prefect-{version('prefect')}"
    PREFECT_TESTS_DIR.mkdir(parents=True, exist_ok=True)
    with open(PREFECT_TESTS_DIR / ".template.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other pytest-xdist worker waits for it
        if not (template / "prefect.db").is_file():
            building = template.with_name(template.name + ".partial")
            shutil.rmtree(building, ignore_errors=True)
            building.mkdir()
            subprocess.run(
                [sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"],
                env={**os.environ, "PREFECT_HOME": str(building)},
                check=True,
                capture_output=True,
                timeout=300,
            )
            building.rename(template)
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template / "prefect.db", home / "prefect.db")
    return home


def stop_ephemeral_prefect() -> None:
    """Flush Prefect's log/event workers and stop its temporary API while pytest still owns the
    streams (at interpreter exit Prefect would log into pytest's closed capture files). Nothing to
    do where no flow ran in this process: the temporary API's module was never imported."""
    if "prefect.server.api.server" not in sys.modules:
        return
    from pipelines.prefect_server import stop_prefect

    stop_prefect()


@contextmanager
def flow_log_lines() -> Iterator[list[str]]:
    """The messages the flow's and its tasks' run loggers log meanwhile, whatever console Prefect
    set up (under pytest-xdist its console output does not reach capfd)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep(logging.INFO)
    loggers = [logging.getLogger(name) for name in ("prefect.flow_runs", "prefect.task_runs")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield lines
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


# A user task file (docs/config.md, finetune.task_files) over one TSV of movie reviews: `.format(tsv=PATH)`
USER_TASK = """
movies:
  format: tsv
  kind: classification
  train: {tsv}
  dev: {tsv}
  text_a: text
  label: sentiment
  labels: [neg, pos]
  metrics: [accuracy, f1]
"""


def sigint_as_in_a_terminal() -> None:
    """A `preexec_fn` for a command a test stops with SIGINT: one started from a terminal has SIGINT
    at its default; a suite started in the background of a non-interactive shell (`make test &`)
    passes SIGINT down as ignored, and Python keeps an ignored SIGINT ignored, so a Ctrl-C case would
    test nothing there (the command ran to its end)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
