"""Install the carried wheels that this Python lacks (or has older) into a target folder, offline.

    python3 benchmarks/install_wheels.py WHEEL_DIR TARGET     # then: export PYTHONPATH=TARGET:...

A wheel is skipped when this interpreter already has its distribution at the same or a newer version
(the GPU image's own packages stay in charge); the rest go in with `pip install --no-index --no-deps
--target`, as the device tool's notes describe. Prints what it installed and what it skipped.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.version import Version


def wanted(wheels: list[Path]) -> tuple[list[Path], list[str]]:
    install, skipped = [], []
    for wheel in wheels:
        name, ver = wheel.name.split("-")[:2]
        try:
            have = version(name)
        except PackageNotFoundError:
            have = None
        if have is not None and Version(have) >= Version(ver):
            skipped.append(f"{name} {ver} (have {have})")
        else:
            install.append(wheel)
    return install, skipped


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    wheel_dir, target = Path(argv[0]), Path(argv[1])
    wheels = sorted(wheel_dir.glob("*.whl"))
    if not wheels:
        print(f"install_wheels: no wheels in {wheel_dir}; run `make gpu-check-prep` first.", file=sys.stderr)
        return 2
    install, skipped = wanted(wheels)
    if skipped:
        print("install_wheels: already here: " + ", ".join(skipped))
    if install:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--upgrade", "--target", str(target), *map(str, install)], check=True)  # fmt: skip
        print("install_wheels: installed " + ", ".join(w.name for w in install) + f" into {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
