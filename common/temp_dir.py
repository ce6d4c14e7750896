"""Temp directories of our own, for processes and libraries that leave folders in the temp
directory: Beam's local job service and job server make theirs with `tempfile.mkdtemp()` and leave
them on the DirectRunner's path (a `beam-temp*`, two `tmp*` and a `beam-requirements-cache` folder
in /tmp per preprocess job); torchrun leaves its `torchelastic_*` tree (`training.launch`); W&B's
two folders made at import stay where a process is terminated (`finetuning.fanout.UnitPool`). Each is
named PREFIX + the owning bertflow's pid + "-" + a random part, so that a later run can remove those
a killed bertflow left (`remove_stale_temp_dirs`)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common.child_process import is_alive


@contextmanager
def named_temp_dir(prefix: str) -> Iterator[Path]:
    """A new folder in the temp directory, named `prefix` + this process's pid + "-" + a random
    part, removed with what is in it at the end; those a killed bertflow left go first
    (`remove_stale_temp_dirs`). For a child process's TMPDIR (the pretraining launch's, the
    fine-tuning workers')."""
    remove_stale_temp_dirs(prefix)
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def own_temp_dir(prefix: str) -> Iterator[Path]:
    """Within the block, this process's temp directory (`tempfile.gettempdir()`) and the TMPDIR its
    child processes inherit are a `named_temp_dir` under the current one. One block at a time in a
    process (the flow's stages run one after another): the temp directory is process-wide."""
    with named_temp_dir(prefix) as path:
        saved_tempdir, saved_env = tempfile.tempdir, os.environ.get("TMPDIR")
        tempfile.tempdir, os.environ["TMPDIR"] = str(path), str(path)
        try:
            yield path
        finally:
            tempfile.tempdir = saved_tempdir
            if saved_env is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = saved_env


def remove_stale_temp_dirs(
    prefix: str, root: Path | None = None, stale_after_s: float = 3600.0
) -> list[Path]:
    """Remove the folders named `prefix` + pid + "-" + ... under `root` (the temp directory) whose
    bertflow is gone and that nothing changed for `stale_after_s` (a killed bertflow's children may
    still be writing into theirs for a while: the pretraining ranks for `pretrain.stop_grace_s`);
    returns them."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(f"{prefix}*-*"):
        pid = path.name[len(prefix) :].split("-", 1)[0]
        try:
            if not pid.isdigit() or is_alive(int(pid)) or time.time() - path.stat().st_mtime < stale_after_s:
                continue
        except OSError:  # gone meanwhile
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
