"""Data that makes pretraining meaningless is never accepted without a word (issue 14 item 3): a
vocabulary of only the special tokens is an error; an [UNK]-dominated corpus, an IsNext share far
from 0.5, an empty validation split and duplicate documents are counted in stats.json, listed in
its `warnings` (logged loudly) and shown in the report."""

from __future__ import annotations

import json

import pytest

from common.errors import UserError
from pipelines.stage_preprocess import run_preprocess_stage
from preprocessing.config import PreprocessConfig
from preprocessing.wordpiece import SPECIAL_TOKENS, load_tokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, data_dir):
    """40 real documents of several sentences each, the first five repeated at the end."""
    root = tmp_path_factory.mktemp("degenerate")
    text = (data_dir / "wiki/summaries_en.txt").read_text(encoding="utf-8")
    docs = [d for d in text.split("\n") if d.count(". ") >= 3][:40]
    path = root / "corpus.txt"
    path.write_text("\n\n".join(docs + docs[:5]) + "\n", encoding="utf-8")
    return path


def test_a_vocabulary_of_only_special_tokens_is_refused(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in SPECIAL_TOKENS))
    with pytest.raises(UserError, match="only the special tokens"):
        load_tokenizer(vocab)


def test_degenerate_statistics_are_warnings_in_stats_and_report(tmp_path, corpus, minilm_dir, caplog):
    cfg = PreprocessConfig(
        input=[str(corpus)],
        max_seq_length=9,
        max_predictions_per_seq=2,
        workers=1,
        num_shards=1,
        validation_fraction=0.001,
    )
    stats = run_preprocess_stage(cfg, minilm_dir / "vocab.txt", tmp_path / "shards")
    assert stats["documents_duplicate"] == 5 and stats["documents_read"] == 45
    assert abs(stats["is_next_ratio"] - 0.5) > 0.1
    assert stats["examples_per_split"]["validation"] == 0
    text = " ".join(stats["warnings"])
    for expected in ("IsNext share", "validation split is empty", "5 of 45 documents repeat"):
        assert expected in text
        assert expected in caplog.text  # logged, not only written
    assert json.loads((tmp_path / "shards" / "stats.json").read_text())["warnings"] == stats["warnings"]
    # a balanced, varied corpus with a validation split gets no warning
    fine = run_preprocess_stage(cfg.model_copy(update={"max_seq_length": 128, "max_predictions_per_seq": 20, "validation_fraction": 0.2}),
                                minilm_dir / "vocab.txt", tmp_path / "fine")  # fmt: skip
    assert [w for w in fine["warnings"] if "repeat" not in w] == []


def test_more_shards_than_the_corpus_fills_is_a_warning(tmp_path, corpus, minilm_dir, caplog):
    """num_shards above what the examples fill wrote empty training shards without a word."""
    cfg = PreprocessConfig(input=[str(corpus)], workers=1, num_shards=200, dupe_factor=1)
    stats = run_preprocess_stage(cfg, minilm_dir / "vocab.txt", tmp_path / "shards")
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    train = manifest["splits"]["train"]
    empty = sum(1 for e in train if e["num_examples"] == 0)
    assert len(train) == 200 and empty > 0  # still written: the shards are unchanged
    warning = next(w for w in stats["warnings"] if "shards are empty" in w)
    assert f"{empty} of the 200 training shards are empty" in warning
    assert "preprocess.num_shards 200" in warning and "Fix: use fewer shards" in warning
    assert warning in caplog.text
    assert json.loads((tmp_path / "shards" / "stats.json").read_text())["warnings"] == stats["warnings"]


def test_a_vocabulary_that_does_not_cover_the_corpus_is_a_warning(tmp_path, corpus):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in [*SPECIAL_TOKENS, "the", "of", "and", "a", "in", ".", ","]))
    stats = run_preprocess_stage(
        PreprocessConfig(input=[str(corpus)], workers=1, num_shards=1), vocab, tmp_path / "o"
    )
    assert stats["unk_token_ratio"] > 0.5
    assert any("are [UNK]" in w for w in stats["warnings"])


def test_a_vocabulary_that_leaves_nothing_to_predict_is_refused(tmp_path, corpus):
    """Every token [UNK] (never chosen for prediction): shards without a masked position would
    make pretraining's loss NaN at its first step, so preprocess refuses instead of publishing
    them with a warning, and leaves no shards behind."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in [*SPECIAL_TOKENS, "zzz"]))
    out = tmp_path / "o"
    cfg = PreprocessConfig(input=[str(corpus)], workers=1, num_shards=1)
    with pytest.raises(
        UserError,
        match=r"100\.0% of its \d+ tokens are \[UNK\].*none of the \d+ examples has a masked position.*Fix: train the tokenizer",
    ):
        run_preprocess_stage(cfg, vocab, out)
    assert not (out / "_COMPLETE.json").exists() and not (out / "manifest.json").exists()
    assert not (out / "train").exists()


def test_a_latin1_corpus_file_is_a_warning_naming_it(tmp_path, corpus, minilm_dir):
    """Its lines' invalid UTF-8 was replaced with only a count in `skipped`; now the stats'
    warnings (logged, shown in the report) name the file and the iconv command."""
    latin = tmp_path / "latin1.txt"
    latin.write_bytes(
        corpus.read_text(encoding="utf-8").replace("e", "\u00e9").encode("latin-1", errors="replace")
    )
    cfg = PreprocessConfig(input=[str(corpus), str(latin)], workers=1, num_shards=1)
    stats = run_preprocess_stage(cfg, minilm_dir / "vocab.txt", tmp_path / "o")
    assert stats["skipped"]["lines_with_invalid_utf8_replaced"] > 0
    [warning] = [w for w in stats["warnings"] if "UTF-8" in w]
    assert warning.startswith(f"{latin}: ") and f"iconv -f latin1 -t utf-8 {latin}" in warning
    assert str(corpus) not in warning


def test_a_validation_split_of_one_document_is_a_warning() -> None:
    """One validation document has no other document to draw NotNext B from: every held-out example
    is IsNext (a new-user walkthrough saw 352 of 352), so its NSP accuracy would mean nothing."""
    from pipelines.stage_preprocess import data_warnings

    cfg = PreprocessConfig(input=["x.txt"], validation_fraction=0.01)
    stats = {"documents_used": {"train": 99, "validation": 1}, "examples_per_split": {"validation": 352}}
    (warning,) = data_warnings(stats, cfg)
    assert "validation split holds one document" in warning and "raise validation_fraction" in warning
    assert data_warnings({**stats, "documents_used": {"train": 98, "validation": 2}}, cfg) == []
