"""The GPU check (benchmarks/gpu_check.py): its CPU dry run end to end, and the pieces it relies on
that can be checked without a GPU (varlen attention's packing, the summary merge, the wheel filter,
W&B disabled without wandb)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from common.paths import PROJECT_ROOT, torch_extensions_dir
from common.tracking import Tracker, WandbTarget, read_metrics
from tests.forbid_imports import env_forbidding

BENCH = PROJECT_ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu_check  # noqa: E402
import gpu_summary  # noqa: E402
from gpu_kernels import reference_varlen_attn, use_varlen_attention  # noqa: E402
from install_wheels import wanted  # noqa: E402

FORBIDDEN = ("wandb", "apache_beam", "prefect", "blingfire")  # not on the GPU image
MEASUREMENTS = {
    "pretrain_base_seq128", "hf_plain_loop_base_seq128", "ours_plain_loop_base_seq128",
    "pretrain_large_seq512", "pretrain_base_seq128_fp16", "pretrain_base_seq128_lamb",
    "pretrain_tiny_seq128_quality",
}  # fmt: skip
PROBES = {"ops", "sdpa_kernels", "attention_paths", "compile", "micro_batch_tiny_seq128",
          "micro_batch_tiny_seq512", "fp16_loss_scale", "finetune_unit", "quality"}  # fmt: skip


@pytest.fixture(scope="module")
def carry(tmp_path_factory, minilm_dir, data_dir) -> Path:
    """What `make gpu-check-prep` writes, from the fast shard fixtures (the prep's Beam runs are the
    preprocess stage's own tests' business)."""
    from gpu_check_prep import copy_glue

    from tests.shard_fixtures import make_shards, make_tokenizer_dir

    root = tmp_path_factory.mktemp("gpu-carry")
    tok = make_tokenizer_dir(minilm_dir, root / "tokenizer")
    for seq in (128, 512, 32):
        make_shards(root / f"shards-{seq}", tok, data_dir, num_docs=160, max_seq_length=seq)
    copy_glue(root / "data" / "glue")
    return root


@pytest.mark.gpu_dry_run  # ~100 s: `make gpu-check-prep` runs it, `make test` leaves it out (Makefile)
def test_dry_run_runs_every_part_without_the_packages_the_gpu_image_lacks(carry, tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = env_forbidding(FORBIDDEN)
    env["TORCH_EXTENSIONS_DIR"] = str(torch_extensions_dir())
    cmd = [sys.executable, str(BENCH / "gpu_check.py"), "--dry-run", "--carry", str(carry), "--out", str(out),
           "--work", str(work), "--peak-tflops", "1"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]

    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["dry_run"] and summary["device"].startswith("cpu")
    assert {k: p["status"] for k, p in summary["parts"].items()} == {k: "ok" for k in gpu_check.ESTIMATE_S}
    rows = {m["name"]: m for m in summary["measurements"]}
    assert set(rows) == MEASUREMENTS
    for name, row in rows.items():
        assert row["status"] == "ok", (name, row.get("error"))
        for key in gpu_summary.MEASUREMENT_KEYS:
            assert row[key] is not None, (name, key)
        assert row["tokens_per_s"] > 0 and row["samples_per_s"] > 0 and row["tflops"] > 0
        assert row["mfu_spec"] == pytest.approx(row["tflops"] / 1.0)
    assert rows["pretrain_large_seq512"]["seq"] == 512 and rows["pretrain_base_seq128"]["micro_batch"] == 4
    assert rows["pretrain_base_seq128_lamb"]["micro_batch"] == 2  # the plan's variant_micro_batch
    assert set(summary["probes"]) == PROBES
    assert summary["probes"]["micro_batch_tiny_seq128"]["chosen"] == 4
    fp16 = summary["probes"]["fp16_loss_scale"]
    assert fp16["steps_logged"] == 3 and fp16["non_finite_losses"] == 0 and fp16["loss_scale_changes"]
    paths = {r["path"] + f"@{r['dropout']}": r for r in summary["probes"]["attention_paths"]["rows"]}
    assert "median_step_ms" in paths["unpadded (ours)@0.1"] and "median_step_ms" in paths["padded layout@0.1"]
    varlen = paths["varlen_attn@0.0"]  # on CPU: an error (flash has no CPU kernel) or no padded batch
    assert "error" in varlen or varlen["loss_rel_diff_vs_unpadded"] < 1e-5
    assert summary["probes"]["compile"]["compiled"]["median_step_ms"] > 0
    finetune = summary["probes"]["finetune_unit"]
    models = [m["model_dir"] for m in summary["measurements"] if m.get("model_dir")]
    assert finetune["checkpoint"] == models[-2]  # the last before `quality`, which runs after it
    quality = summary["probes"]["quality"]
    assert "error" not in quality, quality.get("error")
    assert [step for step, _ in quality["seq128"]["held_out_mlm_acc"]] == [
        1,
        2,
        3,
    ]  # eval_every max(1, 3 // 4)
    assert quality["seq128"]["tokens"] == 3 * 4 * 128
    assert len(quality["glue_average"]) == 2  # the pretrained model and its random-init baseline
    assert quality["headline"]["glue_average_delta"] is not None
    assert quality["model_archive"] == "quality-model.tar.gz"  # the model, for CPU fine-tuning later
    with tarfile.open(out / quality["model_archive"]) as tar:
        assert {"model/config.json", "model/model.safetensors", "model/vocab.txt", "model/README.md"} <= set(
            tar.getnames()
        )
        # an export-hf of the run's model: its marker keeps the steps, for the scorecard's name
        assert json.load(tar.extractfile("model/_COMPLETE.json"))["pretraining_steps"] == [3]
    # one worker in the dry run: its units ran one after another, within the command's time
    assert 0 < quality["units_wall_s"] < quality["finetune_wall_s"]
    assert finetune["again_in_same_process"]["train_examples_per_s"] > 0
    assert finetune["again_in_same_process"]["metrics"] == finetune["metrics"]  # same unit, same seed
    assert summary["calls"][0]["env"]["matmul_tflops"] > 0
    # `make install`'s op build ran first, as on a GPU machine (there: FusedAdam; on CPU nothing)
    assert summary["calls"][0]["env"]["install_ops"].startswith("build_ops: nothing to build without a GPU")
    md = (out / "gpu_check.md").read_text()
    assert "Dry run on CPU" in md and all(name in md for name in MEASUREMENTS)
    assert "`make install`'s op build" in md


def test_varlen_attention_gives_the_unpadded_models_loss_and_gradients():
    """The varlen route (packed tokens + cumulative lengths, last layer on R query rows) computes the
    same function as the unpadded SDPA route; checked with varlen's contract in plain SDPA."""
    from model.config import BertConfig
    from model.heads import BertForPreTraining

    cfg = BertConfig.from_preset(
        "tiny", vocab_size=500, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    torch.manual_seed(0)
    model = BertForPreTraining(cfg)
    fast = use_varlen_attention(BertForPreTraining(cfg), attn=reference_varlen_attn)
    fast.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([12, 5, 9])
    ids = torch.randint(5, 500, (3, 12), generator=g)
    mask = (torch.arange(12)[None, :] < lengths[:, None]).long()
    positions = torch.tensor([[1, 3, 10], [2, 4, 0], [1, 8, 0]])
    labels = torch.tensor([[7, 8, 9], [10, 11, -100], [12, 13, -100]])
    batch = dict(input_ids=ids * mask, token_type_ids=torch.zeros_like(ids), attention_mask=mask,
                 masked_lm_positions=positions, masked_lm_labels=labels,
                 next_sentence_labels=torch.tensor([0, 1, 0]))  # fmt: skip
    ref, got = model(**batch), fast(**batch)
    ref.loss.backward()
    got.loss.backward()
    assert got.loss.item() == pytest.approx(ref.loss.item(), rel=1e-5)
    grads = dict(model.named_parameters())
    for name, p in fast.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)


def test_merge_joins_calls_and_keeps_a_part_that_ran_earlier():
    first = gpu_summary.new_summary(False, ["env", "base"])
    gpu_summary.add_part(first, "env", {"status": "ok", "seconds": 1.0}, {"device": "NVIDIA H100 80GB HBM3",
                         "env": {"torch": "2.11.0", "matmul_tflops": 790.0}})  # fmt: skip
    gpu_summary.add_part(first, "base", {"status": "ok", "seconds": 90.0},
                         {"measurements": [{"name": "pretrain_base_seq128", "tflops": 500.0}]})  # fmt: skip
    second = gpu_summary.new_summary(False, ["env", "base", "large"])
    gpu_summary.add_part(second, "env", {"status": "ok", "seconds": 1.0}, {"device": "NVIDIA H100 80GB HBM3"})
    gpu_summary.add_part(second, "base", {"status": "skipped", "seconds": 0.0}, {})
    gpu_summary.add_part(second, "large", {"status": "ok", "seconds": 200.0},
                         {"measurements": [{"name": "pretrain_large_seq512"}], "probes": {"x": {"a": 1}}})  # fmt: skip
    merged = gpu_summary.merge([first, second])
    assert len(merged["calls"]) == 2 and merged["device"] == "NVIDIA H100 80GB HBM3"
    assert merged["parts"]["base"] == {"status": "ok", "seconds": 90.0, "call": 0}
    assert merged["parts"]["large"]["call"] == 1
    assert [(m["name"], m["call"]) for m in merged["measurements"]] == [
        ("pretrain_base_seq128", 0), ("pretrain_large_seq512", 1)]  # fmt: skip
    assert all(k in m for m in merged["measurements"] for k in gpu_summary.MEASUREMENT_KEYS)
    assert merged["probes"]["x"] == {"a": 1, "call": 1}
    assert gpu_summary.default_stem(merged).endswith("-nvidia-h100-80gb-hbm3")
    assert "pretrain_large_seq512" in gpu_summary.render_markdown(merged)


def test_a_part_whose_rows_failed_is_recorded_failed_though_its_process_ended_well():
    # The first H200 run: base, fp16 and hf exited 0 with every row failed, and were listed "ok".
    summary = gpu_summary.new_summary(False, ["env", "hf", "finetune"])
    gpu_summary.add_part(summary, "hf", {"status": "ok", "seconds": 4.0}, {"measurements": [
        {"name": "hf_plain_loop_base_seq128", "status": "failed", "error": "Invalid device argument"},
        {"name": "ours_plain_loop_base_seq128", "status": "ok"}]})  # fmt: skip
    gpu_summary.add_part(summary, "finetune", {"status": "ok", "seconds": 40.0},
                         {"probes": {"finetune_unit": {"metrics": {"accuracy": 50.9}}}})  # fmt: skip
    assert summary["parts"]["hf"]["status"] == "failed"
    assert "hf_plain_loop_base_seq128" in summary["parts"]["hf"]["error"]
    assert "ours_plain_loop" not in summary["parts"]["hf"]["error"]
    assert summary["parts"]["finetune"]["status"] == "ok"


def test_missing_carry_is_one_message_naming_the_prep_target(tmp_path, capsys):
    rc = gpu_check.main(["--dry-run", "--carry", str(tmp_path / "none"), "--out", str(tmp_path / "out"),
                         "--work", str(tmp_path / "work"), "--parts", "base,large,quality"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "shards-512/manifest.json" in err and "make gpu-check-prep" in err
    assert "data/glue/STS-B/train.tsv" in err  # quality fine-tunes on the five GLUE tasks
    assert not (tmp_path / "out").exists()


def test_the_gpu_plan_without_a_gpu_is_one_message_naming_the_dry_run(carry, tmp_path, capsys):
    rc = gpu_check.main(
        ["--carry", str(carry), "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]
    )
    assert rc == 2 and "--dry-run" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_misspelled_quality_finetune_flags_are_one_message_before_any_work(
    carry, tmp_path, capsys, monkeypatch
):
    """GPU_CHECK_QUALITY_FINETUNE's flags go to `bertflow finetune` after minutes of pretraining on
    the GPU: one the command does not take is refused first, naming the variable and the flag
    (before the no-GPU message this machine would give)."""
    from gpu_context import gpu_plan

    plan = gpu_plan({"GPU_CHECK_QUALITY_FINETUNE": "--max-train-examples 4000 --lrs 1e-4,3e-4"})
    monkeypatch.setattr(gpu_check, "GPU_PLAN", plan)
    rc = gpu_check.main(["--carry", str(carry), "--out", str(tmp_path / "out"), "--work",
                         str(tmp_path / "work"), "--parts", "quality"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "GPU_CHECK_QUALITY_FINETUNE" in err and "--lrs" in err and "--dry-run" not in err
    assert not (tmp_path / "out").exists()
    good = gpu_plan({"GPU_CHECK_QUALITY_FINETUNE": "--lr 1e-4,3e-4 --set finetune.max_eval_examples=null"})
    assert good.quality_finetune == ("--lr", "1e-4,3e-4", "--set", "finetune.max_eval_examples=null")
    assert gpu_check.check_quality_flags(["quality"], good.quality_finetune) is None
    assert gpu_check.check_quality_flags(["base"], plan.quality_finetune) is None  # no quality, no check
    # a flag the parser takes with a value the command refuses, by --set or by flag
    for flags, named in ((("--set", "finetune.lrs=fast"),  "finetune.lrs"), (("--lr", "abc"), "--lr"),
                         (("--set", "finetune.epochs=-1"), "epochs"), (("--tasks", "sst3"), "sst3")):  # fmt: skip
        problem = gpu_check.check_quality_flags(["quality"], flags)
        assert problem and problem.startswith("GPU_CHECK_QUALITY_FINETUNE=") and named in problem, problem


def test_the_quality_finetune_flags_reach_the_command_and_its_record(tmp_path, monkeypatch):
    import gpu_stage_parts
    from gpu_context import Context, gpu_plan

    commands = []
    monkeypatch.setattr(
        gpu_stage_parts, "run_logged", lambda cmd, **kw: commands.append(cmd) or (1, "failed")
    )
    plan = gpu_plan({"GPU_CHECK_QUALITY_FINETUNE": "--lr 1e-4,3e-4 --workers 6"})
    found = gpu_stage_parts.finetune_scorecard(Context(plan, tmp_path, tmp_path, {}, deadline=1e12), "m")
    assert commands[0][-4:] == ["--lr", "1e-4,3e-4", "--workers", "6"]
    assert found["finetune_flags"] == ["--lr", "1e-4,3e-4", "--workers", "6"] and "error" in found


def test_wheel_filter_installs_only_what_is_missing_or_older():
    from importlib.metadata import version

    have = version("pydantic")
    wheels = [Path(f"pydantic-{have}-py3-none-any.whl"), Path("pydantic-999.0-py3-none-any.whl"),
              Path("no_such_dist_bertflow-1.0-py3-none-any.whl")]  # fmt: skip
    install, skipped = wanted(wheels)
    assert [w.name for w in install] == [wheels[1].name, wheels[2].name]
    assert skipped == [f"pydantic {have} (have {have})"]


def test_tracker_disabled_logs_metrics_without_importing_wandb(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails, as on the GPU image
    tracker = Tracker(tmp_path, WandbTarget(mode="disabled"))
    tracker.log({"loss": 1.5}, step=3)
    tracker.summary({"x": 1})
    tracker.finish()
    [row] = read_metrics(tmp_path)
    assert row == {"step": 3, "_timestamp": row["_timestamp"], "loss": 1.5}
    assert not (tmp_path / "wandb_files").exists()


def test_the_quality_parts_second_phase_starts_from_the_first_and_is_what_gets_fine_tuned(
    tmp_path, monkeypatch
):
    """The GPU plan's two phases, which the dry run leaves out for the suite's time: the 128-token
    phase starts from the 32-token phase's model, and the fine-tuning gets the second model; both
    run at ZeRO 0. The stage runs are recorded instead of launched (`bertflow pretrain --set pretrain.init_from` itself
    is test_phases.py's)."""
    import gpu_stage_parts
    from gpu_context import GPU_PLAN, Context

    launched, tuned = [], []

    def fake_stage(ctx, name, preset, seq, precision, micro, steps, *sets, **kw):
        launched.append((name, seq, micro, steps, [s for s in sets if "init_from" in s]))
        assert kw["zero_stage"] == 0  # as `make run` resolves it on one GPU, not the plan's ZeRO 2
        assert "pretrain.warmup_steps=300" in sets  # configs/cpu-hour.yaml's, in both phases
        return {"status": "ok", "micro_batch": micro, "stage_wall_s": 1.0, "run_dir": str(tmp_path / name),
                "model_dir": str(tmp_path / name / "model")}  # fmt: skip

    monkeypatch.setattr(gpu_stage_parts, "run_stage", fake_stage)
    monkeypatch.setattr(gpu_stage_parts, "finetune_scorecard", lambda ctx, model: tuned.append(model) or {})
    ctx = Context(GPU_PLAN, tmp_path, tmp_path, {}, deadline=0.0)
    result = gpu_stage_parts.part_quality(ctx)
    warm = GPU_PLAN.stage_warmup
    assert launched == [
        ("pretrain_tiny_seq32_quality", 32, 128, 3000 - warm, []),
        ("pretrain_tiny_seq128_quality", 128, 64, 8500 - warm,
         [f"pretrain.init_from={tmp_path / 'pretrain_tiny_seq32_quality' / 'model'}"]),
    ]  # fmt: skip
    assert tuned == [str(tmp_path / "pretrain_tiny_seq128_quality" / "model")]
    assert result["probes"]["quality"]["seq32"]["tokens"] == 3000 * 128 * 32


def test_a_cut_short_fine_tuning_still_gives_the_scorecard_of_its_finished_units(tmp_path):
    """The first GPU quality run lost its scorecard when the call's time ended one unit of 30
    before the end; the part now scores the units that finished (marker and result on disk)."""
    from gpu_stage_parts import finished_units_scorecard

    from common.atomic import write_marker

    assert finished_units_scorecard(tmp_path) is None
    for label, kind, accuracy in (
        ("ours", "pretrained", 80.0),
        ("random:ours", "random", 70.0),
        ("x", "random", 0),
    ):
        unit = tmp_path / "units" / f"sst2-lr0.001-s1__{label.replace(':', '_')}"
        unit.mkdir(parents=True)
        result = {"unit": "sst2-lr0.001-s1", "task": "sst2", "metric_names": ["accuracy"],
                  "metrics": {"accuracy": accuracy}, "score": accuracy, "lr": 1e-3, "seed": 1,
                  "checkpoint": "/m/" + label, "checkpoint_label": label, "checkpoint_kind": kind, "glue": True,
                  "n_train": 10, "n_eval": 5, "epochs": 1.0, "max_seq_length": 64, "train_examples_per_s": 1.0}  # fmt: skip
        (unit / "result.json").write_text(json.dumps(result))
        if label != "x":  # the unit the time ran out on: no marker
            write_marker(unit)
    card = finished_units_scorecard(tmp_path)
    assert card["units_finished"] == 2 and [r["checkpoint"] for r in card["rows"]] == ["ours", "random:ours"]
    assert card["headline"]["glue_average_delta"] == pytest.approx(10.0)
    assert (tmp_path / "scorecard.md").is_file()


def test_the_documented_device_calls_cover_every_part_within_one_calls_budget():
    """Each documented call must fit the 10-minute device call (budget 540 s by the part estimates),
    and together they run every part once."""
    args = gpu_check.parse_args([])
    seen = []
    for call in gpu_check.CALLS:
        parts = ["env", *call.split(",")]
        assert sum(gpu_check.ESTIMATE_S[p] for p in parts) <= args.budget_s, call
        seen += call.split(",")
    assert sorted(seen) == sorted(p for p in gpu_check.ESTIMATE_S if p != "env")
    assert set(gpu_check.ESTIMATE_S) == set(gpu_check.PARTS)


@pytest.mark.parametrize("name", ["pretrain_base_seq128_lamb", "pretrain_base_seq128_muon",
                                  "pretrain_base_seq128_zero3", "pretrain_base_seq128_offload"])  # fmt: skip
def test_each_gpu_variant_is_a_config_the_stage_accepts_for_one_gpu(name):
    """The dry run launches only LAMB's variant; the others must not be refused on the GPU, where
    a refused config would cost device time to find out."""
    from gpu_stage_parts import VARIANTS

    from pipelines.config import load_config
    from training.ds_config import build_ds_config

    stage, sets, _ = VARIANTS[name]
    settings = ["model.preset=base", "pretrain.num_processes=1", f"pretrain.zero_stage={stage}", "pretrain.precision=bf16"]  # fmt: skip
    cfg = load_config(None, [*settings, *sets]).pretrain  # run_stage's order: the variant's settings last
    ds = build_ds_config(cfg, world_size=1, on_gpu=True, bf16_ok=True)
    assert ds["zero_optimization"]["stage"] == stage
    assert ds["bf16"]["enabled"]


def test_window_figures_weigh_each_steps_fractions_by_its_time():
    """The stage rows' data-wait and loader-busy shares over the timed window: a slow step's share
    counts for more, as it does in the wall time (one 3 s step at 50 % and one 1 s step at 10 %)."""
    from gpu_stage_parts import window_figures

    rows = [{"step_time_s": t, "tokens_per_s": 1.0, "samples_per_s": 1.0, "tflops": 1.0,
             "data_wait_fraction": f / 10, "loader_busy_fraction": f} for t, f in ((3.0, 0.5), (1.0, 0.1))]  # fmt: skip
    figures = window_figures(rows)
    assert figures["loader_busy_fraction"] == pytest.approx(0.4)
    assert figures["data_wait_fraction"] == pytest.approx(0.04)
    assert figures["median_step_s"] == 3.0 and figures["timed_steps"] == 2


def test_prep_refuses_a_shard_length_it_cannot_write_before_building_anything(tmp_path):
    """`gpu_check_prep.py --seqs` picks the shard lengths (`quality` needs 32 and 128 only); one it
    has no prediction count for is refused before the wheels' build or any Beam job."""
    import gpu_check_prep

    from common.errors import UserError

    with pytest.raises(UserError, match=r"--seqs 32,64: .*\[64\]"):
        gpu_check_prep.main(["--seqs", "32,64", "--out", str(tmp_path / "carry")])
    assert not (tmp_path / "carry").exists()


def test_prep_can_carry_the_one_hour_recipes_own_vocabulary(tmp_path, monkeypatch):
    """`--tokenizer cpu-hour` runs the tokenizer stage with configs/cpu-hour.yaml's section (16,384
    WordPieces trained on `AA`), so a GPU quality run can differ from the CPU hour only in corpus and
    hardware; the default loads bert-base-uncased's vocabulary. The stage run is recorded, not run."""
    import gpu_check_prep

    import pipelines.stage_tokenizer

    seen = []
    monkeypatch.setattr(
        pipelines.stage_tokenizer, "run_tokenizer_stage", lambda cfg, out: seen.append(cfg) or out
    )
    gpu_check_prep.build_tokenizer(tmp_path, "cpu-hour")
    gpu_check_prep.build_tokenizer(tmp_path, "bert-base-uncased")
    assert (
        seen[0].vocab is None
        and seen[0].vocab_size == 16384
        and seen[0].input == ["data:wiki/enwiki-2015/AA/wiki_*.gz"]
    )
    assert seen[1].vocab.endswith("vocab.txt")


def test_the_flow_carry_holds_every_runtime_package_the_gpu_image_lacks_and_leaves_it_torch():
    """`gpu_flow_prep.runtime_closure`: the project's run-time dependencies for the GPU's CPython 3.12,
    with the extras each requirement names (the first carry without them failed on the GPU machine:
    Prefect's server needs greenlet through `sqlalchemy[asyncio]`), less what the image keeps."""
    from gpu_flow_prep import runtime_closure

    closure = runtime_closure()
    for needed in ("prefect", "apache-beam", "deepspeed", "wandb", "pydantic", "blingfire", "greenlet", "h2"):
        assert needed in closure, needed
    for kept in ("torch", "numpy", "pyarrow", "tokenizers", "grpcio"):
        assert kept not in closure, kept
    assert "dask" not in closure and "boto3" not in closure  # Beam's extras a flow on one machine never loads
