"""Two runs on one output directory (issue 14 item 2: `bertflow run cfg.yaml` twice on one run_dir
wrote the same keyed directories, and metrics.jsonl ended with steps 10, 5, 10). Every stage that
writes a directory holds DIR/.lock (common/dir_lock.py, the lock the fine-tuning units had): while
another process holds it, the stage stops with one message and writes nothing; once it is
released, the stage runs (checked here for the tokenizer and preprocess stages)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from common.atomic import read_marker
from common.errors import UserError
from pipelines.stage_preprocess import run_preprocess_stage
from pipelines.stage_pretrain import run_pretrain_stage
from pipelines.stage_tokenizer import run_tokenizer_stage
from preprocessing.config import PreprocessConfig, TokenizerConfig
from tests.pretrain_runs import config
from tests.shard_fixtures import make_shards, make_tokenizer_dir


def _files(directory: Path) -> set[Path]:
    return set(directory.rglob("*")) if directory.exists() else set()


def _lock_file(directory: Path) -> Path:
    return directory.parent / f".{directory.name}.lock"  # beside the output, which holds only its files


class HeldBy:
    """The lock of DIR held by another process (as a second `bertflow run` would find it)."""

    def __init__(self, directory: Path) -> None:
        directory.parent.mkdir(parents=True, exist_ok=True)
        script = (
            "import fcntl, sys, time\n"
            "fh = open(sys.argv[1], 'a+'); fcntl.flock(fh.fileno(), fcntl.LOCK_EX); fh.write('4242\\n'); fh.flush()\n"
            "print('held', flush=True); sys.stdin.read()\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, str(_lock_file(directory))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "held"

    def release(self) -> None:
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0


def _refused(run, directory: Path, what: str) -> None:
    """`run` refused while another process holds DIR's lock: the message names the holder's pid,
    nothing is written, and the holder's record in the lock file is left as it was."""
    holder = HeldBy(directory)
    before = _files(directory)
    try:
        message = (
            rf"{re.escape(what)} in {re.escape(str(directory))} is being run by another process \(pid 4242,"
        )
        with pytest.raises(UserError, match=message):
            run()
        assert _files(directory) == before
        assert _lock_file(directory).read_text() == "4242\n"
    finally:
        holder.release()


def test_tokenizer_stage(tmp_path, minilm_dir):
    out = tmp_path / "tok"
    cfg = TokenizerConfig(vocab=str(minilm_dir / "vocab.txt"))
    _refused(lambda: run_tokenizer_stage(cfg, out), out, "the tokenizer stage")
    assert run_tokenizer_stage(cfg, out) == out and (out / "vocab.txt").is_file()  # released: it runs
    # it held the lock itself, beside its output (which holds only the stage's files)
    assert _lock_file(out).read_text() == f"{os.getpid()}\n" and ".lock" not in {p.name for p in _files(out)}


def test_preprocess_stage(tmp_path, minilm_dir, data_dir):
    tok = make_tokenizer_dir(minilm_dir, tmp_path / "tok")
    corpus = tmp_path / "c.txt"
    corpus.write_text((data_dir / "wiki/summaries_en.txt").read_text(encoding="utf-8")[:4000])
    out = tmp_path / "shards"
    cfg = PreprocessConfig(input=[str(corpus)], workers=1, num_shards=1)
    _refused(lambda: run_preprocess_stage(cfg, tok / "vocab.txt", out), out, "preprocess")
    stats = run_preprocess_stage(cfg, tok / "vocab.txt", out)  # released: it runs
    assert stats["examples"] > 0 and read_marker(out) is not None


def test_pretrain_stage(tmp_path, minilm_dir, data_dir):
    tok = make_tokenizer_dir(minilm_dir, tmp_path / "tok")
    shards = make_shards(tmp_path / "shards", tok, data_dir, num_docs=60)
    out = tmp_path / "out"

    def run() -> None:
        run_pretrain_stage(config(), shards, tok, out, log_line=lambda line: pytest.fail(f"launched: {line}"))

    _refused(run, out, "pretrain")
