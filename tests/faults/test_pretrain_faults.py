"""Pretraining faults: a NaN loss stops the run before the bad update, keeps the last good
checkpoint and ends its W&B run as failed; a truncated newest checkpoint is detected and the
previous one resumes exactly."""

from __future__ import annotations

import os

import pytest

from common.errors import UserError
from common.tracking import WandbTarget, read_metrics
from pipelines.stage_pretrain import run_pretrain_stage
from tests.pretrain_runs import config, losses
from tests.shard_fixtures import make_shards, make_tokenizer_dir
from tests.wandb_records import by_step, exit_code, history, run_info, summary
from training import checkpoint
from training.train import NAN_DEBUG_ENV

pytestmark = pytest.mark.slow


def test_nan_stops_cleanly_ends_its_wandb_run_failed_then_truncated_checkpoint_falls_back(
    tmp_path, minilm_dir, data_dir, monkeypatch
):
    """A NaN loss stops the run before the bad update, keeping the last good checkpoints. Its W&B
    run is ended with every step marked failed, saying why: a rank leaves at once on an error
    (os._exit), and the launcher then stops W&B's service, so the W&B run lost its end (the steps
    not yet written, a run that failed early everything) and never said it failed; rank 0 now ends
    it first. The rerun (another flow run: another group) finds the newest checkpoint truncated,
    resumes from the one before, recomputes the lost steps bit-exactly, and logs into the W&B group
    of the first attempt, so a watcher sees both together (they were in two groups)."""
    tok = make_tokenizer_dir(minilm_dir, tmp_path / "tok")
    shards = make_shards(tmp_path / "shards", tok, data_dir, num_docs=600)
    out = tmp_path / "run"

    monkeypatch.setenv(NAN_DEBUG_ENV, "10")
    lines: list[str] = []
    with pytest.raises(UserError, match=r"loss is nan at step 10; stopping before the update.*global_step8"):
        run_pretrain_stage(
            config(), shards, tok, out, log_line=lines.append, wandb=WandbTarget(group="flow-1")
        )
    monkeypatch.delenv(NAN_DEBUG_ENV)
    tags = checkpoint.tag_dirs(out / "checkpoints")
    assert [t.name for t in tags] == ["global_step8", "global_step4"]
    assert all(checkpoint.verify(t) is None for t in tags)  # the last good checkpoints are intact
    assert not (out / "model").exists() and not (out / "_COMPLETE.json").exists()
    before = losses(out)
    assert sorted(before) == list(range(1, 10))  # step 10 was never logged as a real step
    logged = by_step(read_metrics(out), "step")
    assert by_step(history(out), "_step") == logged  # W&B has every step metrics.jsonl has
    assert exit_code(out) == 3  # the rank's own exit code: W&B marks the run failed
    assert summary(out)["exit_code"] == 3  # and a watcher filters runs by it
    assert run_info(out)["group"] == "flow-1"
    assert summary(out)["exit_reason"].startswith(
        f"loss is nan at step 10; stopping before the update is applied (last good checkpoint: "
        f"{out / 'checkpoints' / 'global_step8'})"
    )

    # the newest checkpoint gets truncated (disk full, killed copy, ...): rerun falls back to step 4
    victim = max((out / "checkpoints" / "global_step8").glob("*optim_states.pt"), key=os.path.getsize)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    lines = []
    run_pretrain_stage(config(), shards, tok, out, log_line=lines.append, wandb=WandbTarget(group="flow-2"))
    assert any("global_step8 is not usable" in ln and "bytes" in ln for ln in lines)
    assert any("resumed from" in ln and "global_step4" in ln for ln in lines)
    after = losses(out)
    assert sorted(after) == list(range(1, 13))
    assert all(after[s] == before[s] for s in range(1, 10))  # steps 5..9 recomputed bit-exactly
    assert (out / "checkpoints" / "global_step8.corrupt").is_dir()  # kept for inspection, never reused
    assert (out / "model" / "model.safetensors").is_file() and (out / "_COMPLETE.json").is_file()
    assert len([r for r in read_metrics(out) if "loss" in r]) == 12  # no duplicate rows after resume
    assert run_info(out, newest=True)["group"] == "flow-1"
    assert exit_code(out, newest=True) == 0
    assert sorted(by_step(history(out, newest=True), "_step")) == list(range(1, 13))


def test_a_damaged_validation_shard_stops_the_run_like_a_damaged_train_shard(tmp_path, minilm_dir, data_dir):
    """It used to be a one-line warning: the run finished, was marked complete and reused, with
    no held-out metrics at all."""
    tok = make_tokenizer_dir(minilm_dir, tmp_path / "tok")
    shards = make_shards(tmp_path / "shards", tok, data_dir, num_docs=600)
    [shard, *_] = sorted((shards / "validation").glob("*.parquet"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    out = tmp_path / "run"
    with pytest.raises(UserError, match=rf"{shard.name} is corrupt.*rerun preprocess"):
        run_pretrain_stage(config(), shards, tok, out, log_line=[].append)
    assert not (out / "_COMPLETE.json").exists() and not (out / "model").exists()
