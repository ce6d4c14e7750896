"""End-to-end pretraining runs: real DeepSpeed engines on 2 gloo processes, real-text shards.

One reference run (ZeRO-2, 12 steps) is shared by the tests; the others are compared with it:
loss goes down, the export loads in transformers, kill -9 + rerun (Muon, under other run-only
settings; two nodes) reproduces every loss exactly, ZeRO-1 and ZeRO-3 reach the same weights.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import socket
import time

import psutil
import pytest
import torch

from common.atomic import read_marker
from common.errors import UserError
from common.fingerprint import digest
from common.tracking import read_metrics
from model.hf_io import load_pretraining_model, read_state_dict
from pipelines.stage_pretrain import run_pretrain_stage
from tests.pretrain_runs import (
    config,
    kill_tree,
    losses,
    settings,
    start_cli,
    start_piped_until_step,
    wait_for,
)
from tests.shard_fixtures import make_shards, make_tokenizer_dir
from tests.wandb_records import by_step, exit_code, history, summary
from training import checkpoint
from training.consolidate import load_model_from_deepspeed_checkpoint
from training.launch import free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data(tmp_path_factory, minilm_dir, data_dir):
    root = tmp_path_factory.mktemp("pretrain-data")
    tok = make_tokenizer_dir(minilm_dir, root / "tok")
    return make_shards(root / "shards", tok, data_dir, num_docs=600), tok


@pytest.fixture(scope="module")
def ref_run(tmp_path_factory, data):
    shards, tok = data
    out = tmp_path_factory.mktemp("ref") / "run"
    lines: list[str] = []
    model_dir = run_pretrain_stage(config(), shards, tok, out, log_line=lines.append)
    return out, model_dir, lines


def test_zero2_two_processes_lowers_the_loss(ref_run):
    out, model_dir, lines = ref_run
    loss = losses(out)
    assert sorted(loss) == list(range(1, 13))
    first, last = sum(loss[s] for s in (1, 2, 3)) / 3, sum(loss[s] for s in (10, 11, 12)) / 3
    # the MLM bias starts at the targets' unigram prior: the first loss is near the unigram entropy
    # (+ ln 2 for NSP), far below a uniform guess over 30,522 tokens (10.3 + 0.7 nats)
    assert loss[1] < 7.0 and last < first - 0.3, loss
    rows = {
        (r["step"], k): v
        for r in __import__("common.tracking").tracking.read_metrics(out)
        for k, v in r.items()
    }
    for key in ("mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "lr", "grad_norm", "loss_scale", "samples_per_s",
                "tokens_per_s", "tflops", "memory_mb", "data_wait_fraction", "loader_busy_fraction"):  # fmt: skip
        assert (12, key) in rows, key
    assert 0.0 <= rows[(12, "data_wait_fraction")] < 1.0
    assert 0.0 < rows[(12, "loader_busy_fraction")] < 1.0  # the thread collated this window's batches
    assert rows[(12, "tokens_per_s")] > 0 and rows[(12, "tflops")] > 0
    assert (6, "val_mlm_acc") in rows and (12, "val_nsp_acc") in rows
    assert rows[(12, "val_mlm_loss")] < rows[(6, "val_mlm_loss")]  # held-out MLM improves too
    assert rows[(2, "lr")] == pytest.approx(0.002)  # end of warmup
    assert by_step(history(out), "_step") == by_step(read_metrics(out), "step")  # W&B got every row
    assert any("launch:" in ln and "torch.distributed.run" in ln for ln in lines)  # launcher auto, one node
    assert "pretrain: starting 2 ranks; each imports torch" in "\n".join(lines)  # not 40 s of silence
    # checkpoints: every 4 steps, each verified
    tags = [t.name for t in checkpoint.tag_dirs(out / "checkpoints")]
    assert tags == ["global_step12", "global_step8", "global_step4"]
    assert all(checkpoint.verify(t) is None for t in checkpoint.tag_dirs(out / "checkpoints"))
    # each records its ranks' torch threads (a resume under another count says it cannot match)
    from training.launch import cpu_threads_per_rank

    newest = checkpoint.read_verification(out / "checkpoints" / "global_step12")
    assert newest["cpu_threads"] == cpu_threads_per_rank(2)
    assert (out / "_COMPLETE.json").is_file() and model_dir == out / "model"
    # the ranks read a per-node memory-mapped cache, built once and removed once the run completes
    assert any("data cache ready" in ln for ln in lines) and not (out / "data_cache").exists()


def test_export_loads_in_transformers_with_no_missing_keys(ref_run):
    from transformers import AutoTokenizer, BertForPreTraining

    _, model_dir, _ = ref_run
    hf, info = BertForPreTraining.from_pretrained(model_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ours, missing = load_pretraining_model(model_dir)
    assert not missing
    tok = AutoTokenizer.from_pretrained(model_dir)
    enc = tok(["the cat sat on the mat.", "a longer second sentence about the history of europe."],
              padding=True, return_tensors="pt")  # fmt: skip
    hf.eval(), ours.eval()
    with torch.no_grad():
        ref = hf(**enc)
        out = ours(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"])
    assert torch.allclose(out.nsp_logits, ref.seq_relationship_logits, atol=1e-4)
    assert torch.allclose(
        out.mlm_logits, ref.prediction_logits.reshape(-1, ref.prediction_logits.shape[-1]), atol=1e-3
    )


def test_model_dir_has_a_card_the_trained_length_and_works_in_fill_mask(ref_run):
    """What a person gets: README.md saying what went in and how good it is, a tokenizer that
    truncates at the length the model was trained at, and `pipeline("fill-mask")` working."""
    import json
    import stat

    from transformers import pipeline

    _, model_dir, lines = ref_run
    card = (model_dir / "README.md").read_text()
    # the stage's own output says what the card's verdict says (12 steps: near the unigram plateau)
    said = any("is not below the unigram entropy" in line for line in lines)
    assert said == ("The masked-LM loss is not below the unigram entropy" in card), lines[-5:]
    assert "pretrained" in card and "12 optimizer steps × 16 sequences" in card
    assert "| masked-LM accuracy |" in card and "(unigram entropy)" in card and "held-out" in card
    assert "Examples: " in card and f'pipeline("fill-mask", model="{model_dir}")' in card
    assert json.loads((model_dir / "tokenizer_config.json").read_text())["model_max_length"] == 128
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in model_dir.iterdir()}
    assert len(set(modes.values())) == 1, modes  # model.safetensors as readable as its siblings
    predictions = pipeline("fill-mask", model=str(model_dir))("the history of [MASK] is long.")
    assert len(predictions) == 5 and all(p["token_str"] for p in predictions)


def test_export_hf_cli_consolidates_the_deepspeed_checkpoint(ref_run, tmp_path):
    """`bertflow export-hf <pretrain output dir>` merges the ZeRO-2 partitions of the newest checkpoint
    into the same weights the stage itself exported at the end."""
    from safetensors.torch import load_file

    from pipelines.cli import main as cli

    out, model_dir, _ = ref_run
    assert cli(["export-hf", str(out), str(tmp_path / "hf")]) == 0
    exported, final = (
        load_file(tmp_path / "hf" / "model.safetensors"),
        load_file(model_dir / "model.safetensors"),
    )
    assert exported.keys() == final.keys()
    for key in final:
        torch.testing.assert_close(exported[key], final[key], rtol=0, atol=0, msg=key)
    assert (tmp_path / "hf" / "vocab.txt").read_bytes() == (model_dir / "vocab.txt").read_bytes()
    card = (tmp_path / "hf" / "README.md").read_text()  # the export carries the run's facts
    assert "| masked-LM accuracy |" in card and f"exported from: `{out}`" in card
    # which checkpoint the run dir was read as, as an export of the tag itself says
    assert f"- pretraining output: `{out}`\n- checkpoint: `global_step12` (step 12 of the run)\n" in card


def test_the_exported_model_scores_what_training_logged_last(ref_run, data):
    """The stage's model.safetensors, consolidated from ZeRO-2's two partitions, is the model that
    training evaluated at its last step: `bertflow evaluate` of it on the same held-out examples
    (eval_batches global batches, the split's first ones) gives the figures the run logged."""
    from pipelines.evaluate_command import evaluate_checkpoint
    from training.data import eval_example_count, load_split

    out, model_dir, _ = ref_run
    shards, _ = data
    p = config().pretrain
    n = len(load_split(shards, "validation"))
    examples = eval_example_count(n, p.micro_batch_size, p.num_processes, p.eval_batches)
    assert 0 < examples <= n
    logged = [r for r in read_metrics(out) if "val_mlm_acc" in r][-1]
    assert logged["step"] == p.max_steps
    again = evaluate_checkpoint(model_dir, shards, max_examples=examples)["metrics"]
    for key in ("val_mlm_acc", "val_mlm_loss", "val_nsp_acc", "val_nsp_loss"):
        assert again[key] == pytest.approx(logged[key], rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize(("ranks", "zero_stage"), [(1, 0), (2, 2)])  # ZeRO 2: the default on several GPUs
def test_a_bf16_run_exports_its_fp32_master_weights_not_the_rounded_module(tmp_path, data, ranks, zero_stage):
    """In bf16 DeepSpeed trains fp32 master weights and keeps a bf16 copy in the module. The export
    used to take the rounded module: ZeRO 2's partitions are named `bf16_zero_pp_rank_*` (missed by
    the glob), and ZeRO 0 keeps its masters only in the optimizer state. Every exported value was
    then a bf16 number; the fp32 masters almost never are."""
    from safetensors.torch import load_file

    cfg = config(
        f"pretrain.num_processes={ranks}",
        f"pretrain.zero_stage={zero_stage}",
        "pretrain.precision=bf16",
        "pretrain.max_steps=4",
    )
    model_dir = run_pretrain_stage(cfg, *data, tmp_path / "run", log_line=lambda line: None)
    assert (
        json.loads((tmp_path / "run" / "run_spec.json").read_text())["ds_config"]["zero_optimization"][
            "stage"
        ]
        == zero_stage
    )
    weights = load_file(model_dir / "model.safetensors")
    rounded = sum(int((w == w.bfloat16().float()).sum()) for w in weights.values())
    assert rounded < 0.01 * sum(w.numel() for w in weights.values())
    assert weights["bert.embeddings.word_embeddings.weight"].dtype == torch.float32


def test_export_hf_finds_the_runs_tokenizer_from_any_checkpoint_path(ref_run, tmp_path, capsys):
    """RUN/checkpoints and RUN/checkpoints/global_stepN find RUN/model's tokenizer (the first was
    refused with 'has no tokenizer'); a run with no model/ yet, the one its run_spec.json names."""
    from pipelines.cli import main as cli

    out, model_dir, _ = ref_run
    vocab = (model_dir / "vocab.txt").read_bytes()
    for i, path in enumerate((out / "checkpoints", out / "checkpoints" / "global_step12")):
        assert cli(["export-hf", str(path), str(tmp_path / f"hf{i}")]) == 0
        assert (tmp_path / f"hf{i}" / "vocab.txt").read_bytes() == vocab
        assert (
            f"exported {path} (DeepSpeed checkpoint global_step12) ->" in capsys.readouterr().out
        )  # which step
    under_way = tmp_path / "under-way"
    shutil.copytree(out, under_way, ignore=shutil.ignore_patterns("model"))
    assert cli(["export-hf", str(under_way / "checkpoints"), str(tmp_path / "hf-under-way")]) == 0
    assert (tmp_path / "hf-under-way" / "vocab.txt").read_bytes() == vocab


def test_model_info_describes_what_evaluate_and_export_hf_read(ref_run, capsys):
    """`bertflow model-info` takes the pretraining output, its checkpoints/ and one global_stepN, as
    evaluate and export-hf do (it refused them: 'config.json is missing'), describing the checkpoint
    they read, with the counts of the run's model/."""
    from pipelines.cli import main as cli

    out, model_dir, _ = ref_run
    assert cli(["model-info", str(model_dir)]) == 0
    counts = capsys.readouterr().out.split("\n", 1)[1]
    for path in (out, out / "checkpoints", out / "checkpoints" / "global_step12"):
        assert cli(["model-info", str(path)]) == 0, capsys.readouterr().err
        printed = capsys.readouterr().out
        assert printed.startswith(f"{path} (DeepSpeed checkpoint global_step12): BERT L=2 H=128"), printed
        assert printed.split("\n", 1)[1] == counts


def test_export_hf_of_a_run_whose_tokenizer_outgrew_the_model_takes_the_one_given(ref_run, tmp_path, capsys):
    """A run whose model/ tokenizer was written over by a larger one: refused naming both sizes, and
    `--tokenizer` with the one it was trained with is taken (it was refused as 'differs from it')."""
    from pipelines.cli import main as cli

    out, model_dir, _ = ref_run
    run = tmp_path / "run"
    shutil.copytree(out, run)
    (run / "model" / "tokenizer.json").unlink()
    words = (model_dir / "vocab.txt").read_text()
    rows = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    (run / "model" / "vocab.txt").write_text(words + "".join(f"extra{i}\n" for i in range(rows + 5)))
    tag = str(run / "checkpoints" / "global_step12")
    assert cli(["export-hf", tag, str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert f"has {rows + 5 + len(words.splitlines()):,} tokens but the model's vocab_size is {rows:,}" in err
    assert "--tokenizer DIR" in err
    assert cli(["export-hf", tag, str(tmp_path / "b"), "--tokenizer", str(model_dir)]) == 0
    assert "does not fit the model (the tokenizer has" in capsys.readouterr().out
    assert (tmp_path / "b" / "vocab.txt").read_text() == words


def test_export_hf_refuses_a_damaged_tag_or_weights_that_do_not_fit_the_recorded_shape(
    ref_run, tmp_path, capsys
):
    """A tag named by hand is verified first (a flipped byte is refused, not exported), and the
    weights must fill the model its `_VERIFIED.json` records (a config with fewer layers than the
    weights would otherwise export a truncated model)."""
    from pipelines.cli import main as cli

    out, model_dir, _ = ref_run
    tok = ["--tokenizer", str(model_dir)]
    flipped = tmp_path / "flipped"
    shutil.copytree(out / "checkpoints" / "global_step12", flipped / "global_step12")
    module = flipped / "global_step12" / "mp_rank_00_model_states.pt"
    data = bytearray(module.read_bytes())
    data[len(data) // 2] ^= 0xFF
    module.write_bytes(bytes(data))
    assert cli(["export-hf", str(flipped / "global_step12"), str(tmp_path / "a"), *tok]) == 2
    assert "is not usable" in capsys.readouterr().err and not (tmp_path / "a").exists()

    shallow = tmp_path / "shallow"
    shutil.copytree(out / "checkpoints" / "global_step12", shallow / "global_step12")
    verified = shallow / "global_step12" / checkpoint.VERIFIED_NAME
    info = json.loads(verified.read_text())
    info["model_config"]["num_hidden_layers"] = 1
    verified.write_text(json.dumps(info))
    assert cli(["export-hf", str(shallow / "global_step12"), str(tmp_path / "b"), *tok]) == 2
    err = capsys.readouterr().err
    assert "do not fit the recorded model config" in err and "encoder.layer.1" in err
    assert not (tmp_path / "b").exists()


def test_each_rank_draws_its_own_dropout_stream(ref_run):
    """Ranks are seeded seed + 1000 × rank: with one seed for all, every rank would drop the same
    units of its examples (their RNG states, saved with each checkpoint, would be equal)."""
    tag = ref_run[0] / "checkpoints" / "global_step12"
    states = [torch.load(checkpoint.rng_file(tag, r), weights_only=False) for r in (0, 1)]
    assert not torch.equal(states[0]["torch"], states[1]["torch"])


def test_rerun_after_completion_is_a_no_op(ref_run, data):
    out, _, _ = ref_run
    before = (out / "metrics.jsonl").read_bytes()
    lines: list[str] = []
    run_pretrain_stage(config(), *data, out, log_line=lines.append)
    assert any("already complete" in ln for ln in lines)
    assert not any(ln.startswith("launch:") or "other code" in ln or "not applied" in ln for ln in lines)
    assert (out / "metrics.jsonl").read_bytes() == before

    # other values of the run-only settings that show in the output: reused as it is, and said
    lines.clear()
    other = config("pretrain.eval_every=3", "pretrain.keep_checkpoints=5")
    run_pretrain_stage(other, *data, out, log_line=lines.append)
    run_pretrain_stage(other, *data, out, log_line=lines.append, own_output=True)
    made = json.loads((out / "run_spec.json").read_text())["pretrain"]
    # the flow's folder of the config: its flow command, as the note on other code gives (it said
    # "delete OUT (or choose another --output)" there too); the user's --output: delete it
    assert [ln for ln in lines if "not applied" in ln] == [
        f"warning: pretrain: reusing the finished run in {out}, which was made with pretrain.eval_every "
        f"{made['eval_every']} (this run: 3), pretrain.keep_checkpoints {made['keep_checkpoints']} (this "
        "run: 5). These settings are not applied to it: they change what the run logged and kept (the "
        f"curve, the checkpoints), not the model, so the stage key is the same. To apply them, {how}"
        for how in (
            f"rerun with `{other.command_line('run', '--force', 'pretrain')}` (it trains again).",
            f"delete {out} (or choose another --output) and run again.",
        )
    ]
    assert (out / "metrics.jsonl").read_bytes() == before

    # made by other code (as if by an older version): still reused, and said, with the file
    marker_path = out / "_COMPLETE.json"
    original = marker_path.read_text()
    marker = json.loads(original)
    marker["code"]["training/train.py"] = "0" * 16
    marker_path.write_text(json.dumps(marker))
    lines.clear()
    try:
        run_pretrain_stage(config(), *data, out, log_line=lines.append)
        # a `bertflow pretrain --output` of the user's: no flow writes it, deleting it recomputes it
        run_pretrain_stage(config(), *data, out, log_line=lines.append, own_output=True)
    finally:
        marker_path.write_text(original)
    # the flow's folder of the config (its --set items too), or the user's --output
    assert [ln for ln in lines if "other code" in ln] == [
        f"pretrain: reusing {out} made by other code (changed since: training/train.py); "
        f"to recompute with this code: {how}"
        for how in (
            config().command_line("run", "--force", "pretrain"),
            f"delete {out} and run this command again",
        )
    ]
    assert (out / "metrics.jsonl").read_bytes() == before


def test_a_finished_run_whose_model_was_deleted_writes_it_again(ref_run, data, tmp_path):
    """Not "a finished pretraining run with other settings" (naming none) and the advice to delete
    the whole run: the same settings resume at the end and export the model again."""
    out, _, _ = ref_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "model")
    lines: list[str] = []
    run_pretrain_stage(config(), *data, copy, log_line=lines.append)
    assert any("has no model/; writing it again from the last checkpoint" in ln for ln in lines)
    original, again = (read_state_dict(d / "model") for d in (out, copy))
    assert original.keys() == again.keys() and all(torch.equal(original[k], again[k]) for k in original)
    assert read_marker(copy) is not None and read_metrics(copy) == read_metrics(out)


def test_muon_and_dynamic_masks_kill_9_then_rerun_with_other_run_only_settings_reproduces_every_loss_exactly(
    ref_run, data, tmp_path
):
    """optimizer muon (ZeRO 0, DeepSpeed's MuonWithAuxAdam) with dynamic masking trains; kill -9
    after checkpoint 8, and a rerun under other run-only settings (PretrainConfig.run_only: out of
    the stage key, so the flow resumes this output under them) gives every loss and weight of the
    uninterrupted run: Muon's momentum is in the checkpoint, the masks are drawn again the same.
    (ZeRO-2 AdamW runs resume bit-exact after kill -9 and SIGTERM in the two-node tests below.)"""
    shards, tok = data
    muon = (
        "pretrain.optimizer=muon",
        "pretrain.zero_stage=0",
        "pretrain.muon_lr=0.01",
        "pretrain.dynamic_masking=true",
    )
    ref, out = tmp_path / "ref", tmp_path / "run"
    run_pretrain_stage(config(*muon), shards, tok, ref, log_line=lambda _: None)
    ref_losses = losses(ref)
    assert ref_losses[12] < ref_losses[1] - 0.3
    # the same initial weights and examples as the static-mask AdamW run: another first loss can
    # only come from other masks
    assert ref_losses[1] != losses(ref_run[0])[1]
    proc = start_cli(shards, tok, out, settings(*muon), BERTFLOW_DEBUG_STEP_DELAY_S="0.3")
    wait_for(out / "checkpoints" / "global_step8" / checkpoint.VERIFIED_NAME, proc)
    kill_tree(proc)
    assert not (out / "model").exists() and not (out / "_COMPLETE.json").exists()
    run_only = [
        "pretrain.log_every=2", "pretrain.eval_every=3", "pretrain.checkpoint_every=3",
        "pretrain.keep_checkpoints=2", "pretrain.prefetch_batches=1", "pretrain.dist_timeout_s=300",
        f"pretrain.master_port={free_port()}", "pretrain.peak_tflops=50", "pretrain.launcher=deepspeed",
        f"pretrain.data_cache_dir={tmp_path / 'cache'}",
    ]  # fmt: skip
    lines: list[str] = []
    run_pretrain_stage(config(*muon, *run_only), shards, tok, out, log_line=lines.append)
    assert any("resumed from" in ln and "global_step8" in ln for ln in lines)
    # keep_checkpoints 2: each older one is removed once the new one is saved and verified, and said
    # in that order (the removal was said first, as if it came before the save)
    said = [re.search(r"(saved checkpoint|removed old checkpoint) .*?(global_step\d+)$", ln) for ln in lines]
    assert [f"{m[1]} {m[2]}" for m in said if m] == [
        "saved checkpoint global_step9", "removed old checkpoint global_step4",
        "saved checkpoint global_step12", "removed old checkpoint global_step8",
    ], lines  # fmt: skip
    launches = [ln for ln in lines if ln.startswith("launch:")]
    assert "deepspeed.launcher.runner" in launches[0]  # the killed run ran under torchrun
    resumed = losses(out)
    assert set(range(1, 9)) | {10, 12} <= set(resumed)
    assert all(resumed[step] == ref_losses[step] for step in resumed)  # bit-exact
    assert (tmp_path / "cache").is_dir()
    a, b = read_state_dict(ref / "model"), read_state_dict(out / "model")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("stage,launcher", [(1, "deepspeed"), (3, "auto")])
def test_zero_stages_reach_the_same_weights(ref_run, data, tmp_path, stage, launcher):
    ref_out, ref_model, _ = ref_run
    out = tmp_path / f"zero{stage}"
    run_pretrain_stage(config(f"pretrain.zero_stage={stage}", f"pretrain.launcher={launcher}"), *data, out,
                       log_line=lambda _: None)  # fmt: skip
    for tag in ("global_step4", "global_step12"):
        a = load_model_from_deepspeed_checkpoint(ref_out / "checkpoints" / tag).state_dict()
        b = load_model_from_deepspeed_checkpoint(out / "checkpoints" / tag).state_dict()
        for k in a:
            assert torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-5), (tag, k, (a[k] - b[k]).abs().max())
    ref_loss, loss = losses(ref_out), losses(out)
    assert all(abs(ref_loss[s] - loss[s]) < 1e-4 for s in ref_loss), (ref_loss, loss)
    shutil.rmtree(out / "checkpoints")


def test_one_process_with_accumulation_equals_two_processes(data, tmp_path):
    """The single-process path (ZeRO-0, no gradient all-reduce) with 2 accumulation steps sees the
    same global batches as 2 ZeRO-0 processes (which must all-reduce) and reaches the same weights
    (dropout off so the ranks' dropout streams do not differ). The one process gets its 2
    accumulation steps from `global_batch_size` (training/ranks.py), as a config written for 2
    ranks does on a machine with one GPU."""
    no_dropout = ["model.hidden_dropout_prob=0", "model.attention_probs_dropout_prob=0", "pretrain.max_steps=4",
                  "pretrain.checkpoint_every=4", "pretrain.eval_every=4"]  # fmt: skip
    one, two = tmp_path / "one", tmp_path / "two"
    lines: list[str] = []
    run_pretrain_stage(config(*no_dropout, "pretrain.num_processes=1", "pretrain.global_batch_size=16",
                              "pretrain.zero_stage=null"), *data, one, log_line=lines.append)  # fmt: skip
    assert "pretrain: 1 rank(s) x micro batch 8 x 2 accumulation step(s) = 16 examples a step" in "\n".join(
        lines
    )
    assert any(
        "ZeRO 0" in ln and "world 1" in ln and "global batch 16" in ln for ln in lines
    )  # the 1-process default
    run_pretrain_stage(config(*no_dropout, "pretrain.zero_stage=0"), *data, two, log_line=lambda _: None)
    a, b = read_state_dict(one / "model"), read_state_dict(two / "model")
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-5), (k, (a[k] - b[k]).abs().max())
    assert max(abs(losses(one)[s] - losses(two)[s]) for s in losses(two)) < 1e-4
    # ZeRO 0 in fp32 logs the gradient norm it clips with (DeepSpeed dropped it: NaN at every step)
    norms = [[r["grad_norm"] for r in read_metrics(run) if "grad_norm" in r] for run in (one, two)]
    assert norms[0] and all(math.isfinite(n) and n > 0 for n in norms[0] + norms[1]), norms
    assert norms[0] == pytest.approx(norms[1], rel=1e-3)
    # and the same held-out examples: eval_batches counts global batches, not one rank's micro batches
    held_out = [[r for r in read_metrics(run) if "val_mlm_acc" in r] for run in (one, two)]
    assert len(held_out[0]) == len(held_out[1]) == 1
    for key in ("val_mlm_acc", "val_mlm_loss", "val_nsp_acc", "val_nsp_loss"):
        assert held_out[0][0][key] == pytest.approx(held_out[1][0][key], rel=1e-4, abs=1e-5), key


# the reference's 2 ranks on one node get 1 thread each (launch.child_env); so must the 2 nodes here,
# or matmul reductions split differently and losses differ in the last bit
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def two_node_settings(port: int, *extra: str) -> list[str]:
    return settings("pretrain.num_processes=1", "pretrain.nnodes=2", "pretrain.master_addr=127.0.0.1",
                    f"pretrain.master_port={port}", "pretrain.dist_timeout_s=60", *extra)  # fmt: skip


def test_kill_9_of_bertflow_still_saves_the_step_the_ranks_reached(data, tmp_path):
    """`kill -9` of `bertflow pretrain` alone (the flow's process killed, an OOM killer): the launcher
    gets SIGTERM (PR_SET_PDEATHSIG) and the ranks save the step they reached, though the pipe their
    output went to has lost its reader. Before, the rank's next line raised BrokenPipeError and it
    died without saving: with a line every step, every step since the last checkpoint was lost."""
    shards, tok = data
    out = tmp_path / "run"
    sets = settings("pretrain.num_processes=1", "pretrain.checkpoint_every=100")  # log_every 1
    proc = start_piped_until_step(shards, tok, out, sets, **ONE_THREAD)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.kill()  # bertflow only; its launcher and rank live on, writing into the pipe
    proc.wait(timeout=30)
    proc.stdout.close()  # the reader is gone
    _, alive = psutil.wait_procs(children, timeout=60)
    assert not alive
    tags = [d.name for d in (out / "checkpoints").iterdir() if d.is_dir()]
    step = max(losses(out))
    assert tags == [f"global_step{step}"] and 3 <= step < 12
    assert (out / "checkpoints" / tags[0] / checkpoint.VERIFIED_NAME).is_file()
    assert exit_code(out) == 143  # W&B: stopped, not failed with BrokenPipeError
    assert summary(out)["exit_reason"].startswith(
        f"stopped by a stop request (Ctrl-C or SIGTERM) after step {step}"
    )


def test_a_reader_that_leaves_stops_the_run_but_the_ranks_still_save_the_step_reached(data, tmp_path):
    """`bertflow pretrain | tee log`, and tee dies: bertflow's next line raises BrokenPipeError, it
    stops the ranks, saying 'the ranks save the step they reached', then its next line raised again
    inside that stop, which took it for a second interrupt and SIGKILLed them: every step since the
    last checkpoint lost. Now the stop goes on without the console: the step reached is saved."""
    shards, tok = data
    out = tmp_path / "run"
    sets = settings("pretrain.num_processes=1", "pretrain.checkpoint_every=100")  # log_every 1
    proc = start_piped_until_step(shards, tok, out, sets, **ONE_THREAD)
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.stdout.close()  # the reader is gone; bertflow lives on
        assert proc.wait(timeout=120) == 141
        _, alive = psutil.wait_procs(children, timeout=60)
        assert not alive
    finally:
        kill_tree(proc)
    tags = [d.name for d in (out / "checkpoints").iterdir() if d.is_dir()]
    step = max(losses(out))
    assert tags == [f"global_step{step}"] and 3 <= step < 12, (out / "launcher.log").read_text()[-2000:]
    assert (out / "checkpoints" / tags[0] / checkpoint.VERIFIED_NAME).is_file()


def test_kill_9_of_one_nodes_launcher_stops_both_nodes_which_save_the_step_reached(data, tmp_path):
    """`kill -9` of one node's torchrun launcher alone (the OOM killer's pick), two nodes of one rank:
    its rank lives in a session of its own and got no signal. Each rank watches its parent and stops
    as on SIGTERM; the other node's rank learns of it with the step's all-reduced sums; both save the
    step reached and the commands end, each a TransientError (exit 1) that a flow stage retries from
    that step. Before 2026-11-28 (stop 44) the ranks trained on with no one to stop them; until
    2026-11-28 (stop 56) the other node said 'stopped by a stop request (Ctrl-C or SIGTERM on one of
    the 2 nodes)', a UserError (exit 2) that a flow does not retry, though nobody asked for a stop."""
    shards, tok = data
    out = tmp_path / "run"
    sets = two_node_settings(free_port(), "pretrain.checkpoint_every=100", "pretrain.max_steps=400")
    logs = [tmp_path / f"node{r}.log" for r in (0, 1)]
    procs = [
        start_cli(shards, tok, out, sets, ("--node-rank", str(r)), logs[r], BERTFLOW_DEBUG_STEP_DELAY_S="0.3",
                  **ONE_THREAD)
        for r in (0, 1)
    ]  # fmt: skip
    ranks: list[psutil.Process] = []
    try:
        deadline = time.time() + 240
        while max(losses(out), default=0) < 3:  # metrics.jsonl (node 0) has step 3
            assert all(p.poll() is None for p in procs) and time.time() < deadline, logs[0].read_text()[
                -3000:
            ]
            time.sleep(0.1)
        children = psutil.Process(procs[1].pid).children(recursive=True)
        launcher = next(c for c in children if "torch.distributed.run" in c.cmdline())
        ranks = [c for p in procs for c in psutil.Process(p.pid).children(recursive=True)
                 if "training.train" in c.cmdline() and "torch.distributed.run" not in c.cmdline()]  # fmt: skip
        assert len(ranks) == 2
        launcher.kill()
        _, alive = psutil.wait_procs(ranks, timeout=30)
        assert not alive  # before stop 44: they trained on towards step 400
        rcs = [p.wait(timeout=60) for p in procs]
    finally:
        for proc in procs:
            kill_tree(proc)
        for rank in ranks:  # node 1's is no longer the command's child
            if rank.is_running():
                rank.kill()
    errors = [log.read_text().strip().splitlines()[-1] for log in logs]
    tags = [d.name for d in (out / "checkpoints").iterdir() if d.is_dir()]
    step = max(losses(out))
    assert tags == [f"global_step{step}"] and 3 <= step < 100, errors
    assert (out / "checkpoints" / tags[0] / checkpoint.VERIFIED_NAME).is_file()
    assert rcs == [1, 1], errors
    after = f"so they stopped after step {step} of 400; its checkpoint is saved ({tags[0]})"
    assert errors[1].startswith(
        f"bertflow pretrain: error: pretraining stopped: the launcher of the ranks (pid {launcher.pid}) died"
    ), errors[1]
    assert errors[0].startswith(
        "bertflow pretrain: error: pretraining stopped: the launcher of the ranks on another of the 2 nodes died"
    ), errors[0]
    assert all("OOM killer" in e and after in e and "stop request" not in e for e in errors), errors
    assert "Rerun the same command on every node to resume from it." in errors[0], errors[0]


def test_a_rank_killed_by_sigkill_is_named_as_such(data, tmp_path):
    """kill -9 of one rank (what the kernel's OOM killer does): it prints nothing, and the command said
    only that the other rank 'lost contact' and to 'see which in the other ranks' lines'. Now it names
    the rank that was killed and the signal, then the lost contact, and the step to resume from."""
    shards, tok = data
    out, log = tmp_path / "run", tmp_path / "run.log"
    sets = settings("pretrain.checkpoint_every=2", "pretrain.max_steps=400")  # 2 ranks
    proc = start_cli(shards, tok, out, sets, (), log, BERTFLOW_DEBUG_STEP_DELAY_S="0.3", **ONE_THREAD)
    try:
        wait_for(out / "checkpoints" / "global_step2" / checkpoint.VERIFIED_NAME, proc)
        ranks = [c for c in psutil.Process(proc.pid).children(recursive=True) if "-u" in c.cmdline()]
        victim = next(r for r in ranks if r.environ().get("LOCAL_RANK") == "1")
        victim.kill()
        assert proc.wait(timeout=120) == 1
    finally:
        kill_tree(proc)
    error = log.read_text().strip().splitlines()[-1]
    assert f"local rank 1 (pid {victim.pid}) was killed by SIGKILL (the kernel's OOM killer" in error, error
    assert "lost contact with the other ranks" in error and "resume from the newest checkpoint" in error


def test_a_hung_node_stops_the_others_within_dist_timeout_s_naming_it(data, tmp_path):
    """A node that hangs (its rank stopped, as by SIGSTOP or a stuck filesystem) held the other one
    in the gradient all-reduce for 30 minutes whatever pretrain.dist_timeout_s said: DeepSpeed's ZeRO
    groups take torch's default timeout. Now node 0 stops within the timeout (10 s here) with one
    paragraph, no traceback, naming the timeout and the way on. And a node started alone says that
    it waits, and stops after the same time naming the nodes that did not come."""
    shards, tok = data
    out = tmp_path / "run"
    sets = two_node_settings(free_port(), "pretrain.dist_timeout_s=10")
    logs = [tmp_path / f"node{r}.log" for r in (0, 1)]
    procs = [
        start_cli(shards, tok, out, sets, ("--node-rank", str(r)), logs[r], BERTFLOW_DEBUG_STEP_DELAY_S="0.3",
                  **ONE_THREAD)
        for r in (0, 1)
    ]  # fmt: skip
    try:
        wait_for(out / "checkpoints" / "global_step4" / checkpoint.VERIFIED_NAME, procs[0])
        node1_ranks = [
            c
            for c in psutil.Process(procs[1].pid).children(recursive=True)
            if "training.train" in c.cmdline()
        ]
        assert node1_ranks
        for rank in node1_ranks:
            rank.send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        assert procs[0].wait(timeout=120) == 1
        waited = time.time() - stopped_at
    finally:
        kill_tree(procs[1])
    said = logs[0].read_text()
    assert waited < 10 + 60, (waited, said[-3000:])  # the timeout and the stop, not 30 minutes
    assert "Traceback" not in said, said[-3000:]
    assert (
        "bertflow pretrain: error: pretraining stopped: lost contact with the other ranks: a collective timed "
        "out waiting for another rank"
        in said
        and "pretrain.dist_timeout_s, 10 s" in said
        and "resume from the newest checkpoint (global_step" in said
    ), said[-3000:]

    alone = start_cli(shards, tok, tmp_path / "alone", two_node_settings(free_port(), "pretrain.dist_timeout_s=10"),
                      ("--node-rank", "0"), tmp_path / "alone.log")  # fmt: skip
    assert alone.wait(timeout=120) == 1
    said = (tmp_path / "alone.log").read_text()
    assert "pretrain: node 0 of 2 waits for the other nodes at 127.0.0.1:" in said
    assert "(up to pretrain.dist_timeout_s, 10 s)" in said and "Traceback" not in said, said
    assert "bertflow pretrain: error: pretraining did not start: only 1 of 2 nodes joined in" in said, said


def test_two_nodes_stopped_by_sigterm_then_killed_resume_each_time_exactly_like_one_node(
    ref_run, data, tmp_path
):
    """Two `bertflow pretrain --node-rank R` invocations, one process each, meet over loopback
    (torchrun, static rendezvous) and train exactly like one node with 2 processes (the reference),
    through a stop and a kill:
    1. `kill -TERM` of node 1's `bertflow pretrain` only (a scheduler preempting one node): node 1's
       rank notes it, node 0's learns of it with the next step's all-reduce, both finish that step,
       save it and stop: node 1 exits 143, node 0 says why it stopped, no process is left, nothing
       hangs, and nothing since the last periodic checkpoint is lost.
    2. The rerun of both resumes from that step; each node caches its data in its own folder (no
       shared directory); node 1 (CLI, launcher and rank) is killed -9 after checkpoint 8 and node 0
       stops with an error.
    3. The rerun of both, now sharing OUT/data_cache on this one host: each node its own folder, no
       race; the run resumes and every loss (those of all three attempts) and the final weights equal
       the reference's, bit-exact. Resuming the finished 2-rank run on 1 rank is refused, naming the
       fix."""
    ref_out, ref_model, _ = ref_run
    shards, tok = data
    out, host = tmp_path / "run", socket.gethostname()
    port = free_port()
    sets = two_node_settings(port, "pretrain.checkpoint_every=100")  # no periodic checkpoint before 12
    logs = [tmp_path / f"sigterm{r}.log" for r in (0, 1)]
    procs = [
        start_cli(shards, tok, out, sets, ("--node-rank", str(r)), logs[r], BERTFLOW_DEBUG_STEP_DELAY_S="0.5",
                  **ONE_THREAD)
        for r in (0, 1)
    ]  # fmt: skip
    deadline = time.time() + 240
    while max(losses(out), default=0) < 3:  # metrics.jsonl (node 0) has step 3
        assert all(p.poll() is None for p in procs) and time.time() < deadline, logs[0].read_text()[-3000:]
        time.sleep(0.1)
    children = [c for p in procs for c in psutil.Process(p.pid).children(recursive=True)]
    procs[1].send_signal(signal.SIGTERM)  # node 1's command only, as `kill PID` does
    rcs = [p.wait(timeout=60) for p in procs]
    _, alive = psutil.wait_procs(children, timeout=10)
    texts = [log.read_text() for log in logs]
    assert rcs == [2, 143] and not alive, texts
    assert texts[1].rstrip().endswith("bertflow pretrain: terminated (SIGTERM)."), texts[1][-3000:]
    assert all("Traceback" not in t for t in texts), texts
    stopped = [
        re.findall(
            r"stopped by a stop request \(Ctrl-C or SIGTERM on one of the 2 nodes\) after step (\d+) of 12; "
            r"its checkpoint is saved",
            t,
        )
        for t in texts
    ]
    # node 0: its rank's line and the command's error; node 1: its rank's line
    assert len(stopped[0]) == 2 and len(stopped[1]) == 1, texts
    step = int(stopped[1][0])
    assert set(stopped[0]) == {str(step)} and 3 <= step < 12
    assert step < 8, f"stopped after step {step}: the kill below needs checkpoint 8 still to come"
    assert (
        "bertflow pretrain: error: pretraining stopped: stopped by a stop request (Ctrl-C or SIGTERM on one of "
        f"the 2 nodes) after step {step}" in texts[0]
    )
    assert "Rerun the same command on every node to resume from it." in texts[0]
    tags = [d.name for d in (out / "checkpoints").iterdir() if d.is_dir()]
    assert (
        tags == [f"global_step{step}"]
        and (out / "checkpoints" / tags[0] / checkpoint.VERIFIED_NAME).is_file()
    )
    # node 0's W&B run: every step up to the stop, ended as stopped (143), saying where
    assert by_step(history(out), "_step") == by_step(read_metrics(out), "step") and max(losses(out)) == step
    assert exit_code(out) == 143
    assert summary(out)["exit_reason"].startswith(
        f"stopped by a stop request (Ctrl-C or SIGTERM on one of the 2 nodes) after step {step} of 12; "
        f"its checkpoint is saved (global_step{step})"
    )

    scratch = [tmp_path / "node0", tmp_path / "node1"]
    sets = two_node_settings(free_port(), "pretrain.data_cache_dir=$NODE_SCRATCH/cache")
    procs = [
        start_cli(shards, tok, out, sets, ("--node-rank", str(r)), tmp_path / f"killed{r}.log",
                  NODE_SCRATCH=str(scratch[r]), BERTFLOW_DEBUG_STEP_DELAY_S="0.3", **ONE_THREAD)
        for r in (0, 1)
    ]  # fmt: skip
    wait_for(out / "checkpoints" / "global_step8" / checkpoint.VERIFIED_NAME, procs[0])
    kill_tree(procs[1])
    assert procs[0].wait(timeout=180) == 1  # node 0 cannot go on without node 1, and says so
    said = (tmp_path / "killed0.log").read_text()
    # the rerun of both resumed from the step the stop saved
    assert f"global_step{step} " in said and "resumed from" in said, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    assert re.search(
        r"bertflow pretrain: error: pretraining stopped: lost contact with the other ranks: (another rank's "
        r"connection was reset|another rank closed its connection).*rerun the same command on every node to resume from the newest "
        r"checkpoint \(global_step(8|9|1\d)\)",
        said,
    ), said[-3000:]
    run = digest(str(out.resolve()), 12)  # under data_cache_dir, named by the run's output too
    assert [sorted(p.name for p in (s / "cache").iterdir()) for s in scratch] == [
        [f"{host}-rank0-run{run}"],
        [f"{host}-rank1-run{run}"],
    ]
    assert not (out / "model").exists() and not (out / "_COMPLETE.json").exists()

    sets = two_node_settings(free_port())  # default cache folder OUT/data_cache, shared by both
    logs = [tmp_path / f"rerun{r}.log" for r in (0, 1)]
    procs = [
        start_cli(shards, tok, out, sets, ("--node-rank", str(r)), logs[r], **ONE_THREAD) for r in (0, 1)
    ]
    assert [p.wait(timeout=600) for p in procs] == [0, 0], [log.read_text()[-3000:] for log in logs]
    text = logs[0].read_text() + logs[1].read_text()
    assert "resumed from" in text and "global_step8" in text
    # node 1's command said its rank would say 'ready to train', and printed no such line (nor the batch)
    assert "rank 1: ready to train after" in logs[1].read_text() and "global batch 16" in logs[1].read_text()
    for rank in (0, 1):
        assert (
            f"rank {rank}: data cache ready" in text
            and str(out / "data_cache" / f"{host}-rank{rank}") in text
        )
    assert losses(out) == losses(ref_out)  # bit-exact, every step
    a, b = read_state_dict(ref_model), read_state_dict(out / "model")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (out / "_COMPLETE.json").is_file() and not (out / "data_cache").exists()
    # the resumed run's W&B run holds the whole curve, the steps before the checkpoint replayed
    assert by_step(history(out, newest=True), "_step") == by_step(read_metrics(out), "step")

    # a finished run: refused as finished, naming the global batch and how to go on from its weights
    with pytest.raises(
        UserError, match=r"finished pretraining run.*train_batch_size.*16 -> 8.*init_from=\S+/model"
    ):
        run_pretrain_stage(config("pretrain.num_processes=1"), shards, tok, out, log_line=lambda _: None)
