"""`num_processes: auto` and `global_batch_size`: one config, the same recipe on any machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from common.errors import UserError
from common.paths import PROJECT_ROOT
from pipelines.config import load_config
from tests.forbid_imports import env_forbidding
from training.launch import world_size
from training.ranks import CPU_RANKS, resolve_ranks

SHIPPED = sorted((PROJECT_ROOT / "configs").glob("*.yaml"))


def pretrain(*settings: str):
    return load_config(None, [f"pretrain.{s}" for s in settings]).pretrain


def split(p) -> tuple[int, int, int]:
    return world_size(p), p.micro_batch_size, p.gradient_accumulation_steps


@pytest.mark.parametrize("gpus,ranks", [(0, CPU_RANKS), (1, 1), (8, 8)])
def test_auto_is_one_rank_per_gpu_or_the_cpu_ranks(gpus: int, ranks: int) -> None:
    assert resolve_ranks(pretrain("num_processes=auto"), gpus).num_processes == ranks
    if gpus != 1:  # a number is kept as given (on one GPU, 2 is refused: the next test)
        assert resolve_ranks(pretrain("num_processes=2"), gpus).num_processes == 2


@pytest.mark.parametrize("gpus,ranks", [(0, CPU_RANKS), (1, 1), (4, 4)])
def test_the_built_in_default_runs_on_any_machine(gpus: int, ranks: int) -> None:
    """`bertflow pretrain --shards S --tokenizer T` with no config: on a one-GPU machine the built-in
    2 ranks were refused (`pretrain.num_processes 2 > 1 visible GPUs`, seen on an H200, 2026-11-28)."""
    assert resolve_ranks(load_config(None).pretrain, gpus).num_processes == ranks


def test_more_ranks_than_gpus_is_refused_unless_a_hostfile_places_them() -> None:
    with pytest.raises(UserError) as exc:
        resolve_ranks(pretrain("num_processes=2"), 1)
    assert "pretrain.num_processes 2 > 1 visible GPUs" in str(exc.value) and "auto" in str(exc.value)
    placed = pretrain("num_processes=16", "hostfile=infra/hostfile.example")
    assert resolve_ranks(placed, 8).num_processes == 16
    assert resolve_ranks(pretrain("num_processes=16"), 0).num_processes == 16  # CPU ranks: as many as asked


@pytest.mark.parametrize(
    "ranks,global_batch,micro,expected",
    [
        (2, 64, 32, (2, 32, 1)),  # the CPU default, as before
        (1, 64, 32, (1, 32, 2)),  # the same recipe on one GPU
        (8, 64, 32, (8, 8, 1)),  # smaller micro batches rather than fewer examples
        (1, 48, 32, (1, 24, 2)),  # the fewest steps whose micro batch divides the share
        (1, 2048, 64, (1, 64, 32)),  # bert-base-gpu.yaml on one GPU
        (8, 2048, 64, (8, 64, 4)),  # ... and on eight, its layout before global_batch_size
        (3, 21, 2, (3, 1, 7)),  # 7 is prime: micro batch 1
    ],
)
def test_the_global_batch_is_split_exactly_with_micro_batches_no_larger_than_asked(
    ranks: int, global_batch: int, micro: int, expected: tuple[int, int, int]
) -> None:
    p = resolve_ranks(
        pretrain(f"num_processes={ranks}", f"global_batch_size={global_batch}", f"micro_batch_size={micro}"),
        0,
    )
    got = split(p)
    assert got == expected
    assert got[0] * got[1] * got[2] == global_batch and got[1] <= micro


def test_a_split_that_does_not_exist_is_refused_naming_the_settings() -> None:
    with pytest.raises(UserError) as exc:
        resolve_ranks(pretrain("num_processes=auto", "global_batch_size=64"), 3)
    said = str(exc.value)
    assert "pretrain.global_batch_size 64 cannot be shared evenly by 3 ranks" in said
    assert "pretrain.num_processes 3 (auto)" in said and "fix:" in said.lower()
    with pytest.raises(UserError, match="both set the batch split"):
        resolve_ranks(pretrain("global_batch_size=64", "gradient_accumulation_steps=2"), 0)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_each_shipped_config_trains_the_same_batches_on_cpu_and_on_1_2_or_8_gpus(path: Path) -> None:
    cfg = load_config(path)
    for index in range(len(cfg.phases) + 1):
        asked = cfg.phase_config(index).pretrain
        steps = set()
        for gpus in (0, 1, 2, 8):
            ranks, micro, accumulation = split(resolve_ranks(asked, gpus))
            assert micro <= asked.micro_batch_size
            steps.add(ranks * micro * accumulation)
        assert steps == {asked.global_batch_size}, (path.name, index, steps)


@pytest.mark.parametrize("path", ["default.yaml", "cpu-hour.yaml"])
def test_the_cpu_configs_keep_their_two_ranks_of_full_micro_batches(path: str) -> None:
    cfg = load_config(PROJECT_ROOT / "configs" / path)
    for index in range(len(cfg.phases) + 1):
        asked = cfg.phase_config(index).pretrain
        assert split(resolve_ranks(asked, 0)) == (2, asked.micro_batch_size, 1)


def test_the_flow_refuses_a_global_batch_the_ranks_cannot_share_before_any_stage(tmp_path: Path) -> None:
    """Said before the tokenizer stage, and on a machine without a GPU device node without importing
    torch (`visible_gpus`)."""
    runs = tmp_path / "runs"
    no_gpu = not any(Path("/dev").glob("nvidia[0-9]*")) and not Path("/dev/kfd").exists()
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "run", "configs/default.yaml", "--set", f"run_dir={runs}",
         "--set", "pretrain.global_batch_size=63"],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120,
        env=env_forbidding(["torch"] if no_gpu else []),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "pretrain.global_batch_size 63 cannot be shared evenly by 2 ranks" in proc.stderr
    assert "Traceback" not in proc.stderr and not runs.exists()  # refused before the tokenizer wrote anything


@pytest.mark.parametrize("value", ["x", "0", "true", "-2"])
def test_num_processes_is_a_number_of_ranks_or_auto_in_one_message(value: str) -> None:
    with pytest.raises(UserError) as exc:
        load_config(None, [f"pretrain.num_processes={value}"])
    blamed, reason = str(exc.value).split(" is invalid: ", 1)
    assert blamed == f"--set pretrain.num_processes={value}"  # what the user typed, then the reason once
    assert reason.count("pretrain.num_processes") == 1
    assert "must be a number of ranks (1 or more) or auto" in reason


NO_GPU = not any(Path("/dev").glob("nvidia[0-9]*")) and not Path("/dev/kfd").exists()


@pytest.mark.skipif(not NO_GPU, reason="what a machine without a GPU says")
def test_days_of_pretraining_on_a_machine_without_a_gpu_are_said_before_any_stage(tmp_path: Path) -> None:
    """A GPU config where torch sees no GPU (a CPU build of torch, no driver) ran on the CPU ranks
    unsaid: the shipped GPU configs would have trained for most of a year."""
    from pipelines.stage_pretrain import cpu_run_note

    notes = {p.name: cpu_run_note(load_config(p)) for p in SHIPPED}
    assert {name for name, note in notes.items() if note} == {"bert-base-gpu.yaml", "bert-large-gpu.yaml"}
    assert "20,000 steps of 2,048 x 128 tokens of a 12-layer, 768-wide BERT" in notes["bert-base-gpu.yaml"]
    assert "days at the 0.12 TFLOP/s two CPU cores sustain" in notes["bert-base-gpu.yaml"]
    # the flow says it before its first stage (here a corpus file unlike its checksum then stops it)
    runs, sums = tmp_path / "runs", tmp_path / "SHA256SUMS"
    sums.write_text(f"{'0' * 64}  {load_config(None).data_path('data:wiki/summaries_en.txt')}\n")
    only = [f"--only={stage}" for stage in ("verify", "tokenizer", "preprocess", "pretrain")]
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "run", "configs/default.yaml", *only, "--set", f"run_dir={runs}",
         "pretrain.max_steps=1000000", "wandb.mode=disabled", "verify.checksums=true", f"verify.checksum_file={sums}"],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120, env=env_forbidding(["torch"]),
    )  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said[-3000:]
    assert "1,000,000 steps of 64 x 128 tokens of a 2-layer, 128-wide BERT" in said
    assert said.index("no GPU is visible") < said.index("summaries_en.txt is corrupt")
