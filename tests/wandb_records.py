"""Read the run record of an offline W&B run file (`run-*.wandb`): the project, entity, group, name
and job type W&B would upload. The file is a LevelDB-style log of protobuf `Record`s: a 7-byte
header (":W&B", magic, version), then 32 KiB blocks of chunks, each with a 7-byte header (crc32,
length, type: full / first / middle / last)."""

from __future__ import annotations

import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    out, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < HEADER:  # block trailer: zero padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, FIRST):
            pending = chunk
        elif kind in (MIDDLE, LAST):
            pending += chunk
        else:
            break  # zero padding at the end of a file still being written
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def run_info(run_dir: Path) -> dict[str, str]:
    """project, entity, group, name and job_type of the W&B run under `run_dir/wandb_files`."""
    [path] = run_dir.glob("wandb_files/wandb/*run-*/run-*.wandb")
    run = next(r.run for r in records(path) if r.WhichOneof("record_type") == "run")
    return {
        "project": run.project,
        "entity": run.entity,
        "group": run.run_group,
        "name": run.display_name,
        "job_type": run.job_type,
    }
