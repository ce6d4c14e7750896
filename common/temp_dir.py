"""A temp directory of a block's own, for libraries that leave folders in the temp directory:
Beam's local job service and job server make theirs with `tempfile.mkdtemp()` and leave them on the
DirectRunner's path (a `beam-temp*`, two `tmp*` and a `beam-requirements-cache` folder in /tmp per
preprocess job)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def own_temp_dir(prefix: str) -> Iterator[Path]:
    """Within the block, this process's temp directory (`tempfile.gettempdir()`) and the TMPDIR its
    child processes inherit are a new folder under the current one, removed with what is in it at
    the end. A process killed meanwhile leaves it (named `prefix` + its pid). One block at a time in
    a process (the flow's stages run one after another): the temp directory is process-wide."""
    path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
    saved_tempdir, saved_env = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir, os.environ["TMPDIR"] = path, path
    try:
        yield Path(path)
    finally:
        tempfile.tempdir = saved_tempdir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(path, ignore_errors=True)
