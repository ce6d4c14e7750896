"""Where the project and the shared data live.

The data root is a setting: `BERTFLOW_DATA` (env) or the config's `data_root`; by default
`../shared/data` relative to the project root.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
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


EMPTY_DATA_PATH = (
    "'data:' with no path after it names the whole data root, the GLUE, SQuAD and CoNLL evaluation "
    "files included (an unset variable in data:$VAR?). Fix: name a file, folder or glob after data:, "
    "e.g. data:wiki/summaries_en.txt"
)


def is_empty_data_path(path: str | os.PathLike) -> bool:
    """Whether `path` is `data:` naming nothing below the data root (`data:`, `data:.`, `data: `)."""
    text = str(path)
    return text.startswith("data:") and text[len("data:") :].strip() in ("", ".", "./")


def resolve_data_path(path: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """`data:wiki/summaries_en.txt` → <data root>/wiki/summaries_en.txt; other paths unchanged.
    An empty `data:` path is a UserError (config keys refuse it first, naming the key)."""
    text = str(path)
    if is_empty_data_path(text):
        from common.errors import UserError

        raise UserError(f"data path {text!r}: {EMPTY_DATA_PATH}.")
    if text.startswith("data:"):
        return data_root(root) / text[len("data:") :]
    return Path(text).expanduser()


def torch_extensions_dir() -> Path:
    """Where torch keeps JIT-compiled ops (DeepSpeed's CPU communication op, 2-3 min to build):
    TORCH_EXTENSIONS_DIR, else a per-user cache outside the checkout,
    `$XDG_CACHE_HOME` (or `~/.cache`)`/bertflow/torch_extensions/py<X.Y>-torch<version>-<env>`.
    The folder names the Python and torch it was built for (torch reuses a built op by the hash
    of its sources and flags, not of the torch it was compiled against) and `<env>` hashes the
    Python environment's path: the compile command holds that path, so two environments sharing
    one folder would rebuild the op each time the other one had used it."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return Path(env).expanduser()
    python = f"py{sys.version_info.major}.{sys.version_info.minor}"
    environment = hashlib.sha256(sys.prefix.encode()).hexdigest()[:8]
    return user_cache_dir() / "torch_extensions" / f"{python}-torch{_torch_version()}-{environment}"


def user_cache_dir() -> Path:
    """The per-user cache outside the checkout: `$XDG_CACHE_HOME` (or `~/.cache`)`/bertflow`."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "bertflow"


def _torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"


def check_output_dir(path: str | os.PathLike, key: str) -> None:
    """A folder a stage will write into must be a folder or creatable: no file in its place or on
    its way, and its nearest existing parent writable: tried by making (and removing) a folder in it,
    since os.access says yes to root on a virtual filesystem (/proc). Raises a UserError naming `key`."""
    from common.errors import UserError

    path = Path(path).expanduser()
    existing = _nearest_existing(path)
    if not existing.is_dir():
        where = "is a file" if existing == path else f"lies below the file {existing}"
        raise UserError(
            f"{key} {path} {where}, not a folder.",
            fix=f"set {key} to a folder (or a path where one can be made).",
        )
    try:
        probe = tempfile.mkdtemp(prefix=".bertflow-write-check-", dir=existing)
    except OSError as exc:
        raise UserError(
            f"{key} {path}: cannot create a folder in {existing} ({exc.strerror}).",
            fix=f"set {key} to a writable folder.",
        ) from None
    os.rmdir(probe)


def check_output_file(path: str | os.PathLike, key: str) -> None:
    """A file a command will write must not be a folder, and its folder must be one
    `check_output_dir` accepts (it is made when missing). Raises a UserError naming `key`."""
    from common.errors import UserError

    path = Path(path).expanduser()
    if path.is_dir():
        raise UserError(
            f"{key} {path} is a folder, not a file.",
            fix=f"give {key} a file name, e.g. {path / 'result.json'}.",
        )
    existing = _nearest_existing(path.parent)
    if not existing.is_dir():
        raise UserError(
            f"{key} {path} lies below the file {existing}.", fix=f"set {key} to a file in a folder."
        )
    check_output_dir(path.parent, key)


def check_input_file(
    path: str | os.PathLike, what: str, fix: str | None = None, missing: str | None = None
) -> None:
    """A file a command will read must exist and be a file, not a folder. Raises a UserError naming
    `what` ("config file", "task config", ...) and `path`; `missing` replaces the message for a
    path that does not exist."""
    from common.errors import UserError

    path = Path(path).expanduser()
    if path.is_dir():
        raise UserError(f"{what} {path} is a folder, not a file.", fix=fix)
    if not path.is_file():
        raise UserError(missing or f"{what} {path} does not exist.", fix=fix)


def check_checkpoint_dir(path: str | os.PathLike, missing_fix: str | None = None) -> None:
    """A checkpoint is a folder: a file given instead (DIR/model.safetensors) is said to be one,
    naming DIR where it holds config.json; a path that does not exist says so, with `missing_fix`."""
    from common.errors import UserError

    path = Path(path).expanduser()
    if path.is_file():
        folder = f"{path.parent}, " if (path.parent / "config.json").is_file() else ""
        raise UserError(
            f"{path} is a file, not a checkpoint directory.",
            fix=f"pass {folder}the directory that holds config.json and the weights file.",
        )
    if not path.is_dir():
        raise UserError(f"checkpoint directory {path} does not exist.", fix=missing_fix)


def _nearest_existing(path: Path) -> Path:
    """`path` or its nearest parent that exists."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
