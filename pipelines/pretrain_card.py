"""The facts of a finished pretraining run, for its model card (`model/model_card.py`).

Everything is read back from what the run left on disk: `run_spec.json` (model, batch, optimizer,
DeepSpeed), `metrics.jsonl` (steps, held-out accuracy), the shards' `manifest.json` and
`stats.json` (corpus, tokens, examples). The context-free baselines are computed on the same
held-out examples the last evaluation used (`training.evaluate.mlm_baselines`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from common.atomic import MARKER_NAME
from common.jsonfile import read_json_or_empty
from common.tracking import read_metrics
from common.version import package_version
from finetuning.scorecard import pretraining_steps
from model.config import preset_of
from model.model_card import CardFacts, DataFacts, EvalFacts, TrainingFacts, steps_text


def _data_facts(
    shards_dir: Path, model_config: dict[str, Any], tokenizer_dir: Path | None
) -> DataFacts | None:
    manifest = read_json_or_empty(shards_dir / "manifest.json")
    stats = read_json_or_empty(shards_dir / "stats.json")
    if not manifest:
        return None
    cfg = manifest.get("config", {})
    inputs = manifest.get("input_fingerprint")
    inputs = inputs if isinstance(inputs, list) else []
    skipped = [str(p) for p in stats.get("files_skipped") or []]
    lowercase = (
        read_json_or_empty(tokenizer_dir / "tokenizer_config.json").get("do_lower_case")
        if tokenizer_dir
        else None
    )
    return DataFacts(
        corpus_files=[
            (str(f.get("path", "?")), int(f.get("size", 0)))
            for f in inputs
            if isinstance(f, dict) and f.get("path") not in skipped
        ],
        skipped_files=skipped,
        documents=stats.get("documents_read"),
        tokens=stats.get("tokens"),
        examples={
            s: sum(e["num_examples"] for e in entries) for s, entries in manifest.get("splits", {}).items()
        },
        max_seq_length=int(cfg.get("max_seq_length", 0)),
        masked_lm_prob=float(cfg.get("masked_lm_prob", 0.15)),
        max_predictions_per_seq=int(cfg.get("max_predictions_per_seq", 0)),
        whole_word_mask=bool(cfg.get("whole_word_mask", False)),
        dupe_factor=int(cfg.get("dupe_factor", 1)),
        vocab_size=int(model_config.get("vocab_size", 0)),
        lowercase=lowercase,
        is_next_share=stats.get("is_next_ratio"),
    )


def _training_facts(
    spec: dict[str, Any], rows: list[dict[str, Any]], stats: dict[str, Any], steps: int | None = None
) -> TrainingFacts:
    """`steps`: those of the checkpoint described (default: the last logged training step)."""
    p = spec.get("pretrain", {})
    ds = spec.get("ds_config", {})
    if steps is None:
        steps = max((int(r["step"]) for r in rows if r.get("step") is not None and "loss" in r), default=0)
    global_batch = int(ds.get("train_batch_size") or 0)
    per_example = stats.get("mean_tokens_per_example")
    # the exact count training logged at that step (training/train.py), else an estimate from the
    # corpus's mean example length
    logged = next(
        (r["consumed_tokens"] for r in rows if r.get("step") == steps and "consumed_tokens" in r), None
    )
    estimated = round(steps * global_batch * per_example) if per_example else None
    precision = next((k for k in ("bf16", "fp16") if ds.get(k, {}).get("enabled")), "fp32")
    return TrainingFacts(
        steps=steps,
        global_batch=global_batch,
        tokens_seen=int(logged) if logged is not None else estimated,
        lr=float(p.get("lr", math.nan)),
        warmup_steps=int(p.get("warmup_steps", 0)),
        optimizer=str(p.get("optimizer", "adamw")),
        precision=precision,
        zero_stage=ds.get("zero_optimization", {}).get("stage"),
        world_size=int(spec.get("world_size", 1)),
        seconds=None,
        run_steps=int(p["max_steps"]) if p.get("max_steps") else None,
    )


def _eval_facts(spec: dict[str, Any], rows: list[dict[str, Any]], shards_dir: Path) -> EvalFacts | None:
    """The last held-out evaluation and the baselines on the examples it used."""
    last = next((r for r in reversed(rows) if "val_mlm_acc" in r), None)
    if last is None:
        return None
    from finetuning.chance import nsp_at_chance
    from training.data import eval_example_count, load_split
    from training.evaluate import MlmBaselines, beats_unigram, mlm_baselines, train_target_counts

    p = spec.get("pretrain", {})
    world = int(spec.get("world_size", 1))
    micro = int(p.get("micro_batch_size", 1))
    store = load_split(shards_dir, "validation", verify=False)
    steps, accumulation = int(p.get("eval_batches", 1)), int(p.get("gradient_accumulation_steps", 1))
    n = eval_example_count(len(store), micro, world, steps, accumulation)
    vocab_size = int(spec.get("model", {}).get("vocab_size", 0))
    baselines = (
        mlm_baselines(store, train_target_counts(shards_dir, vocab_size), n)
        if n
        else MlmBaselines(math.nan, math.nan, math.nan)
    )
    metrics = {k: float(v) for k, v in last.items() if k.startswith("val_")}
    return EvalFacts(
        step=int(last["step"]),
        metrics=metrics,
        baselines=baselines.as_dict(),
        beats_unigram=beats_unigram(metrics, baselines),
        examples=n or None,
        which=held_out_rule(len(store), micro * accumulation * world, steps, world),
        split_examples=len(store),
        nsp_at_chance=nsp_at_chance(metrics, baselines.as_dict(), n),
    )


def held_out_rule(split: int, global_batch: int, eval_batches: int, world: int) -> str:
    """Why a held-out evaluation reads the split's first examples it reads (`eval_example_count`):
    `pretrain.eval_batches` global batches, as many whole ones as the split holds, or, in a split
    smaller than one, all but its last `split % world` (every rank reads as many)."""
    fit = min(eval_batches, split // global_batch)
    if not fit:
        return (
            f"the split is smaller than one global batch of {global_batch}: all but its last "
            f"{split % world}, so that each of the {world} ranks reads as many"
        )
    if fit < eval_batches:
        return (
            f"{fit} global batch{'es' if fit > 1 else ''} of {global_batch}, all the split holds; "
            f"`pretrain.eval_batches` {eval_batches} asks for more"
        )
    return f"`pretrain.eval_batches` {eval_batches} global batches of {global_batch}"


def steps_before(init_from: str | None) -> list[int]:
    """The steps of each bertflow pretraining that `init_from`'s model continues, first phase first
    ([]: random init, or a model bertflow did not pretrain): a pretraining output's model/ or an
    `export-hf` of one (`finetuning.scorecard.pretraining_steps`, as the scorecard counts them)."""
    return (pretraining_steps(init_from) or []) if init_from else []


def init_from_text(init_from: str) -> str:
    """`init_from` as the model card names it: its directory, and where known the Hugging Face model
    it holds (config.json's `_name_or_path`, its own or that of the directory `import-hf` read):
    "`DIR` (`nreimers/MiniLM-L6-H384-uncased`, imported from `HF_DIR`)"."""
    init_dir = Path(init_from)
    marker = read_json_or_empty(init_dir / MARKER_NAME)  # import-hf/export-hf name their source
    source = marker.get("source") if isinstance(marker.get("source"), str) and marker["source"] else None
    dirs = [init_dir, *([Path(source)] if source else [])]
    names = [read_json_or_empty(d / "config.json").get("_name_or_path") for d in dirs]
    hf_name = next((n for n in names if isinstance(n, str) and n), None)
    details = [f"`{hf_name}`"] if hf_name else []
    if source:
        made = {"import-hf": "imported", "export-hf": "exported"}.get(marker.get("command"), "converted")
        details.append(f"{made} from `{source}`")
    return f"`{init_from}`" + (f" ({', '.join(details)})" if details else "")


def _where_now(recorded: str | None, out_dir: Path, made_in: str | None) -> Path | None:
    """An input the run spec names by the absolute path it had when the run was made, where it is
    now: in a run directory moved or copied since (`out_dir` is no longer `made_in`, or the recorded
    path is gone), its counterpart in the run directory `out_dir` lies in (`in_run_dir`)."""
    from pipelines.run_history import in_run_dir

    if not recorded:
        return None
    path = Path(recorded)
    if made_in and Path(made_in) == out_dir.absolute() and path.exists():
        return path
    here = in_run_dir(out_dir.absolute().parent.parent, recorded)
    return here if here.exists() else path


def checkpoint_provenance(step: int) -> dict[str, str]:
    """The card's Provenance line naming the run's checkpoint at `step` that the weights are."""
    return {"checkpoint": f"`global_step{step}` (step {step:,} of the run)"}


def pretraining_card(
    out_dir: Path, seconds: float | None = None, name: str | None = None, step: int | None = None
) -> CardFacts:
    """The model card facts of the pretraining output directory `out_dir` (its model is
    `out_dir/model`); with `step`, of its checkpoint at that step (`checkpoints/global_stepN`): the
    records up to that step, and the held-out figures only if an evaluation ran at that step (the
    card says when none did)."""
    # imported here: `bertflow pretrain` and `bertflow run` import this module before they check the
    # config, and model.hf_io imports torch (2 s)
    from model.hf_io import saved_parameter_count

    out_dir = Path(out_dir)
    spec = read_json_or_empty(out_dir / "run_spec.json")
    # a run still under way has no model/ yet: its shape is the one its run spec trains
    model_config = read_json_or_empty(out_dir / "model" / "config.json") or spec.get("model", {})
    shards_dir = _where_now(spec.get("shards_dir"), out_dir, spec.get("out_dir"))
    tokenizer_dir = _where_now(spec.get("tokenizer_dir"), out_dir, spec.get("out_dir"))
    logged = read_metrics(out_dir)
    rows = [r for r in logged if step is None or int(r.get("step", 0)) <= step]
    data = _data_facts(shards_dir, model_config, tokenizer_dir) if shards_dir else None
    stats = read_json_or_empty(shards_dir / "stats.json") if shards_dir else {}
    training = _training_facts(spec, rows, stats, steps=step)
    training.seconds = seconds
    preset = preset_of(model_config)
    title = f"BERT-{preset}" if preset else "BERT"
    corpus = f" on {data.corpus_files[0][0]}" if data and len(data.corpus_files) == 1 else ""
    init_from = spec.get("pretrain", {}).get("init_from")
    before = steps_before(init_from)
    steps = steps_text([*before, training.steps])
    evaluation = _eval_facts(spec, rows, shards_dir) if shards_dir else None
    evaluation_note = None
    if step is not None and (evaluation is None or evaluation.step != step):
        evaluation = None
        evaluated = sorted({int(r["step"]) for r in logged if "val_mlm_acc" in r})
        at = f" (its evaluations: step {', '.join(f'{n:,}' for n in evaluated)})" if evaluated else ""
        evaluation_note = f"Not known: the run logged no held-out evaluation at step {step:,}{at}."
    checkpoint = {} if step is None else checkpoint_provenance(step)
    return CardFacts(
        name=name or f"{title} pretrained{corpus} ({steps} steps, bertflow)",
        model_config=model_config,
        parameters=saved_parameter_count(out_dir / "model"),
        model_max_length=data.max_seq_length if data and data.max_seq_length else None,
        data=data,
        training=training,
        evaluation=evaluation,
        evaluation_note=evaluation_note,
        evaluate_shards=shards_dir,
        init_from=init_from_text(init_from) if init_from else None,
        steps_before=before,
        provenance={
            "pretraining output": f"`{out_dir}`",
            **checkpoint,
            **({"continued from": f"`{init_from}` (its weights; a fresh optimizer)"} if init_from else {}),
            "shards": f"`{shards_dir}`" if shards_dir else "?",
            "tokenizer": f"`{tokenizer_dir}`" if tokenizer_dir else "?",
            "written by": f"bertflow {package_version()}",
        },
    )
