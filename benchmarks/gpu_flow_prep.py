"""Fill `.gpu_carry/flow/` with what `bertflow run` needs on a bare GPU machine that reaches no registry.

    .venv/bin/python benchmarks/gpu_flow_prep.py        # = make gpu-flow-prep; then, with the device tool:
    run(command="bash benchmarks/gpu_flow_check.sh", carry=[".gpu_carry/flow"], timeout_s=540)

The GPU image has torch, transformers and the scientific stack, but not Prefect, Apache Beam, W&B,
DeepSpeed, pydantic or blingfire, and their wheels (~85 MB) are more than the device tool carries
(64 MiB with the working tree). So this installs them here for the GPU's CPython 3.12 (manylinux
x86_64) into one folder, strips what a run never loads (debug symbols, test folders, blingfire's
extra vocabularies), and packs it as `site.tar.xz` (~40 MiB):
  site.tar.xz   every distribution this venv's `bertflow` needs at run time (its dependencies and
                theirs, extras included), at the versions installed here, less the ones the image
                keeps (`IMAGE_KEEPS`: torch and what is built with it)
  data/         the data root of `configs/default.yaml`: the Wikipedia summaries and the train and dev
                files of its five GLUE tasks
  carry.json    what is in it and how big
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_check_prep import CARRY_LIMIT_MIB, PLATFORMS, copy_glue, size_mib  # noqa: E402

from common.paths import data_root  # noqa: E402

# Left to the GPU image: torch and the packages built with or for it, whose versions there go together.
IMAGE_KEEPS = re.compile(
    r"torch|triton|nvidia-.*|numpy|pyarrow|grpcio|sympy|mpmath|networkx|pillow|matplotlib|contourpy|kiwisolver"
    r"|fonttools|cycler|tokenizers|safetensors|huggingface-hub|hf-xet|setuptools|ninja|psutil|py-cpuinfo"
    r"|msgpack|einops|regex|xxhash"
)
# Extras of the project's own requirements that a flow on one machine never loads (the Dask runner, S3).
UNUSED_EXTRAS = {"apache-beam": {"dask", "aws"}}
TARGET_MARKERS = {  # CPython 3.12 on x86-64 Linux: the GPU image's interpreter
    "python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "os_name": "posix",
    "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}  # fmt: skip
# Loaded by no run: blingfire's other vocabularies (its sentence splitter is in the library itself).
UNUSED_FILES = (
    "blingfire/*.bin",
    "blingfire/*.i2w",
    "blingfire/*.pdb",
    "blingfire/*.dll",
    "blingfire/*.dylib",
)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure(root: str = "bertflow") -> dict[str, str]:
    """{distribution: version} of everything `root` needs at run time on the GPU's interpreter,
    following the extras each requirement names (prefect's `sqlalchemy[asyncio]` brings greenlet),
    less `IMAGE_KEEPS`."""
    wanted_extras: dict[str, set[str]] = {}
    queue = [(canonical(root), set[str]())]
    while queue:
        name, extras = queue.pop()
        if name in wanted_extras and extras <= wanted_extras[name]:
            continue
        wanted_extras.setdefault(name, set()).update(extras)
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue  # required only on other platforms, or optional
        for text in requires:
            req = Requirement(text)
            chosen = {""} | wanted_extras[name]
            if req.marker and not any(req.marker.evaluate({**TARGET_MARKERS, "extra": e}) for e in chosen):
                continue
            sub = canonical(req.name)
            queue.append((sub, set(req.extras) - UNUSED_EXTRAS.get(sub, set())))
    closure = {}
    for name in wanted_extras:
        if name == canonical(root) or IMAGE_KEEPS.fullmatch(name):
            continue
        try:
            closure[name] = distribution(name).version
        except PackageNotFoundError:
            continue
    return dict(sorted(closure.items()))


def download_wheels(closure: dict[str, str], out: Path) -> None:
    """The closure's wheels for the GPU's interpreter; DeepSpeed (an sdist) built here with its ops left
    to the GPU machine's JIT (`DS_BUILD_OPS=0`)."""
    pip = [sys.executable, "-m", "pip"]
    if "deepspeed" in closure:
        subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", f"deepspeed=={closure['deepspeed']}",
                        "-w", str(out)], check=True, env={**os.environ, "DS_BUILD_OPS": "0"})  # fmt: skip
    pins = [f"{n}=={v}" for n, v in closure.items() if n != "deepspeed"]
    platforms = [a for p in (*PLATFORMS, "manylinux_2_24_x86_64") for a in ("--platform", p)]
    subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                    "--implementation", "cp", *platforms, "-d", str(out), *pins], check=True)  # fmt: skip


def install_and_pack(wheels: Path, site: Path, archive: Path) -> None:
    platforms = [a for p in (*PLATFORMS, "manylinux_2_24_x86_64") for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(site),
                    "--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:", *platforms,
                    *map(str, sorted(wheels.glob("*.whl")))], check=True)  # fmt: skip
    for path in [*site.rglob("__pycache__"), *site.glob("*/tests")]:
        shutil.rmtree(path, ignore_errors=True)
    for pattern in UNUSED_FILES:
        for path in site.glob(pattern):
            path.unlink()
    libraries = [str(p) for p in site.rglob("*.so")]
    if libraries and shutil.which("strip"):
        subprocess.run(["strip", "--strip-unneeded", *libraries], check=True)
    with tarfile.open(archive, "w:xz", preset=6) as tar:
        for path in sorted(site.iterdir()):
            tar.add(path, arcname=path.name)


def copy_data(out: Path) -> None:
    """`configs/default.yaml`'s inputs, laid out as the data root."""
    (out / "wiki").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(data_root() / "wiki" / "summaries_en.txt", out / "wiki" / "summaries_en.txt")
    copy_glue(out / "glue")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".gpu_carry" / "flow")
    args = ap.parse_args(argv)
    out: Path = args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    closure = runtime_closure()
    with tempfile.TemporaryDirectory() as tmp:
        download_wheels(closure, Path(tmp) / "wheels")
        install_and_pack(Path(tmp) / "wheels", Path(tmp) / "site", out / "site.tar.xz")
    copy_data(out / "data")
    total = round(size_mib(out), 2)
    info = {"distributions": closure, "site_mib": round((out / "site.tar.xz").stat().st_size / 2**20, 2),
            "total_mib": total}  # fmt: skip
    (out / "carry.json").write_text(json.dumps(info, indent=2))
    print(f"{len(closure)} distributions, site.tar.xz {info['site_mib']} MiB, total {total} MiB in {out}")
    if total > CARRY_LIMIT_MIB:
        print(f"gpu_flow_prep: {out} holds {total} MiB; the device tool carries 64 MiB with the working tree.",
              file=sys.stderr)  # fmt: skip
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
