"""The packages form layers, each importing only from those before it (docs/architecture.md)."""

from __future__ import annotations

import ast

from common.paths import PROJECT_ROOT

LAYERS = ["common", "model", "preprocessing", "training", "finetuning", "pipelines"]


def test_no_import_runs_back_up_the_layers():
    upward = []
    for rank, layer in enumerate(LAYERS):
        for path in sorted((PROJECT_ROOT / layer).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in LAYERS and LAYERS.index(top) > rank:
                        upward.append(f"{path.relative_to(PROJECT_ROOT)}: {name}")
    assert not upward, upward
