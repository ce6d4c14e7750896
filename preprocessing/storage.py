"""The preprocess job's only door to files: Beam's filesystem layer (`FileSystems`).

Every byte the job reads or writes (corpus files, its work files under the temp location, part
files, shards, manifest, stats, the completion marker) goes through these functions, so the same
code runs on a laptop (`/data/...`), on S3 (`s3://`), GCS (`gs://`) and HDFS (`hdfs://`),
whichever filesystem Beam has installed. Paths are strings; a path without a scheme is local.

Writes are atomic on every filesystem: the bytes go to a temp name beside the target
(`.tmp-<name>.<random>`), then `FileSystems.rename` moves them into place (a POSIX rename
locally, copy + delete on object stores, where readers never see a partial object anyway).
Local temp files are fsynced before the rename, as `common.atomic` does.

Workers of a distributed runner are separate processes that never saw the driver's pipeline
options: every DoFn calls `use_options` in its setup with the options the driver parsed (S3
endpoint and credentials, GCP project, ...). DaskRunner, for one, does not pass them on.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from common.atomic import TMP_PREFIX
from common.disk_space import full_disk_path

UNCOMPRESSED = CompressionTypes.UNCOMPRESSED  # gzip is detected by its magic bytes, not the name


def use_options(options: dict[str, Any] | PipelineOptions | None) -> None:
    """Configure Beam's filesystems (S3 endpoint, credentials, ...) in this process."""
    if options is None:
        return
    if isinstance(options, dict):
        options = PipelineOptions.from_dictionary(options)
    FileSystems.set_options(options)


def is_remote(path: str) -> bool:
    return FileSystems.get_scheme(str(path)) not in (None, "file")


def join(base: str, *parts: str) -> str:
    return FileSystems.join(str(base), *parts)


def parent(path: str) -> str:
    return FileSystems.split(str(path))[0]


def basename(path: str) -> str:
    return FileSystems.split(str(path))[1]


def match(pattern: str) -> list[tuple[str, int]]:
    """(path, size) of every file matching a glob (`*` within a folder, `**` across folders)."""
    found = FileSystems.match([str(pattern)])[0].metadata_list
    return sorted((m.path, m.size_in_bytes) for m in found)


def exists(path: str) -> bool:
    return FileSystems.exists(str(path))


def size(path: str) -> int:
    if not is_remote(str(path)):  # a local name is a name, never a glob (`wiki[1].txt`)
        return os.path.getsize(path)
    found = FileSystems.match([str(path)])[0].metadata_list
    if not found:
        raise FileNotFoundError(path)
    return found[0].size_in_bytes


def open_read(path: str) -> BinaryIO:
    """A seekable binary reader (no decompression)."""
    return FileSystems.open(str(path), compression_type=UNCOMPRESSED)


def read_bytes(path: str) -> bytes:
    with open_read(path) as fh:
        return fh.read()


def read_json(path: str) -> Any:
    return json.loads(read_bytes(path))


def sha256(path: str, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open_read(path) as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


class _HashingWriter:
    """A write-only file object that hashes what passes through it (pyarrow writes here)."""

    def __init__(self, raw: BinaryIO):
        self.raw, self.hash, self.size = raw, hashlib.sha256(), 0
        self.closed = False

    def write(self, data) -> int:
        data = bytes(data)
        self.hash.update(data)
        self.size += len(data)
        self.raw.write(data)
        return len(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.raw.flush()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True  # the raw stream is closed by `write_atomically`


@contextmanager
def _atomic_writer(path: str) -> Iterator[_HashingWriter]:
    path = str(path)
    tmp = join(parent(path), f"{TMP_PREFIX}{basename(path)}.{uuid.uuid4().hex[:12]}")
    raw = FileSystems.create(tmp, compression_type=UNCOMPRESSED)
    try:
        writer = _HashingWriter(raw)
        yield writer
        raw.flush()
        if not is_remote(path):
            os.fsync(raw.fileno())
        raw.close()
        FileSystems.rename([tmp], [path])
    except BaseException as exc:
        if not raw.closed:
            try:
                raw.close()
            except OSError:
                pass  # a full disk fails the close too; the error below says so
        if FileSystems.exists(tmp):
            FileSystems.delete([tmp])
        if isinstance(exc, OSError) and exc.filename is None and full_disk_path(exc) is not None:
            raise OSError(exc.errno, exc.strerror, path) from None  # name the file (Beam shows only text)
        raise


def write_atomically(path: str, write: Callable[[BinaryIO], None]) -> str:
    """`write(fileobj)` fills `path`, which appears whole or not at all; returns the sha256."""
    with _atomic_writer(path) as writer:
        write(writer)  # type: ignore[arg-type]
    return writer.hash.hexdigest()


def write_bytes(path: str, data: bytes) -> str:
    return write_atomically(path, lambda fh: fh.write(data))


def write_json(path: str, obj: Any) -> str:
    return write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def delete_tree(path: str) -> None:
    """Remove a file or a folder with everything under it (no error if absent)."""
    path = str(path)
    if not is_remote(path):
        import shutil

        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)
        return
    found = [p for p, _ in match(join(path, "**"))] + ([path] if exists(path) else [])
    if found:
        FileSystems.delete(found)
