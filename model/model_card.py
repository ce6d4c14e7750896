"""The model card: `README.md` in every model directory we write, a Hugging Face model card.

It says what a person needs before using the weights: the shape, what data and how much training
went in, how good the masked-LM is on held-out text next to what a model without context scores,
the sequence length it was trained at (`model_max_length` in tokenizer_config.json is set to it),
and how to load it. Sections whose facts are unknown (an imported third-party checkpoint has no
training record) are left out rather than guessed. The facts are gathered by the stage that knows
them (`pipelines/pretrain_card.py` for pretraining, `model/model_dir.py` for import/export).
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.schedule import warmup_linear_decay

CARD_NAME = "README.md"
# how far below the unigram entropy the held-out masked-LM loss must be to show that the model uses
# the context (`context_shortfall`)
CONTEXT_MARGIN_NATS = 0.1


def context_shortfall(metrics: dict[str, float], baselines: dict[str, float], digits: int = 3) -> str | None:
    """Why held-out masked-LM figures do not show a model that uses the context, said with the
    figures: its loss not below the unigram entropy by more than CONTEXT_MARGIN_NATS, or, below it,
    its accuracy not above always guessing the most frequent token (a small split's loss margin is
    within noise: 0.12 nats over 868 masked tokens while the accuracy was 0.055 against 0.062).
    None when it does; a loss that is not finite, or an entropy not known, is never a "does" (an
    accuracy or baseline not known leaves the loss to say it)."""
    loss, acc = metrics.get("val_mlm_loss", math.nan), metrics.get("val_mlm_acc", math.nan)
    entropy = baselines.get("unigram_entropy", math.nan)
    frequent = baselines.get("most_frequent_token_acc", math.nan)
    if not (math.isfinite(loss) and loss < entropy - CONTEXT_MARGIN_NATS):
        return (
            f"the masked-LM loss is not below the unigram entropy by more than {CONTEXT_MARGIN_NATS:g} nats "
            f"({loss:.{digits}f} against {entropy:.{digits}f})"
        )
    if math.isfinite(frequent) and math.isfinite(acc) and acc <= frequent:
        return (
            f"the masked-LM accuracy is not above always guessing the most frequent token "
            f"({acc:.{digits}f} against {frequent:.{digits}f}), though the loss is {entropy - loss:.{digits}f} "
            "nats below the unigram entropy"
        )
    return None


@dataclass
class DataFacts:
    """The pretraining examples: where they came from and how many."""

    corpus_files: list[tuple[str, int]]  # (name, bytes)
    documents: int | None
    tokens: int | None  # WordPiece tokens in the corpus
    examples: dict[str, int]  # split -> examples
    max_seq_length: int
    masked_lm_prob: float
    max_predictions_per_seq: int
    whole_word_mask: bool
    dupe_factor: int
    vocab_size: int
    lowercase: bool | None
    is_next_share: float | None = None  # share of examples whose B segment is the true next one
    skipped_files: list[str] = field(default_factory=list)  # corpus files with no text read (stats.json)


@dataclass
class TrainingFacts:
    steps: int
    global_batch: int
    tokens_seen: int | None  # real (non-pad) tokens over all steps, when known
    lr: float
    warmup_steps: int
    optimizer: str
    precision: str
    zero_stage: int | None
    world_size: int
    seconds: float | None
    run_steps: int | None = None  # the run's pretrain.max_steps, where the card is of an earlier step


@dataclass
class EvalFacts:
    """Held-out masked-LM / NSP figures at the end of training, and the context-free baselines."""

    step: int
    metrics: dict[str, float]  # val_mlm_acc, val_mlm_loss, val_nsp_acc, ...
    baselines: dict[str, float]  # most_frequent_token_acc, unigram_entropy, nsp_majority_acc
    beats_unigram: bool
    examples: int | None = None  # the split's first ones (pretrain.eval_batches global batches)
    which: str | None = None  # how many of them and why (`pretrain_card.held_out_rule`)
    split_examples: int | None = None  # in the whole validation split (what `bertflow evaluate` reads)
    nsp_at_chance: bool | None = None  # NSP accuracy within noise of the majority label (finetuning.chance)

    @property
    def loss_and_entropy(self) -> tuple[float, float]:
        """The held-out masked-LM loss and the unigram entropy (NaN where unknown)."""
        return self.metrics.get("val_mlm_loss", math.nan), self.baselines.get("unigram_entropy", math.nan)


@dataclass
class CardFacts:
    name: str
    model_config: dict[str, Any]  # config.json
    parameters: int | None = None
    model_max_length: int | None = None
    data: DataFacts | None = None
    training: TrainingFacts | None = None
    evaluation: EvalFacts | None = None
    evaluation_note: str | None = None  # why `evaluation` is unknown (a checkpoint between evaluations)
    # the shards the note's `bertflow evaluate` of this directory reads (None: unknown, SHARDS_DIR)
    evaluate_shards: Path | None = None
    headline: str | None = None  # the fine-tuning scorecard's headline, when known
    fresh_weights: list[str] = field(default_factory=list)  # not from the source checkpoint
    provenance: dict[str, str] = field(default_factory=dict)
    init_from: str | None = None  # the model pretraining continued from (markdown), None: from scratch
    steps_before: list[int] = field(default_factory=list)  # steps of the phases it continued, first first
    encoder_only: bool = False  # written without the pretraining heads (export-hf --encoder-only)

    @property
    def mlm_head_trained(self) -> bool:
        """False when the directory has no masked-LM head (`encoder_only`) or a freshly initialized
        one (a checkpoint without pretraining heads, e.g. a sentence encoder): no fill-mask then."""
        return not self.encoder_only and not any(w.startswith("cls.predictions.") for w in self.fresh_weights)


def _n(value: float | int | None) -> str:
    """1234567 -> '1.2M', 15924 -> '15.9k', 300 -> '300'."""
    if value is None:
        return "?"
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.1f}{suffix}"
    return f"{value:g}"


def _pct(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{100 * value:.1f}%"


def shape_text(config: dict[str, Any], parameters: int | None) -> str:
    text = (
        f"{config.get('num_hidden_layers')} layers, hidden size {config.get('hidden_size')}, "
        f"{config.get('num_attention_heads')} attention heads, vocabulary {config.get('vocab_size'):,}"
    )
    return text + (f", {_n(parameters)} parameters" if parameters else "")


def _summary(f: CardFacts) -> str:
    parts = [f"A BERT encoder ({shape_text(f.model_config, f.parameters)})"]
    if f.training is not None:
        t = f.training
        seen = f", about {_n(t.tokens_seen)} tokens" if t.tokens_seen else ""
        start = f"continued pretraining from {f.init_from}" if f.init_from else "pretrained from scratch"
        parts.append(
            f"{start} with masked-LM and next-sentence prediction for {t.steps:,} steps "
            f"({t.steps * t.global_batch:,} sequences{seen})"
        )
    if f.data is not None and f.data.tokens:
        d = f.data
        files = ", ".join(name for name, _ in d.corpus_files[:3]) + (" …" if len(d.corpus_files) > 3 else "")
        parts.append(f"on {_n(d.tokens)} tokens of text" + (f" ({files})" if files else ""))
    return " ".join(parts) + "."


def _quality(e: EvalFacts) -> list[str]:
    return ["## How good is it", "", *quality_lines(e)]


def steps_text(steps: list[int]) -> str:
    """The steps of a pretraining and of the phases it continued, first first: '3,000 + 8,500'."""
    return " + ".join(f"{n:,}" for n in steps)


def quality_lines(e: EvalFacts) -> list[str]:
    """The held-out figures next to the context-free baselines, and what they mean (markdown)."""
    m, b = e.metrics, e.baselines
    lines = [
        f"Measured at step {e.step:,} on {_held_out(e)} (documents never trained on), next to what a "
        "model that ignores the context scores on the same examples:",
        "",
        "| | this model | without context |",
        "|---|---:|---:|",
        f"| masked-LM accuracy | {_pct(m.get('val_mlm_acc'))} | "
        f"{_pct(b.get('most_frequent_token_acc'))} (always the most frequent token) |",
    ]
    if "val_mlm_loss" in m:
        lines.append(
            f"| masked-LM loss (nats) | {m['val_mlm_loss']:.3f} | "
            f"{b.get('unigram_entropy', math.nan):.3f} (unigram entropy) |"
        )
    if "val_nsp_acc" in m:
        chance = " (chance)" if e.nsp_at_chance else ""
        lines.append(
            f"| next-sentence accuracy | {_pct(m['val_nsp_acc'])}{chance} | "
            f"{_pct(b.get('nsp_majority_acc'))} (majority label) |"
        )
    if e.examples and e.split_examples and e.examples < e.split_examples:
        lines += [
            "",
            f"`bertflow evaluate` reads all {e.split_examples:,} held-out examples; with `--max-examples "
            f"{e.examples}` it measures these {e.examples:,}.",
        ]
    return [*lines, "", verdict(e), ""]


def _held_out(e: EvalFacts) -> str:
    """Which held-out examples the figures are of: the validation split's first `examples` (`which`
    says how many: `pretrain.eval_batches` global batches, fewer in a small split), of
    `split_examples` in all."""
    if not e.examples:
        return "the held-out validation shards"
    if not e.split_examples:
        return f"{e.examples:,} held-out examples"
    if e.examples >= e.split_examples:
        return f"all {e.split_examples:,} held-out examples"
    return (
        f"the first {e.examples:,} ({e.which or '`pretrain.eval_batches` global batches'}) of the "
        f"{e.split_examples:,} held-out examples"
    )


def verdict(e: EvalFacts) -> str:
    """What the held-out figures show, by `context_shortfall` of the figures the card prints (not
    `beats_unigram`, which a card carried in a marker keeps as its run worked it out)."""
    shortfall = context_shortfall(e.metrics, e.baselines)
    if shortfall is None:
        return (
            "The masked-LM loss is below the unigram entropy, and its accuracy above always guessing the "
            "most frequent token: the model uses the context."
        )
    return (
        f"**{shortfall[0].upper()}{shortfall[1:]}: this model has learned token frequencies, not yet "
        "language; train longer or on more data before relying on it.**"
    )


def _data(d: DataFacts) -> list[str]:
    files = "; ".join(
        f"`{name}` ({size / 2**20:.1f} MiB{' gzipped' if name.endswith('.gz') else ''})"
        for name, size in d.corpus_files
    )
    examples = ", ".join(f"{n:,} {split}" for split, n in d.examples.items())
    masking = (
        f"{d.masked_lm_prob:.0%} of tokens masked (at most {d.max_predictions_per_seq} per example"
        + (", whole words" if d.whole_word_mask else "")
        + f"; 80% [MASK], 10% random, 10% unchanged), {d.dupe_factor} masking pass(es) over the corpus"
    )
    case = {True: ", lowercased", False: ", cased", None: ""}[d.lowercase]
    lines = ["## Data", ""]
    if files:
        lines.append(f"- Corpus: {files}")
    if d.skipped_files:
        shown = ", ".join(f"`{name}`" for name in d.skipped_files)
        lines.append(f"- Skipped, no text read (the preprocess stage's stats.json says why): {shown}")
    if d.tokens:
        lines.append(
            f"- {_n(d.documents)} documents, {_n(d.tokens)} WordPiece tokens (vocabulary {d.vocab_size:,}{case})"
        )
    pairs = f"`[CLS] A [SEP] B [SEP]` pairs of at most {d.max_seq_length} tokens"
    if d.is_next_share is not None:
        pairs += f", {d.is_next_share:.0%} with B the true next segment"
    lines.append(f"- Examples: {examples}; {pairs}; {masking}")
    return [*lines, ""]


def _schedule(t: TrainingFacts) -> str:
    """The learning-rate schedule as it ran (`training/optim.py` warmup_linear_decay): a warm-up as
    long as the run or longer never reaches the decay, nor, if longer, the peak. The card of an
    earlier checkpoint (`run_steps` past `steps`) says the run's schedule and the lr at its step."""
    run = max(t.run_steps or t.steps, t.steps)
    if run > t.steps:
        return (
            f"{_run_schedule(t.lr, t.warmup_steps, run)} over a run of {run} steps; these weights are "
            f"from step {t.steps} (learning rate {_lr_at(t.lr, t.warmup_steps, run, t.steps):.3g} at that step)"
        )
    if t.warmup_steps < t.steps:
        return _run_schedule(t.lr, t.warmup_steps, run)
    return (
        f"learning rate rising linearly for the whole run to {_lr_at(t.lr, t.warmup_steps, run, run):.3g} "
        f"({t.warmup_steps} warmup steps of a peak {t.lr:g} in a run of {t.steps}: no decay)"
    )


def _run_schedule(lr: float, warmup: int, run: int) -> str:
    if warmup < run:
        return f"peak learning rate {lr:g}, {warmup} warmup steps then linear decay"
    return f"learning rate rising linearly to {_lr_at(lr, warmup, run, run):.3g} ({warmup} warmup steps of a peak {lr:g}: no decay)"


def _lr_at(lr: float, warmup: int, run: int, step: int) -> float:
    """The learning rate of step `step` (1-based) of a `run`-step run, the scheduler's own
    (`common.schedule`, as the run logs it at that step): the lr that made these weights."""
    return lr * warmup_linear_decay(warmup, run)(step - 1)


def _training(t: TrainingFacts, max_len: int | None) -> list[str]:
    lines = [
        "## Training",
        "",
        f"- {t.steps:,} optimizer steps × {t.global_batch:,} sequences = {t.steps * t.global_batch:,} "
        "sequences" + (f", about {t.tokens_seen:,} tokens (padding excluded)" if t.tokens_seen else ""),
        f"- {t.optimizer}, {_schedule(t)}; precision {t.precision}; DeepSpeed ZeRO stage {t.zero_stage} on "
        f"{t.world_size} process(es)",
    ]
    if t.seconds:
        lines.append(f"- Wall time {t.seconds / 60:.1f} min")
    if max_len:
        lines.append(
            f"- Sequence length {max_len}: `model_max_length` in tokenizer_config.json is {max_len}, the "
            "length it was trained at (position embeddings past it exist but were never trained)."
        )
    return [*lines, ""]


def finetune_command(model_dir: Path) -> str:
    """The `bertflow finetune` command line that scores `model_dir` as written (`--checkpoint` needs
    `--output`): the scores go to `finetune-NAME/` in the current folder."""
    name = model_dir.name
    if name == "model" and model_dir.parent.name:  # a pretraining's model/: its run's name too
        name = f"{model_dir.parent.name}-{name}"
    return f"bertflow finetune --checkpoint {shlex.quote(str(model_dir))} --tasks sst2,mrpc --output {shlex.quote(f'finetune-{name}')}"


def _heads_note(f: CardFacts) -> str:
    """What AutoModel leaves out of the directory: nothing when it holds the encoder only."""
    return (
        ": the encoder, all this directory holds"
        if f.encoder_only
        else ": the pretraining heads are not loaded"
    )


def _usage(f: CardFacts, model_dir: Path) -> list[str]:
    path = str(model_dir)
    fill = [
        "from transformers import AutoModel, AutoTokenizer, pipeline",
        "",
        f'fill = pipeline("fill-mask", model="{path}")',
        'print(fill("the capital of france is [MASK]."))',
    ]
    lines = [
        "## Use it",
        "",
        "```python",
        *(fill if f.mlm_head_trained else ["from transformers import AutoModel, AutoTokenizer"]),
        "",
        f'tokenizer = AutoTokenizer.from_pretrained("{path}")',
        f'encoder = AutoModel.from_pretrained("{path}")  # BertModel{_heads_note(f)}',
        "```",
        "",
    ]
    if f.encoder_only:
        lines += ["No fill-mask: this directory holds the encoder only, without the pretraining heads.", ""]
    elif not f.mlm_head_trained:
        lines += [
            "No fill-mask: the masked-LM head was not in the source checkpoint and is untrained (see Not "
            "trained), so its predictions would be noise. Use the encoder, fine-tune it, or pretrain it "
            "further (`pretrain.init_from`) to train the heads.",
            "",
        ]
    return [*lines, f"Fine-tune and score it: `{finetune_command(model_dir)}`.", ""]


def _evaluate_command(f: CardFacts, model_dir: Path) -> str:
    shards = shlex.quote(str(f.evaluate_shards)) if f.evaluate_shards else "SHARDS_DIR"
    return f"bertflow evaluate {shlex.quote(str(model_dir))} --shards {shards}"


def render_model_card(f: CardFacts, model_dir: Path) -> str:
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: fill-mask" if f.mlm_head_trained else "pipeline_tag: feature-extraction",
        "tags: [bert, masked-lm, bertflow]" if f.mlm_head_trained else "tags: [bert, bertflow]",
        "---",
        "",
        f"# {f.name}",
        "",
        _summary(f),
        "",
    ]
    if f.headline:
        lines += ["## Fine-tuning", "", f.headline, ""]
    if f.evaluation is not None:
        lines += _quality(f.evaluation)
    elif f.evaluation_note:
        lines += [
            "## How good is it",
            "",
            f"{f.evaluation_note} Measure it: `{_evaluate_command(f, model_dir)}`.",
            "",
        ]
    if f.data is not None:
        lines += _data(f.data)
    if f.training is not None:
        lines += _training(f.training, f.model_max_length)
    elif f.model_max_length:
        lines += [f"`model_max_length` (tokenizer_config.json): {f.model_max_length}.", ""]
    if f.fresh_weights:
        lines += [
            "## Not trained",
            "",
            "These weights were not in the source checkpoint and are freshly initialized: "
            + ", ".join(f"`{w}`" for w in f.fresh_weights),
            "",
        ]
    lines += _usage(f, model_dir)
    if f.provenance:
        lines += ["## Provenance", ""] + [f"- {k}: {v}" for k, v in f.provenance.items()] + [""]
    return "\n".join(lines)


def write_model_card(model_dir: str | Path, facts: CardFacts, final_dir: str | Path | None = None) -> Path:
    """Write `README.md` into `model_dir` (atomically); its loading examples name `final_dir`
    (where the directory will live, when it is assembled elsewhere), else `model_dir`."""
    from common.atomic import atomic_write_text

    model_dir = Path(model_dir)
    path = model_dir / CARD_NAME
    atomic_write_text(path, render_model_card(facts, Path(final_dir or model_dir).absolute()))
    return path


def facts_record(facts: CardFacts) -> dict[str, Any]:
    """`facts` as JSON (the `card` of a model directory's marker), so that an import-hf or export-hf
    of the directory, wherever it was copied, writes the same card: `facts_of_record` reads it."""
    record = dataclasses.asdict(facts)
    record["evaluate_shards"] = str(facts.evaluate_shards) if facts.evaluate_shards else None
    record["provenance"] = list(facts.provenance.items())  # in order (the marker's keys are sorted)
    return record


def facts_of_record(record: Any) -> CardFacts | None:
    """The card facts `facts_record` wrote; None for anything else (a marker without them, written
    before markers held them, or edited by hand)."""
    if not isinstance(record, dict):
        return None
    try:
        facts = CardFacts(**{**record, "provenance": dict(record.get("provenance") or [])})
        data = facts.data
        facts.data = DataFacts(**data) if data is not None else None
        if facts.data is not None:
            facts.data.corpus_files = [(str(n), int(b)) for n, b in facts.data.corpus_files]
        facts.training = TrainingFacts(**facts.training) if facts.training is not None else None
        facts.evaluation = EvalFacts(**facts.evaluation) if facts.evaluation is not None else None
    except (TypeError, ValueError):
        return None
    facts.evaluate_shards = Path(facts.evaluate_shards) if facts.evaluate_shards else None
    return facts
