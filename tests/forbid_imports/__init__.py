"""`env_forbidding(packages)`: the environment of a child process in which those packages cannot be
imported (this folder's sitecustomize.py does it), with the project on its path."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from common.paths import PROJECT_ROOT


def env_forbidding(packages: Iterable[str]) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(PROJECT_ROOT)]),
        "BERTFLOW_FORBID_IMPORTS": ",".join(packages),
    }
