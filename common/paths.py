"""Where the project and the shared data live.

The data root is a setting: `BERTFLOW_DATA` (env) or the config's `data_root`; by default
`../shared/data` relative to the project root.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def data_root(override: str | os.PathLike | None = None) -> Path:
    """The folder holding wiki/, glue/, squad-v1.1/, conll2003/ (see ../shared/data/README.md)."""
    if override:
        return Path(override).expanduser().resolve()
    env = os.environ.get("BERTFLOW_DATA")
    if env:
        return Path(env).expanduser().resolve()
    return (PROJECT_ROOT.parent / "shared" / "data").resolve()


def resolve_data_path(path: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """`data:wiki/summaries_en.txt` → <data root>/wiki/summaries_en.txt; other paths unchanged."""
    text = str(path)
    if text.startswith("data:"):
        return data_root(root) / text[len("data:") :]
    return Path(text).expanduser()


def torch_extensions_dir() -> Path:
    """Where torch keeps JIT-compiled ops (DeepSpeed's CPU communication op, 2-3 min to build):
    TORCH_EXTENSIONS_DIR, else one per-user cache that every checkout shares,
    `$XDG_CACHE_HOME` (or `~/.cache`)`/bertflow/torch_extensions/py<X.Y>-torch<version>`. The
    folder names the Python and torch it was built for: torch reuses a built op by the hash of its
    sources and flags, not of the torch it was compiled against."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return Path(env).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return (
        cache
        / "bertflow"
        / "torch_extensions"
        / f"py{sys.version_info.major}.{sys.version_info.minor}-torch{_torch_version()}"
    )


def _torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"
