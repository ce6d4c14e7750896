"""Test helper: with this folder on PYTHONPATH, the packages named in BERTFLOW_FORBID_IMPORTS
(comma-separated) cannot be imported in this process or its children, as on a GPU image that lacks
them (`importlib.util.find_spec` answers None, `import` raises ModuleNotFoundError)."""

import os
import sys

for _name in filter(None, os.environ.get("BERTFLOW_FORBID_IMPORTS", "").split(",")):
    sys.modules[_name] = None  # type: ignore[assignment]
