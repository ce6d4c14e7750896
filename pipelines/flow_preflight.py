"""What `bertflow run` checks before Prefect starts: every setting a selected stage would refuse,
refused now instead of after the stages before it have run (on a real corpus, hours of tokenizing
and preprocessing). Each check is the stage's own, applied to the config (and to each phase); a
corpus with no file of text, which the stages find only by reading it, is refused by its files' heads."""

from __future__ import annotations

from common.errors import UserError
from pipelines.config import PipelineConfig


def check_flow(cfg: PipelineConfig, selected: list[str]) -> None:
    """Raises the UserError the first failing stage would raise. `selected`: the stages that run
    (`--only preprocess` of a GPU config on a CPU machine is not refused for its pretraining)."""
    from common.paths import check_output_dir
    from pipelines.stage_finetune import check_flow_finetune
    from pipelines.stage_pretrain import check_pretrain_layouts
    from pipelines.verify_data import check_data_paths

    check_data_paths(cfg)
    if "finetune" in selected and "verify" not in selected:  # else the verify stage reads them
        from pipelines.verify_data import check_finetune_task_data

        check_finetune_task_data(cfg)
    check_flow_inputs(cfg, selected)
    if "tokenizer" in selected and cfg.tokenizer.vocab:
        check_configured_vocab(cfg)
    elif "tokenizer" in selected:
        check_corpus_is_text(cfg.tokenizer.input, cfg.data_root, "tokenizer.input")
    if "preprocess" in selected:
        check_flow_preprocess(cfg)
    if "pretrain" in selected:
        check_pretrain_layouts(cfg)
        check_flow_init_vocabulary(cfg)
    if "finetune" in selected:
        check_flow_finetune(cfg)
    if cfg.pretrain.init_from:  # its model is part of the pretrain stage's key
        from training.preflight import check_init_from

        check_init_from(cfg.pretrain.init_from)
    check_output_dir(cfg.run_dir, "run_dir")


def check_flow_inputs(cfg: PipelineConfig, selected: list[str]) -> None:
    """The outputs that `--only` stages read from earlier flow runs are complete, where the flow
    finds them (`stage_dirs`: also under an earlier release's key); else every missing stage is
    named, with the `--only` run that makes them, before Prefect starts and any flow run is
    recorded."""
    from pipelines.stage_keys import STAGES, stage_dirs
    from pipelines.stage_plan import refuse_missing_inputs

    if len(selected) < len(STAGES):  # every stage runs: nothing is read that the flow does not make
        refuse_missing_inputs(cfg, selected, stage_dirs(cfg))


def check_configured_vocab(cfg: PipelineConfig) -> None:
    """`tokenizer.vocab` loads as the tokenizer stage loads it (its casing, its special tokens)."""
    from pipelines.stage_tokenizer import vocab_source
    from preprocessing.wordpiece import load_tokenizer

    load_tokenizer(vocab_source(cfg.tokenizer, cfg.data_root), lowercase=cfg.tokenizer.lowercase)


def check_flow_preprocess(cfg: PipelineConfig) -> None:
    """Each phase's preprocess settings, then the main ones; not those of a complete output, which
    the flow reuses without starting its runner (a Dataflow run's shards, on a machine without it)."""
    from pipelines.stage_keys import is_complete, stage_dir
    from pipelines.stage_preprocess import check_preprocess_settings

    for index in range(len(cfg.phases) + 1):  # the phases in order, then the main run
        phase = cfg.phase_config(index)
        if is_complete(stage_dir(phase, "preprocess")):
            continue
        try:
            check_preprocess_settings(phase.preprocess)
            check_corpus_is_text(phase.preprocess.input, cfg.data_root, "preprocess.input")
        except UserError as err:
            raise cfg.phase_error(index, err) from None


def check_corpus_is_text(patterns: list[str], data_root: str | None, key: str) -> None:
    """`key`'s local corpus holds a file of text (by the first 8 KiB of each, see
    `refuse_unreadable_corpus`); one on an object store is checked by its stage."""
    from preprocessing.corpus import match_inputs
    from preprocessing.corpus_trouble import refuse_unreadable_corpus

    if not any("://" in p for p in patterns):
        refuse_unreadable_corpus(match_inputs(patterns, data_root)[0], key)


def check_flow_init_vocabulary(cfg: PipelineConfig) -> None:
    """`pretrain.init_from`'s vocabulary against the flow's: `tokenizer.vocab`, or the tokenizer
    the flow trained earlier (one it has yet to train is checked when pretraining starts)."""
    if not cfg.pretrain.init_from:
        return
    from common.atomic import read_marker
    from pipelines.stage_keys import stage_dir
    from pipelines.stage_tokenizer import vocab_source
    from training.preflight import check_init_from, check_init_vocabulary

    init_dir = check_init_from(cfg.pretrain.init_from)
    first = cfg.phase_config(0)  # the phase that starts from init_from (the main one without phases)
    if cfg.tokenizer.vocab:
        check_init_vocabulary(
            init_dir, vocab_source(cfg.tokenizer, cfg.data_root), first, cfg.tokenizer.lowercase
        )
        return
    trained = stage_dir(cfg, "tokenizer")
    if read_marker(trained) is not None:
        check_init_vocabulary(init_dir, trained, first)


def corpus_mismatch_note(cfg: PipelineConfig) -> str | None:
    """The warning when the tokenizer would train on files that no preprocess.input (the main one or
    a phase's) reads: a user who set preprocess.input to their corpus and left tokenizer.input as it
    was got a vocabulary of the default corpus, unsaid. None with tokenizer.vocab, a tokenizer trained
    on a sample of the corpus, or an object-store corpus."""
    from preprocessing.corpus import match_inputs

    inputs = [cfg.phase_config(i).preprocess.input for i in range(len(cfg.phases) + 1)]
    if cfg.tokenizer.vocab or any(
        "://" in p for p in [*cfg.tokenizer.input, *(p for ps in inputs for p in ps)]
    ):
        return None
    trained = set(match_inputs(cfg.tokenizer.input, cfg.data_root)[0])
    for patterns in inputs:
        read = set(match_inputs(patterns, cfg.data_root)[0])
        if trained and read and trained.isdisjoint(read):
            return (
                f"tokenizer.input {cfg.tokenizer.input} and preprocess.input {patterns} share no file: the "
                "vocabulary is trained on other text than the shards are made of. If your corpus is "
                "preprocess.input, set tokenizer.input to it too (or to a sample of it), or tokenizer.vocab "
                "to a vocabulary."
            )
    return None
