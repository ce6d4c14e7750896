"""Settings of the tokenizer and preprocess stages (sections `tokenizer:` and `preprocess:`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from common.settings import DataPath, Section, Seed


class TokenizerConfig(Section):
    input: list[DataPath] = Field(
        default_factory=lambda: ["data:wiki/summaries_en.txt"],
        description="corpus files or globs; data:PATH is PATH below the data root",
    )
    vocab: DataPath | None = Field(
        None, description="use this vocab.txt / tokenizer.json instead of training"
    )
    vocab_size: int = Field(30522, gt=5, description="WordPieces to train, special tokens included")
    lowercase: bool = Field(True, description="uncased: lowercase and strip accents (BERT-uncased)")
    min_frequency: int = Field(2, ge=1, description="a merge must occur this often in the corpus")
    limit_alphabet: int = Field(
        1000, ge=1, description="keep the N most frequent characters (BERT: 1000); rarer ones become [UNK]"
    )


class PreprocessConfig(Section):
    # the shards are byte-identical for any number of workers or runner (preprocessing/beam_job.py)
    run_only: ClassVar[tuple[str, ...]] = ("workers", "runner", "beam_options")

    input: list[DataPath] = Field(
        default_factory=lambda: ["data:wiki/summaries_en.txt"],
        description="corpus files, folders or globs (plain text, WikiExtractor or JSONL, gzip or not)",
    )
    max_seq_length: int = Field(128, gt=8, description="tokens per example, [CLS] and [SEP]s included")
    short_seq_prob: float = Field(
        0.1, ge=0.0, le=1.0, description="share of examples given a random shorter target length"
    )
    dupe_factor: int = Field(5, ge=1, description="passes over the corpus, each with other pairs and masks")
    masked_lm_prob: float = Field(
        0.15, gt=0.0, lt=1.0, description="share of tokens chosen for MLM (80% [MASK], 10% random, 10% kept)"
    )
    max_predictions_per_seq: int = Field(20, ge=1, description="at most this many MLM targets per example")
    whole_word_mask: bool = Field(False, description="choose whole words (all their WordPieces) for MLM")
    balance_nsp: bool = Field(
        True,
        description="pay back forced NotNext pairs so the NotNext share stays 50% (False: Google's exact rule)",
    )
    num_shards: int = Field(4, ge=1, description="training Parquet shards written")
    validation_fraction: float = Field(
        0.01, ge=0.0, lt=0.5, description="documents held out for validation shards"
    )
    bucket_size_mb: float = Field(
        4.0, gt=0, le=1e6, description="raw text per document bucket (NotNext pool; bounds worker memory)"
    )
    workers: int = Field(2, ge=1, description="Beam worker processes (DirectRunner)")
    seed: Seed = 12345
    runner: str = Field("DirectRunner", description="Beam runner; a cluster's with beam_options (infra/beam)")
    beam_options: list[str] = Field(default_factory=list, description="extra Beam pipeline flags")
