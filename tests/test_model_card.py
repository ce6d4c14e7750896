"""The model card (README.md of every model directory) and the files next to it: the card says what
is known and nothing else, the verdict follows the held-out figures, and every published file has
the usual permissions."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest

from finetuning.chance import nsp_at_chance
from model.model_card import CardFacts, DataFacts, EvalFacts, TrainingFacts, render_model_card
from pipelines.cli import main as cli

CONFIG = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "vocab_size": 8192}


def _facts(val_mlm_loss: float, beats: bool) -> CardFacts:
    return CardFacts(
        name="BERT-tiny test",
        model_config=CONFIG,
        parameters=1_600_000,
        model_max_length=128,
        data=DataFacts([("corpus.txt", 5 * 2**20)], 10_000, 1_100_000, {"train": 900, "validation": 100},
                       128, 0.15, 20, False, 1, 8192, True, 0.496),
        training=TrainingFacts(300, 64, 1_900_000, 5e-4, 30, "adamw", "fp32", 2, 2, 350.0),
        evaluation=EvalFacts(300, {"val_mlm_acc": 0.2, "val_mlm_loss": val_mlm_loss, "val_nsp_acc": 0.7},
                             {"most_frequent_token_acc": 0.06, "unigram_entropy": 6.0, "nsp_majority_acc": 0.5},
                             beats, 128),
    )  # fmt: skip


def test_card_tells_data_training_quality_and_usage() -> None:
    text = render_model_card(_facts(4.2, True), Path("/models/tiny"))
    assert text.startswith("---\nlibrary_name: transformers\npipeline_tag: fill-mask\n")
    assert "| masked-LM accuracy | 20.0% | 6.0% (always the most frequent token) |" in text
    assert "| masked-LM loss (nats) | 4.200 | 6.000 (unigram entropy) |" in text
    assert "the model uses the context" in text and "not yet language" not in text
    assert "`corpus.txt` (5.0 MiB)" in text and "900 train, 100 validation" in text
    assert "300 optimizer steps × 64 sequences = 19,200 sequences" in text
    assert "for 300 steps (19,200 sequences, about 1.9M tokens)" in text  # the summary line
    assert "(vocabulary 8,192, lowercased)" in text and "50% with B the true next segment" in text
    assert "- Wall time 5.8 min" in text  # 350 s
    assert "`model_max_length` in tokenizer_config.json is 128" in text
    assert 'pipeline("fill-mask", model="/models/tiny")' in text
    assert "- adamw, peak learning rate 0.0005, 30 warmup steps then linear decay; precision fp32" in text


def test_card_of_a_run_shorter_than_its_warmup_says_the_lr_never_decayed() -> None:
    """20 steps with the default 20 warmup steps read "20 warmup steps then linear decay"."""
    import dataclasses

    facts = _facts(4.2, True)
    facts.training = dataclasses.replace(facts.training, steps=20, warmup_steps=40)
    text = render_model_card(facts, Path("/m"))
    assert (
        "learning rate rising linearly for the whole run to 0.00025 (40 warmup steps of a peak 0.0005" in text
    )
    assert "then linear decay" not in text
    # a run as long as its warm-up reaches the peak at its last step, and never decays
    facts.training = dataclasses.replace(facts.training, steps=20, warmup_steps=20)
    text = render_model_card(facts, Path("/m"))
    assert "for the whole run to 0.0005 (20 warmup steps of a peak 0.0005 in a run of 20: no decay)" in text
    # a run spec's max_steps below the steps the run logged: the schedule is that of the steps run
    facts.training = dataclasses.replace(facts.training, steps=20, warmup_steps=40, run_steps=10)
    assert "for the whole run to 0.00025 (40 warmup steps" in render_model_card(facts, Path("/m"))


def test_card_of_a_checkpoint_inside_the_warmup_says_the_runs_schedule() -> None:
    """`export-hf RUN/checkpoints/global_step10` of a 20-step run with 20 warmup steps said "learning
    rate rising linearly for the whole run to 5e-05 (... in a run of 10: no decay)": the run was 20."""
    import dataclasses

    facts = _facts(4.2, True)
    facts.training = dataclasses.replace(facts.training, steps=10, warmup_steps=20, run_steps=40)
    text = render_model_card(facts, Path("/m"))
    assert "in a run of 10" not in text and "for the whole run" not in text, text
    assert (
        "peak learning rate 0.0005, 20 warmup steps then linear decay over a run of 40 steps; these weights "
        "are from step 10 (learning rate 0.00025 at that step)"
    ) in text, text
    # a run as long as its warm-up: no decay in the run either
    facts.training = dataclasses.replace(facts.training, steps=10, warmup_steps=40, run_steps=40)
    assert (
        "learning rate rising linearly to 0.0005 (40 warmup steps of a peak 0.0005: no decay) over a run of "
        "40 steps; these weights are from step 10 (learning rate 0.000125 at that step)"
    ) in render_model_card(facts, Path("/m"))


def test_card_warns_when_the_model_is_no_better_than_token_frequencies() -> None:
    text = render_model_card(_facts(6.3, False), Path("/m"))
    assert "not below the unigram entropy" in text and "the model uses the context" not in text
    # NSP 70% over a 50% majority on 128 examples is not chance; 52% is
    assert "| next-sentence accuracy | 70.0% | 50.0% (majority label) |" in text
    facts = _facts(6.3, False)
    facts.evaluation.metrics["val_nsp_acc"] = 0.52
    facts.evaluation.nsp_at_chance = nsp_at_chance(facts.evaluation.metrics, facts.evaluation.baselines, 128)
    assert "| next-sentence accuracy | 52.0% (chance) | 50.0% (majority label) |" in render_model_card(
        facts, Path("/m")
    )


def test_the_stage_says_a_model_no_better_than_token_frequencies_out_loud() -> None:
    """A diverged pretraining (loss 7.6 -> 205, held-out 67.5) ended 'pretrain: done'; only its card
    said it. The stage now warns whenever the card's verdict is 'not below the unigram entropy'."""
    from pipelines.stage_pretrain import context_free_note

    note = context_free_note(_facts(67.5, False).evaluation)
    assert (
        "at step 300 the masked-LM loss is not below the unigram entropy by more than 0.1 nats (67.500 "
        in note
    )
    assert context_free_note(_facts(5.1, True).evaluation) is None
    unknown = _facts(67.5, False).evaluation  # no unigram entropy (no train split counts): nothing said
    del unknown.baselines["unigram_entropy"]
    assert context_free_note(unknown) is None


def test_card_of_a_converted_checkpoint_leaves_out_what_is_unknown() -> None:
    facts = CardFacts(
        name="BERT from x (import-hf)", model_config=CONFIG, fresh_weights=["cls.predictions.bias"]
    )
    text = render_model_card(facts, Path("/m"))
    assert "## Data" not in text and "## Training" not in text and "## How good is it" not in text
    assert "freshly initialized: `cls.predictions.bias`" in text


def test_import_writes_card_keeps_max_length_and_usual_modes(minilm_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "ours"
    assert cli(["import-hf", str(minilm_dir), str(out)]) == 0
    card = (out / "README.md").read_text()
    assert f"BERT from {minilm_dir.name} (import-hf)" in card and "cls.seq_relationship" in card
    assert f'AutoModel.from_pretrained("{out}")' in card  # the final path, not the temp dir
    source = json.loads((minilm_dir / "tokenizer_config.json").read_text()).get("model_max_length", 512)
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == source
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert len(set(modes.values())) == 1 and modes["model.safetensors"] & 0o044 == 0o044, modes


def test_import_without_pretraining_heads_offers_no_fill_mask(minilm_dir: Path, tmp_path: Path) -> None:
    """MiniLM has no MLM/NSP heads: import-hf initializes them freshly, so its card must not tag it
    fill-mask or show a fill-mask example (the predictions would be noise); it says the head is untrained."""
    out = tmp_path / "ours"
    assert cli(["import-hf", str(minilm_dir), str(out)]) == 0
    card = (out / "README.md").read_text()
    assert "pipeline_tag: feature-extraction" in card and "masked-lm" not in card
    assert 'pipeline("fill-mask"' not in card and "pipeline_tag: fill-mask" not in card
    assert "No fill-mask: the masked-LM head was not in the source checkpoint and is untrained" in card
    assert f'encoder = AutoModel.from_pretrained("{out}")' in card
    # exported again, its heads are still the untrained ones: the new card says so too
    again = tmp_path / "exported"
    assert cli(["export-hf", str(out), str(again)]) == 0
    card = (again / "README.md").read_text()
    assert "pipeline_tag: feature-extraction" in card and 'pipeline("fill-mask"' not in card


def test_the_cards_finetune_command_runs_as_written(
    minilm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The card's `bertflow finetune --checkpoint DIR ...` has the --output that --checkpoint needs
    (it was refused: '--checkpoint needs --output DIR'): parsed as written, it plans its units."""
    import re
    import shlex

    from pipelines.cli import build_parser
    from pipelines.config import load_config
    from pipelines.stage_finetune import _plan_from_args, apply_flags

    out = tmp_path / "ours"
    assert cli(["import-hf", str(minilm_dir), str(out)]) == 0
    command = re.search(
        r"Fine-tune and score it: `(bertflow finetune [^`]+)`", (out / "README.md").read_text()
    )
    assert command is not None
    argv = shlex.split(command.group(1))[1:]
    assert argv[:3] == ["finetune", "--checkpoint", str(out)] and "--output" in argv
    args = build_parser("finetune").parse_args(argv)
    monkeypatch.chdir(tmp_path)
    cfg_all = load_config(args.config, args.set)
    jobs, output = _plan_from_args(cfg_all, apply_flags(cfg_all.finetune, args), args)
    assert output == Path("finetune-ours")
    assert {job.unit.task for job in jobs} == {"sst2", "mrpc"}
    assert str(out) in {job.checkpoint for job in jobs}


def test_weights_get_the_same_mode_as_their_siblings(tmp_path: Path) -> None:
    """safetensors replaces the file it writes (mode 0600); the published file must be readable
    like config.json next to it."""
    from model.config import BertConfig
    from model.heads import BertForPreTraining
    from model.hf_io import write_hf_dir

    write_hf_dir(BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=64)), tmp_path)
    mode = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert mode["model.safetensors"] == mode["config.json"], mode


def test_the_saved_parameter_count_is_the_models_own(tmp_path: Path) -> None:
    """The pretraining card counts parameters from the written file's header instead of building the
    model: the same number (the tied decoder stored once), and None where no file was written."""
    from model.config import BertConfig
    from model.heads import BertForPreTraining, count_parameters
    from model.hf_io import saved_parameter_count, write_hf_dir

    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=64))
    write_hf_dir(model, tmp_path / "model")
    assert saved_parameter_count(tmp_path / "model") == count_parameters(model)
    assert saved_parameter_count(tmp_path / "elsewhere") is None


def test_pretraining_card_reads_the_runs_facts(tmp_path: Path, minilm_dir: Path, data_dir: Path) -> None:
    """The facts come from what the run left: steps from the metrics (logged every 10 steps: still
    300 steps, not 30), tokens = steps x global batch x tokens per example, the precision, world size
    and masking of its config, and the held-out examples of all ranks (2 ranks x 1 batch x 8)."""
    from pipelines.config import load_config
    from pipelines.pretrain_card import pretraining_card
    from tests.report_fixtures import make_stage_outputs

    cfg = load_config(None, [f"run_dir={tmp_path / 'runs'}", "wandb.mode=disabled", "finetune.tasks=[]"])
    dirs = make_stage_outputs(cfg, minilm_dir, data_dir)
    spec_path, manifest_path = dirs["pretrain"] / "run_spec.json", dirs["preprocess"] / "manifest.json"
    stats_path = dirs["preprocess"] / "stats.json"
    spec = json.loads(spec_path.read_text())
    spec["world_size"] = 2
    spec["ds_config"]["bf16"] = {"enabled": True}
    spec_path.write_text(json.dumps(spec))
    manifest = json.loads(manifest_path.read_text())
    manifest["config"]["masked_lm_prob"] = 0.2
    # a corpus of three files: one gzipped, one skipped whole by the reader (stats.json says which)
    read = {"path": "corpus.txt", "sha256": "0" * 64, "size": 2**20}
    manifest["input_fingerprint"] = [read, {**read, "path": "more.txt.gz"}, {**read, "path": "x.tar.gz"}]
    manifest_path.write_text(json.dumps(manifest))
    stats = {
        **json.loads(stats_path.read_text()),
        "mean_tokens_per_example": 50.5,
        "files_skipped": ["x.tar.gz"],
    }
    stats_path.write_text(json.dumps(stats))

    facts = pretraining_card(dirs["pretrain"])
    assert facts.evaluation.examples == 16
    text = render_model_card(facts, Path("/m"))
    assert "(300 steps, bertflow)" in facts.name
    assert "300 optimizer steps × 64 sequences = 19,200 sequences, about 969,600 tokens" in text
    assert "precision bf16; DeepSpeed ZeRO stage 2 on 2 process(es)" in text
    assert "20% of tokens masked" in text
    corpus = next(line for line in text.splitlines() if line.startswith("- Corpus: "))
    assert corpus == "- Corpus: `corpus.txt` (1.0 MiB); `more.txt.gz` (1.0 MiB gzipped)", corpus
    assert "- Skipped, no text read (the preprocess stage's stats.json says why): `x.tar.gz`" in text
    total = facts.evaluation.split_examples
    assert total is not None and total > 16
    # one global batch of the 2 eval_batches asks (the split holds no second): it said
    # "(`pretrain.eval_batches` global batches)", as of a split holding them all
    said = f"on the first 16 (1 global batch of 16, all the split holds; `pretrain.eval_batches` 2 asks for more) of the {total:,}"
    assert said in text, text
    assert f"`bertflow evaluate` reads all {total:,} held-out examples; with `--max-examples 16`" in text
    # a split smaller than one global batch: all its examples but the last total % 3 on 3 ranks
    spec["pretrain"]["micro_batch_size"], spec["world_size"] = 16, 3
    spec_path.write_text(json.dumps(spec))
    small = render_model_card(pretraining_card(dirs["pretrain"]), Path("/m"))
    assert total % 3, total  # (the fixture's 20 held-out examples)
    assert (
        f"on the first {total - total % 3} (the split is smaller than one global batch of 48: all but its "
        f"last {total % 3}, so that each of the 3 ranks reads as many) of the {total:,}"
    ) in small, small


def test_card_of_a_continued_pretraining_names_the_model_it_started_from(
    tmp_path: Path, minilm_dir: Path, data_dir: Path
) -> None:
    """A run from pretrain.init_from (here an imported MiniLM) continued that model's pretraining: the
    card says so, naming its directory and Hugging Face name, not 'pretrained from scratch'."""
    from pipelines.config import load_config
    from pipelines.pretrain_card import pretraining_card
    from tests.report_fixtures import make_stage_outputs

    init = tmp_path / "minilm"
    assert cli(["import-hf", str(minilm_dir), str(init)]) == 0
    cfg = load_config(None, [f"run_dir={tmp_path / 'runs'}", "wandb.mode=disabled", "finetune.tasks=[]"])
    dirs = make_stage_outputs(cfg, minilm_dir, data_dir)
    spec_path = dirs["pretrain"] / "run_spec.json"
    spec = json.loads(spec_path.read_text())
    spec["pretrain"]["init_from"] = str(init)
    spec_path.write_text(json.dumps(spec))

    text = render_model_card(pretraining_card(dirs["pretrain"]), Path("/m"))
    assert "from scratch" not in text
    assert (
        f"continued pretraining from `{init}` (`nreimers/MiniLM-L6-H384-uncased`, imported from `{minilm_dir}`) "
        "with masked-LM and next-sentence prediction for 300 steps"
    ) in text


def test_export_of_a_checkpoint_tag_carries_the_runs_card_at_that_step(
    tmp_path: Path, minilm_dir: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`export-hf RUN/checkpoints/global_stepN` gets the finished model's card facts (data, training,
    held-out figures) as of step N; a step with no held-out evaluation says the figures are not known.
    (The DeepSpeed tag's loading is stubbed: its weights are another test's matter.)"""
    import training.consolidate
    from model.config import BertConfig
    from model.heads import BertForPreTraining
    from pipelines.config import load_config
    from tests.report_fixtures import make_stage_outputs

    cfg = load_config(None, [f"run_dir={tmp_path / 'runs'}", "wandb.mode=disabled", "finetune.tasks=[]"])
    dirs = make_stage_outputs(cfg, minilm_dir, data_dir)
    run = dirs["pretrain"]
    shutil.copytree(dirs["tokenizer"], run / "model", dirs_exist_ok=True)  # the run's tokenizer
    monkeypatch.setattr(training.consolidate, "resolve_tag_dir", lambda path: Path(path))
    monkeypatch.setattr(
        training.consolidate,
        "load_model_from_tag",
        lambda tag: BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=30522)),
    )
    for step in (200, 250):
        tag = run / "checkpoints" / f"global_step{step}"
        tag.mkdir(parents=True)
        assert cli(["export-hf", str(tag), str(tmp_path / f"hf{step}")]) == 0
    # the run dir itself: its newest checkpoint is read, and the card names it after the run's line
    monkeypatch.setattr(training.consolidate, "resolve_tag_dir", lambda path: tag if path == run else path)
    assert cli(["export-hf", str(run), str(tmp_path / "hf_run")]) == 0
    provenance = (tmp_path / "hf_run" / "README.md").read_text().split("## Provenance\n\n")[1].splitlines()
    assert provenance[:3] == [
        f"- exported from: `{run}`",
        f"- pretraining output: `{run}`",
        "- checkpoint: `global_step250` (step 250 of the run)",
    ], provenance

    at_200 = (tmp_path / "hf200" / "README.md").read_text()
    assert "(200 steps, bertflow)" in at_200 and "for 200 steps (12,800 sequences" in at_200
    assert (
        "Measured at step 200 on the first 16 (`pretrain.eval_batches` 2 global batches of 8) of the "
        in at_200
    )
    assert "200 optimizer steps × 64 sequences" in at_200 and "## Data" in at_200
    assert "- checkpoint: `global_step200` (step 200 of the run)" in at_200
    # the schedule is the run's (300 steps), not one of 200 that ends at this checkpoint
    assert (
        "then linear decay over a run of 300 steps; these weights are from step 200 (learning rate " in at_200
    )
    # the export's marker keeps the steps, so a scorecard names it as the model bertflow pretrained
    assert json.loads((tmp_path / "hf200" / "_COMPLETE.json").read_text())["pretraining_steps"] == [200]
    at_250 = (tmp_path / "hf250" / "README.md").read_text()
    assert (
        "## How good is it\n\nNot known: the run logged no held-out evaluation at step 250 "
        "(its evaluations: step 100, 200, 300)"
    ) in at_250
    assert "Measured at" not in at_250 and "250 optimizer steps × 64 sequences" in at_250
    # the lr of step 250 as the run's scheduler set it (and the run logged it), not the formula of
    # "after 250 steps" the card used (9.26e-05, one step's decay lower)
    assert (
        f"these weights are from step 250 (learning rate {_scheduled_lr(5e-4, 30, 300, 250):.3g} at that"
        in at_250
    )
    assert "9.44e-05" in at_250, at_250
    # the command to measure it names this directory, as the card's other commands do, not THIS_DIR
    assert f"Measure it: `bertflow evaluate {tmp_path / 'hf250'} --shards {dirs['preprocess']}`" in at_250, (
        at_250
    )


def _scheduled_lr(lr: float, warmup: int, run: int, step: int) -> float:
    """The learning rate training's scheduler (`build_scheduler`, torch's LambdaLR) sets for step
    `step` of a `run`-step run: its lr after `step - 1` scheduler steps."""
    import torch

    from training.optim import build_scheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = build_scheduler(optimizer, warmup, run)
    for _ in range(step - 1):
        optimizer.step()
        scheduler.step()
    return optimizer.param_groups[0]["lr"]


def test_a_loss_just_below_the_unigram_entropy_is_not_said_to_be_not_below_it() -> None:
    """The 40-step default run: held-out loss 6.916 beside a unigram entropy of 6.997 in the same
    table, and the verdict "the masked-LM loss is not below the unigram entropy" (the rule asks for
    0.1 nats below). The verdict and the stage's warning now say the margin and both numbers."""
    from pipelines.stage_pretrain import context_free_note

    facts = _facts(5.95, False)  # 0.05 below an entropy of 6.0
    text = render_model_card(facts, Path("/m"))
    assert (
        "The masked-LM loss is not below the unigram entropy by more than 0.1 nats (5.950 against 6.000)"
        in text
    )
    assert (
        "is not below the unigram entropy by more than 0.1 nats (5.950 against 6.000)"
        in context_free_note(facts.evaluation)
    )
    # below by more than the margin, its accuracy (20.0%) not above the most frequent token's: not "uses"
    facts.evaluation.baselines["most_frequent_token_acc"] = 0.2
    facts.evaluation.metrics["val_mlm_loss"] = 5.5
    text = render_model_card(facts, Path("/m"))
    assert (
        "**The masked-LM accuracy is not above always guessing the most frequent token (0.200 against "
        "0.200), though the loss is 0.500 nats below the unigram entropy: this model has learned token"
        in text
    )
    assert "the model uses the context" not in text


def test_pretraining_card_of_a_moved_run_directory_reads_the_shards_where_they_are_now(
    tmp_path: Path, minilm_dir: Path, data_dir: Path
) -> None:
    """The run spec names the shards and tokenizer by the absolute paths the run had. After `mv runs
    elsewhere` those are gone: the card (the report's, export-hf's) reads them where they are now in
    the moved run directory, instead of failing with "no shards at <the old path>"."""
    from pipelines.config import load_config
    from pipelines.pretrain_card import pretraining_card
    from tests.report_fixtures import make_stage_outputs

    cfg = load_config(None, [f"run_dir={tmp_path / 'runs'}", "wandb.mode=disabled", "finetune.tasks=[]"])
    dirs = make_stage_outputs(cfg, minilm_dir, data_dir)
    moved = tmp_path / "elsewhere" / "runs"
    moved.parent.mkdir()
    shutil.move(tmp_path / "runs", moved)

    facts = pretraining_card(moved / "pretrain" / dirs["pretrain"].name)
    assert facts.evaluation is not None and facts.evaluation.examples == 16
    assert facts.data is not None and facts.model_max_length == 64
    assert facts.provenance["shards"] == f"`{moved / 'preprocess' / dirs['preprocess'].name}`"
    assert facts.provenance["tokenizer"] == f"`{moved / 'tokenizer' / dirs['tokenizer'].name}`"
    # a run where it was made reads its inputs where the spec names them, even with a same-named
    # output in its run directory; one the spec names that is gone, in its run directory instead
    run = moved / "pretrain" / dirs["pretrain"].name
    own = shutil.copytree(moved / "preprocess", tmp_path / "mine" / "preprocess") / dirs["preprocess"].name
    spec = json.loads((run / "run_spec.json").read_text())
    gone = tmp_path / "gone" / "tokenizer" / dirs["tokenizer"].name
    spec.update(out_dir=str(run), shards_dir=str(own), tokenizer_dir=str(gone))
    (run / "run_spec.json").write_text(json.dumps(spec))
    facts = pretraining_card(run)
    assert facts.provenance["shards"] == f"`{own}`" and facts.evaluation is not None
    assert facts.provenance["tokenizer"] == f"`{moved / 'tokenizer' / dirs['tokenizer'].name}`"


def test_export_of_latest_model_carries_the_pretraining_runs_card(
    tmp_path: Path, minilm_dir: Path, data_dir: Path
) -> None:
    """`runs/latest/model`, the path the flow hands out, is a link into the pretraining output: its
    export gets the same card (data, training, held-out figures) and the same `pretraining_steps` as
    an export of `runs/pretrain/<key>/model`, and names the output itself, not the link that the
    next flow run moves; an import-hf or export-hf of that export carries them on."""
    from model.config import BertConfig
    from model.heads import BertForPreTraining
    from model.hf_io import write_hf_dir
    from pipelines.config import load_config
    from pipelines.run_history import update_latest
    from tests.report_fixtures import make_stage_outputs

    cfg = load_config(None, [f"run_dir={tmp_path / 'runs'}", "wandb.mode=disabled", "finetune.tasks=[]"])
    dirs = make_stage_outputs(cfg, minilm_dir, data_dir)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=30522))
    write_hf_dir(model, dirs["pretrain"] / "model", dirs["tokenizer"])
    latest = update_latest(tmp_path / "runs", dirs, None)

    assert cli(["export-hf", str(latest / "model"), str(tmp_path / "hf")]) == 0
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "(300 steps, bertflow)" in card and "Measured at step 300" in card
    assert f"- pretraining output: `{dirs['pretrain']}`" in card and "runs/latest" not in card
    assert json.loads((tmp_path / "hf" / "_COMPLETE.json").read_text())["pretraining_steps"] == [300]
    # a pretraining continued from the export (README's way on to another number of processes:
    # export-hf, then pretrain.init_from=DIR) counts its steps before its own, as from model/ itself
    from pipelines.pretrain_card import steps_before

    assert steps_before(str(tmp_path / "hf")) == steps_before(str(dirs["pretrain"] / "model")) == [300]
    # an import-hf of the run's model itself, through the link, gets the same card and steps (it
    # wrote a card of the shape and source alone, "BERT from model (import-hf)", and no steps)
    assert cli(["import-hf", str(latest / "model"), str(tmp_path / "direct")]) == 0
    text = (tmp_path / "direct" / "README.md").read_text()
    assert text.split("## Use it")[0] == card.split("## Use it")[0], text
    assert f"- imported from: `{dirs['pretrain'] / 'model'}`" in text and "runs/latest" not in text, text
    assert json.loads((tmp_path / "direct" / "_COMPLETE.json").read_text())["pretraining_steps"] == [300]

    # an import-hf of the export, and an export-hf of that import, keep its card and steps (they
    # wrote a card of the shape and source alone, and a marker without the steps)
    assert cli(["import-hf", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    assert cli(["export-hf", str(tmp_path / "imported"), str(tmp_path / "again")]) == 0
    for name, came in (("imported", f"imported from: `{tmp_path / 'hf'}`"), ("again", "exported from")):
        text = (tmp_path / name / "README.md").read_text()
        assert "(300 steps, bertflow)" in text and "Measured at step 300" in text, text
        assert "## Training" in text and "## Data" in text, text
        assert f"- {came}" in text and f"- pretraining output: `{dirs['pretrain']}`" in text, text
        assert json.loads((tmp_path / name / "_COMPLETE.json").read_text())["pretraining_steps"] == [300]
    assert text.split("## Use it")[0] == card.split("## Use it")[0]  # the title, figures, data, training
    # the whole chain, newest first: the export's own "exported from" was dropped by the export of
    # its import (one key per label), so the card no longer named the model the chain started from
    first = next(line for line in card.splitlines() if line.startswith("- exported from: "))
    chain = [
        line
        for line in (tmp_path / "again" / "README.md").read_text().splitlines()
        if line.startswith(("- exported", "- imported"))
    ]
    assert chain[:3] == [
        f"- exported from: `{tmp_path / 'imported'}`",
        f"- imported from: `{tmp_path / 'hf'}`",
        first.replace("exported from:", "exported from (earlier):"),
    ], chain
    # each directory's card names the command that wrote it (the first export's said only
    # "bertflow VERSION", the pretraining's words, where every later one named its command)
    for name, command in (
        ("hf", "export-hf"),
        ("direct", "import-hf"),
        ("imported", "import-hf"),
        ("again", "export-hf"),
    ):
        written = [
            line for line in (tmp_path / name / "README.md").read_text().splitlines() if "written by" in line
        ]
        assert len(written) == 1 and written[0].endswith(f" {command}"), (name, written)


def test_an_encoder_only_card_describes_the_directory_it_sits_in(tmp_path: Path) -> None:
    """`export-hf --encoder-only` drops the pretraining heads: its card counted them (1.6M parameters
    for 1.5M saved; MiniLM 22.9M for 22.7M), listed an import's fresh `cls.*` heads as "Not trained"
    and said AutoModel does not load the heads the directory does not have."""
    from model.config import BertConfig
    from model.heads import BertForPreTraining, count_parameters
    from model.hf_io import saved_parameter_count
    from model.model_dir import publish_model_dir

    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=8192))
    fresh = ["bert.pooler.dense.weight", "cls.predictions.bias", "cls.seq_relationship.weight"]
    info = {"source": "somewhere", "command": "export-hf", "fresh": fresh}
    for name, card in (("pretrained", _facts(5.0, True)), ("imported", None)):
        out = publish_model_dir(model, tmp_path / name, None, info=info, encoder_only=True, card=card)
        text = (out / "README.md").read_text()
        saved = saved_parameter_count(out)
        assert saved is not None and f"{saved / 1e6:.1f}M" != f"{count_parameters(model) / 1e6:.1f}M"
        assert f"{saved / 1e6:.1f}M parameters" in text, text
        assert "cls." not in text and "pretraining heads are not loaded" not in text, text
        assert json.loads((out / "_COMPLETE.json").read_text())["fresh"] == ["bert.pooler.dense.weight"]
    assert "`bert.pooler.dense.weight`" in text  # the import's fresh weights the directory holds


def test_the_held_out_line_says_which_examples_the_figures_are_of() -> None:
    """The figures are of the validation split's first `examples`: the card says all of them when
    that is the whole split, the first N of the split's M otherwise (with how to measure all M),
    and only the number when the split's size is not known."""
    facts = _facts(4.2, True)  # 128 held-out examples
    for split, said in (
        (None, "on 128 held-out examples"),
        (128, "on all 128 held-out examples"),
        (1000, "on the first 128 (`pretrain.eval_batches` global batches) of the 1,000 held-out examples"),
    ):
        facts.evaluation.split_examples = split
        text = render_model_card(facts, Path("/m"))
        assert f"Measured at step 300 {said} (documents never trained on)" in text, text
        assert ("`bertflow evaluate` reads all" in text) == (split == 1000), text


def test_a_card_recorded_in_a_marker_reads_back_as_it_was_and_anything_else_as_none() -> None:
    """An export's marker carries its card (`facts_record`) for the import-hf or export-hf of it to
    write the same card: read back from the marker as written (keys sorted), it renders the same,
    its Provenance in order; a record that is not one (edited by hand) is None, not a traceback."""
    from model.model_card import facts_of_record, facts_record

    facts = _facts(4.2, True)
    facts.provenance = {
        "pretraining output": "`/runs/p`",
        "checkpoint": "`global_step3`",
        "exported from": "`/x`",
    }
    facts.evaluate_shards = Path("/runs/shards")
    record = json.loads(json.dumps(facts_record(facts), sort_keys=True))  # as write_marker writes it
    assert render_model_card(facts_of_record(record), Path("/m")) == render_model_card(facts, Path("/m"))
    bad_size = {**record, "data": {**record["data"], "corpus_files": [["corpus.txt", "5 MiB"]]}}
    for edited in ([1], "card", {**record, "colour": "red"}, bad_size):
        assert facts_of_record(edited) is None, edited


def test_a_carried_card_says_the_verdict_of_its_figures_not_of_its_recorded_flag() -> None:
    """A card carried in an export's marker (`facts_record`) keeps the `beats_unigram` its run worked
    out; one recorded before the verdict asked for the accuracy too holds True for a model whose
    accuracy is below the most frequent token's. An import-hf of that export said "its accuracy above
    always guessing the most frequent token: the model uses the context" beside a table showing it
    below. The verdict now follows the figures it prints."""
    from model.model_card import facts_of_record, facts_record

    facts = _facts(4.2, True)  # as recorded then: the loss 1.8 nats below the entropy
    facts.evaluation.metrics["val_mlm_acc"] = 0.05  # below the most frequent token's 0.06
    text = render_model_card(facts_of_record(json.loads(json.dumps(facts_record(facts)))), Path("/m"))
    assert "| masked-LM accuracy | 5.0% | 6.0% (always the most frequent token) |" in text
    assert "the model uses the context" not in text, text
    assert (
        "**The masked-LM accuracy is not above always guessing the most frequent token (0.050 against "
        in text
    )
