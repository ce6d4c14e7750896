"""Stage 1: WordPiece load/train; equality with transformers' fast tokenizer on real sentences."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from common.atomic import read_marker
from common.errors import UserError
from pipelines.stage_tokenizer import run_tokenizer_stage
from preprocessing.config import TokenizerConfig
from preprocessing.wordpiece import load_tokenizer


def real_lines(data_dir: Path, n: int) -> list[str]:
    lines = [
        line.strip() for line in (data_dir / "wiki/summaries_en.txt").open(encoding="utf-8") if line.strip()
    ]
    return lines[:: max(1, len(lines) // n)][:n]


def test_minilm_vocab_txt_tokenizes_like_transformers(minilm_dir, data_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(minilm_dir))
    ours, lowercase = load_tokenizer(minilm_dir / "vocab.txt")  # built from vocab.txt, not their json
    assert lowercase is True
    texts = real_lines(data_dir, 300) + [
        "Ça coûte 12,50 € — naïve café!",
        "北京 is in 中国.",
        "  tabs\tand\nnewlines ",
    ]
    for text in texts:
        assert ours.encode(text).ids == hf(text)["input_ids"], text
    a, b = texts[0], texts[1]
    enc = ours.encode(a, b)
    ref = hf(a, b)
    assert enc.ids == ref["input_ids"]
    assert enc.type_ids == ref["token_type_ids"]


def test_load_tokenizer_json_drops_padding_and_truncation(minilm_dir):
    tok, lowercase = load_tokenizer(minilm_dir)  # the dir: uses its tokenizer.json
    assert lowercase is True
    long_text = "word " * 600
    assert len(tok.encode(long_text, add_special_tokens=False).ids) == 600  # not truncated to 128/512
    short = tok.encode("a short text", add_special_tokens=False)
    assert len(short.ids) == 3 and 0 not in short.ids  # not padded to the file's fixed length


def test_train_stage_writes_a_tokenizer_transformers_loads(tmp_path, data_dir):
    from transformers import AutoTokenizer

    src = tmp_path / "corpus.txt"
    src.write_text("\n\n".join(real_lines(data_dir, 3000)), encoding="utf-8")
    cfg = TokenizerConfig(input=[str(src)], vocab_size=3000)
    out = run_tokenizer_stage(cfg, tmp_path / "tok", str(data_dir))
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).is_file()
    marker = read_marker(out)
    assert marker is not None and marker["vocab_size"] == 3000
    vocab = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(vocab) == 3000
    assert any(w.startswith("##") for w in vocab)
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is True

    hf = AutoTokenizer.from_pretrained(str(out))
    ours, _ = load_tokenizer(out / "vocab.txt")
    for text in real_lines(data_dir, 100):
        ids = hf(text)["input_ids"]
        assert ids == ours.encode(text).ids
        assert ids[0] == vocab.index("[CLS]") and ids[-1] == vocab.index("[SEP]")
    unk = sum(i == 1 for t in real_lines(data_dir, 100) for i in ours.encode(t).ids)
    assert unk < 50  # a vocabulary trained on this text covers it

    mtime = (out / "vocab.txt").stat().st_mtime_ns
    run_tokenizer_stage(cfg, out, str(data_dir))  # same settings: up to date, nothing rewritten
    assert (out / "vocab.txt").stat().st_mtime_ns == mtime


def test_cased_training_keeps_case(tmp_path, data_dir):
    src = tmp_path / "small.txt"
    src.write_text("\n\n".join(real_lines(data_dir, 400)), encoding="utf-8")
    out = run_tokenizer_stage(
        TokenizerConfig(input=[str(src)], vocab_size=800, lowercase=False), tmp_path / "t"
    )
    vocab = set((out / "vocab.txt").read_text(encoding="utf-8").splitlines())
    assert any(w[:1].isupper() for w in vocab)
    tok, lowercase = load_tokenizer(out)
    assert lowercase is False
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is False


def test_a_lowercased_vocabulary_of_korean_text_says_it_is_made_of_letters(tmp_path, caplog):
    """Lowercasing (NFD, accents stripped, as BERT-uncased) splits each Hangul syllable into its
    letters: a Korean corpus's vocabulary is then single letters, which nothing said."""
    words = [
        "서울은",
        "대한민국의",
        "수도이다",
        "한국어",
        "문장",
        "학교에",
        "간다",
        "사람들이",
        "많다",
        "오늘",
    ]
    src = tmp_path / "ko.txt"
    src.write_text(
        "\n\n".join(" ".join(words[i:] + words[:i]) + "." for i in range(10)) * 20, encoding="utf-8"
    )
    with caplog.at_level(logging.WARNING):
        out = run_tokenizer_stage(TokenizerConfig(input=[str(src)], vocab_size=300), tmp_path / "uncased")
    said = [r.getMessage() for r in caplog.records if "Hangul letters (jamo)" in r.getMessage()]
    assert len(said) == 1 and "set tokenizer.lowercase: false (`bertflow tokenizer --cased`)" in said[0], said
    assert "ᄉ" in (out / "vocab.txt").read_text(encoding="utf-8").splitlines()  # the letter, not 서
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        cased = run_tokenizer_stage(
            TokenizerConfig(input=[str(src)], vocab_size=300, lowercase=False), tmp_path / "cased"
        )
    assert not [r for r in caplog.records if "Hangul" in r.getMessage()]
    assert "서울은" in (cased / "vocab.txt").read_text(encoding="utf-8").splitlines()


def test_given_vocab_is_copied_not_trained(tmp_path, minilm_dir):
    out = run_tokenizer_stage(TokenizerConfig(vocab=str(minilm_dir / "vocab.txt")), tmp_path / "t")
    assert (out / "vocab.txt").read_text(encoding="utf-8").splitlines() == (
        (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    )
    assert read_marker(out) is not None


def test_a_vocab_whose_config_declares_the_other_casing_is_refused_before_any_work(tmp_path, minilm_dir):
    """A cased vocab.txt (tokenizer_config.json: do_lower_case false) under the default
    tokenizer.lowercase true was read lowercased, so 'Paris' could never match: now one message
    naming the file and the key, nothing written; with lowercase false it loads cased."""
    cased = tmp_path / "cased"
    cased.mkdir()
    (cased / "vocab.txt").write_bytes((minilm_dir / "vocab.txt").read_bytes() + b"Paris\n")
    (cased / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    with pytest.raises(UserError, match=r"do_lower_case false, but tokenizer\.lowercase is true.*--cased"):
        run_tokenizer_stage(TokenizerConfig(vocab=str(cased / "vocab.txt")), tmp_path / "t")
    assert not (tmp_path / "t").exists()
    out = run_tokenizer_stage(TokenizerConfig(vocab=str(cased), lowercase=False), tmp_path / "t")
    tok, lowercase = load_tokenizer(out)
    assert not lowercase and "Paris" in tok.encode("Paris").tokens
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is False


def test_cased_next_to_an_uncased_vocab_names_the_flag_to_drop(tmp_path, minilm_dir, capsys):
    """`bertflow tokenizer --vocab V --cased` of an uncased vocabulary said only "set
    tokenizer.lowercase: true": a user who followed it with --set kept --cased, which overrides it,
    and got the same refusal. The fix names --cased; without it the vocabulary loads."""
    from pipelines.cli import main as cli

    out = tmp_path / "tok"
    vocab = ["--vocab", str(minilm_dir / "vocab.txt"), "--output", str(out)]
    assert cli(["tokenizer", *vocab, "--cased", "--set", "tokenizer.lowercase=true"]) == 2
    err = capsys.readouterr().err
    assert "says do_lower_case true, but tokenizer.lowercase is false" in err
    assert "(leave out --cased, which sets it to false)" in err and not out.exists()
    assert cli(["tokenizer", *vocab]) == 0 and load_tokenizer(out)[1] is True


@pytest.mark.parametrize(
    "content, message",
    [
        ("hello\nworld\n", "special tokens"),
        ("[PAD]\n[PAD]\n", r"appears twice \(lines 1 and 2\)\. Fix: a vocab.txt lists each token once"),
        ("[PAD]\n[UNK]\n\n\n", r"lines 3 and 4 are blank; .* Fix: delete the blank lines"),
    ],
)
def test_bad_vocab_is_a_user_error(tmp_path, content, message):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text(content)
    with pytest.raises(UserError, match=message):
        load_tokenizer(vocab)


def test_missing_vocab_and_empty_corpus_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_tokenizer(tmp_path / "nope.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(UserError, match="no documents"):
        run_tokenizer_stage(TokenizerConfig(input=[str(empty)], vocab_size=100), tmp_path / "t")
    with pytest.raises(UserError, match="matches no file"):
        run_tokenizer_stage(TokenizerConfig(input=[str(tmp_path / "*.nothing")]), tmp_path / "t")


def test_a_corpus_without_documents_names_the_config_key_and_the_flag(tmp_path):
    """Inside `bertflow run CONFIG` the user set tokenizer.input, not --input: the fix names both; a
    JSONL whose lines lack the 'text' field is said by name with the field they have (as the
    preprocess stage says it)."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("   \n\n \t \n")
    with pytest.raises(UserError) as exc:
        run_tokenizer_stage(TokenizerConfig(input=[str(corpus)], vocab_size=100), tmp_path / "t")
    assert f"the corpus {corpus} holds no documents" in str(exc.value)
    assert "Fix: check tokenizer.input (--input): " in str(exc.value) and "JSONL a 'text' field" in str(
        exc.value
    )
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("\n".join(json.dumps({"body": f"Sentence {i}. Another one."}) for i in range(5)) + "\n")
    with pytest.raises(UserError) as exc:
        run_tokenizer_stage(TokenizerConfig(input=[str(jsonl)], vocab_size=100), tmp_path / "t")
    assert (
        f'Fix: {jsonl}: 5 lines have no string "text" field, skipped (the first has the fields "body")'
        in str(exc.value)
    )


def test_training_gives_the_same_vocabulary_in_every_process(tmp_path, data_dir):
    """The Rust trainer alone assigns `##x` ids in hash-map order (huggingface/tokenizers#1794), so
    two processes trained on the same text differed in ~half their ids; ours must not."""
    import subprocess
    import sys

    script = (
        "import sys; from preprocessing.wordpiece import train_tokenizer, vocab_list\n"
        f"lines = open({str(data_dir / 'wiki' / 'summaries_en.txt')!r}, encoding='utf-8').read().split('\\n')[:4000]\n"
        "open(sys.argv[1], 'w').write('\\n'.join(vocab_list(train_tokenizer(lines, vocab_size=2000))))\n"
    )
    outs = [tmp_path / f"v{i}.txt" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", script, str(o)]) for o in outs]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    assert outs[0].read_bytes() == outs[1].read_bytes()
    assert len(outs[0].read_text().split("\n")) == 2000


def test_every_single_character_continuation_can_be_produced(data_dir):
    """`##x` is registered for characters that can continue a word; BERT's normalizer puts spaces
    around CJK ideographs, so `##中` can never occur and only wasted an id (115 of make run's 8,192)."""
    from preprocessing.wordpiece import train_tokenizer, vocab_list

    texts = [*real_lines(data_dir, 400), "東京 is 日本 的 首都", "naïve café résumé"] * 2
    tok = train_tokenizer(texts, vocab_size=3000)
    continuations = [t for t in vocab_list(tok) if t.startswith("##") and len(t) == 3]
    assert "##e" in continuations and "##京" not in continuations
    for token in continuations:  # the character right after a letter stays in that word
        word = tok.normalizer.normalize_str("a" + token[2:])
        assert len(tok.pre_tokenizer.pre_tokenize_str(word)) == 1, token


def test_alphabet_keeps_only_the_most_frequent_characters(data_dir):
    """Rare characters do not take vocabulary entries (BERT keeps 1,000 characters): a word made
    of them becomes [UNK], and the freed entries go to whole words."""
    from collections import Counter

    from tokenizers.normalizers import BertNormalizer

    from preprocessing.wordpiece import train_tokenizer, vocab_list

    common = real_lines(data_dir, 400)
    counts = Counter(BertNormalizer(lowercase=True).normalize_str("".join(common)))
    limit = len([c for c, n in counts.items() if n >= 2 and not c.isspace()])
    rare = [chr(0x4E00 + i) for i in range(600)]  # 600 CJK characters, each seen once
    texts = common + [f"word{c}" for c in rare]
    tok = train_tokenizer(texts, vocab_size=3000, limit_alphabet=limit)
    vocab = vocab_list(tok)
    assert len([t for t in vocab if len(t) == 1]) <= limit and not set(rare) & set(vocab)
    unlimited = vocab_list(train_tokenizer(texts, vocab_size=3000, limit_alphabet=10_000))
    assert set(rare) <= set(unlimited)  # the limit is what removed them

    def words(v: list[str]) -> int:
        return len([t for t in v if len(t) > 1 and not t.startswith(("##", "["))])

    assert words(vocab) > words(unlimited)
    assert tok.encode(f"the {rare[0]} city", add_special_tokens=False).tokens == ["the", "[UNK]", "city"]


def test_a_word_wordpiece_never_splits_adds_no_vocabulary(data_dir):
    """Issue 14 item 6: one 50,000-character word added pieces that no text can ever produce
    (WordPiece encodes a word over max_input_chars_per_word as one [UNK]). Such words are left out
    of training and counted."""
    from collections import Counter

    from preprocessing.wordpiece import MAX_WORD_CHARS, train_tokenizer, vocab_list

    common = real_lines(data_dir, 300)
    counts: Counter = Counter()
    huge = "zqxjkv" * 9000  # 54,000 characters of pairs that repeat
    with_word = vocab_list(train_tokenizer([*common, f"a {huge} b"], vocab_size=800, counts=counts))
    assert with_word == vocab_list(train_tokenizer(common, vocab_size=800))
    assert counts["words_skipped_over_100_chars"] == 1
    assert len("x" * MAX_WORD_CHARS) == 100  # as BERT's max_input_chars_per_word
    # the bound itself: WordPiece still splits a word of exactly 100 characters, not one of 101
    for length, skipped in ((MAX_WORD_CHARS, 0), (MAX_WORD_CHARS + 1, 1)):
        counts.clear()
        train_tokenizer([*common, f"a {'q' * length} b"], vocab_size=800, counts=counts)
        assert counts["words_skipped_over_100_chars"] == skipped, length
    # 40 Hangul syllables are 40 characters, but 120 jamo once normalized: also one [UNK], also left out
    counts.clear()
    hangul = "한국어" * 13 + "말"
    train_tokenizer([*common, f"a {hangul} b"], vocab_size=800, counts=counts)
    assert counts["words_skipped_over_100_chars"] == 1


def test_a_vocabulary_with_a_byte_order_mark_loads(tmp_path, minilm_dir):
    """Issue 14 item 13: a vocab.txt saved with a UTF-8 BOM 'lacked the special tokens' ([PAD] was
    read as '\\ufeff[PAD]')."""
    from training.preflight import read_vocab

    text = (minilm_dir / "vocab.txt").read_text(encoding="utf-8")
    (tmp_path / "vocab.txt").write_text("\ufeff" + text, encoding="utf-8")
    tok, _ = load_tokenizer(tmp_path / "vocab.txt")
    assert tok.token_to_id("[PAD]") == 0 and tok.get_vocab_size() == len(text.splitlines())
    assert read_vocab(tmp_path)[0] == "[PAD]"


def test_an_exported_tokenizer_config_says_what_the_tokenizer_json_does(tmp_path, minilm_dir):
    """transformers rebuilds BERT's normalizer from tokenizer_config.json: a cased tokenizer.json
    that keeps accents and does not space CJK out, exported beside a model, must tokenize there as
    it does here. The config said lowercase (no config at the source) and nothing of the rest."""
    from tokenizers import Tokenizer
    from tokenizers.normalizers import BertNormalizer
    from transformers import AutoTokenizer

    from model.hf_io import copy_tokenizer_files

    tok = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tok.normalizer = BertNormalizer(lowercase=False, strip_accents=False, handle_chinese_chars=False)
    tok.no_padding()
    tok.no_truncation()
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    tok.save(str(src / "tokenizer.json"))
    copy_tokenizer_files(src, out)
    text = "Paris café 中文ab naïve"
    theirs = AutoTokenizer.from_pretrained(str(out))(text)["input_ids"]
    assert theirs == tok.encode(text).ids
    # the tokenizer stage loading it writes the same settings (its output is what models are exported with)
    staged = run_tokenizer_stage(
        TokenizerConfig(vocab=str(src / "tokenizer.json"), lowercase=False), tmp_path / "t"
    )
    assert AutoTokenizer.from_pretrained(str(staged))(text)["input_ids"] == tok.encode(text).ids


def test_a_vocab_size_the_training_cannot_give_is_said(tmp_path, data_dir, caplog):
    """vocab_size 50 gave 159 tokens without a word (the alphabet alone is larger): now a warning in
    the log and in the marker's `warnings`, naming both sizes and why; the vocabulary is unchanged."""
    src = tmp_path / "corpus.txt"
    src.write_text("\n\n".join(real_lines(data_dir, 300)), encoding="utf-8")
    out = run_tokenizer_stage(TokenizerConfig(input=[str(src)], vocab_size=50), tmp_path / "tok")
    got = len((out / "vocab.txt").read_text(encoding="utf-8").splitlines())
    assert got > 50
    [warning] = read_marker(out)["warnings"]
    assert f"vocab_size is 50, but the trained vocabulary has {got} tokens" in warning
    assert "alphabet" in warning and warning in caplog.text


def test_a_warning_is_marked_once_in_the_flows_log_and_by_the_command(tmp_path, data_dir, capsys):
    """The stage's warnings carried a `WARNING (DIR):` of their own, and the flow logs them at
    WARNING level: its console read `WARNING | ... - WARNING (DIR): ...`. The level marks it in
    the flow, `warning:` in the stand-alone command's log."""
    import logging

    from common.console import command_log_handler
    from pipelines.flow_tasks import stage_logs_to

    class RunLogger:  # a Prefect run logger's `log`
        def __init__(self) -> None:
            self.records: list[tuple[int, str]] = []

        def log(self, level: int, message: str) -> None:
            self.records.append((level, message))

    src = tmp_path / "corpus.txt"
    src.write_text("\n\n".join(real_lines(data_dir, 300)), encoding="utf-8")
    run_logger = RunLogger()
    with stage_logs_to(run_logger):
        out = run_tokenizer_stage(TokenizerConfig(input=[str(src)], vocab_size=50), tmp_path / "flow")
    [warning] = read_marker(out)["warnings"]
    assert (logging.WARNING, f"{out}: {warning}") in run_logger.records
    handler = command_log_handler()  # what `bertflow tokenizer` logs through
    logging.getLogger("bertflow").addHandler(handler)
    try:
        run_tokenizer_stage(TokenizerConfig(input=[str(src)], vocab_size=50), tmp_path / "command")
    finally:
        logging.getLogger("bertflow").removeHandler(handler)
    assert f" bertflow.tokenizer: warning: {tmp_path / 'command'}: {warning}\n" in capsys.readouterr().err


def test_training_flags_next_to_a_loaded_vocab_are_refused(tmp_path, minilm_dir, capsys):
    """--vocab-size / --input / --set tokenizer.vocab_size only apply when training: next to --vocab
    they were silently ignored. Refused before anything is written; in a YAML (kept from a template)
    they are a warning."""
    from pipelines.cli import main as cli

    out = tmp_path / "tok"
    vocab = ["--vocab", str(minilm_dir / "vocab.txt"), "--output", str(out)]
    for extra, named in (
        (["--vocab-size", "30522"], "--vocab-size"),
        (["--input", str(minilm_dir / "vocab.txt")], "--input"),
        (["--set", "tokenizer.vocab_size=100"], "--set tokenizer.vocab_size=100"),
    ):
        assert cli(["tokenizer", *vocab, *extra]) == 2
        err = capsys.readouterr().err
        assert f"{named} applies only when training a vocabulary" in err and "Fix: drop them" in err
        assert not out.exists()
    config = tmp_path / "cfg.yaml"
    config.write_text(f"tokenizer:\n  vocab: {minilm_dir / 'vocab.txt'}\n  vocab_size: 8192\n")
    assert cli(["tokenizer", str(config), "--output", str(out)]) == 0
    assert read_marker(out)["warnings"] == [
        f"tokenizer.vocab_size 8192 not used: the vocabulary is loaded from tokenizer.vocab "
        f"{minilm_dir / 'vocab.txt'}, not trained (drop tokenizer.vocab to train one with these settings)."
    ]


def test_a_corpus_in_another_encoding_is_said_by_name(tmp_path, data_dir, caplog):
    """A Latin-1 corpus trained with rc 0 and its count only in the marker; a UTF-16 one failed as
    'no documents' with a fix about non-empty lines. Now: a warning naming the file and the iconv
    command (log and marker), and the UTF-16 refusal says UTF-16 and how to convert it."""
    text = "\n\n".join(real_lines(data_dir, 200))
    latin = tmp_path / "latin1.txt"
    latin.write_bytes(text.encode("latin-1", errors="replace").replace(b"e", b"\xe9"))
    out = run_tokenizer_stage(TokenizerConfig(input=[str(latin)], vocab_size=300), tmp_path / "tok")
    [warning] = [w for w in read_marker(out)["warnings"] if str(latin) in w]
    assert "are not valid UTF-8" in warning and f"iconv -f latin1 -t utf-8 {latin}" in warning
    assert warning in caplog.text
    wide = tmp_path / "u16.txt"
    wide.write_bytes(text.encode("utf-16"))
    with pytest.raises(
        UserError, match=rf"{wide} is UTF-16 text, not UTF-8.*iconv -f UTF-16 -t UTF-8 {wide}"
    ):
        run_tokenizer_stage(TokenizerConfig(input=[str(wide)], vocab_size=300), tmp_path / "tok16")


def test_each_skip_is_logged_once_although_training_reads_the_corpus_twice(tmp_path, data_dir, caplog):
    """The trainer reads the corpus twice: a binary file's 'skipping' line, a line over 1 MB and an
    unclosed <doc> were each logged twice (counted once). Now each is said once per file, by the
    stage's warnings after training (the reader's own lines, also said by them, are quiet)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a_good.txt").write_text("\n\n".join(real_lines(data_dir, 100)) + "\n", encoding="utf-8")
    (corpus / "b_binary.bin").write_bytes(b"\x7fELF\x00\x01\x02" * 200)
    (corpus / "c_huge_line.txt").write_bytes(b"x" * (1 << 20) + b"y\nA short line. Another one.\n")
    (corpus / "d_wiki").write_text('<doc id="1" url="u" title="T">\nT\n\nFirst sentence. Second one.\n')
    out = run_tokenizer_stage(TokenizerConfig(input=[f"{corpus}/*"], vocab_size=300), tmp_path / "tok")
    said = [r.getMessage() for r in caplog.records]
    for expected in (
        f"{corpus / 'b_binary.bin'} is a binary file (NUL bytes)",
        f"{corpus / 'c_huge_line.txt'}: 1 line longer than 1 MB skipped",
        f"{corpus / 'd_wiki'}: 1 <doc> tag without </doc>",
    ):
        assert sum(expected in line for line in said) == 1, (expected, said)
    assert not [r for r in caplog.records if r.name == "preprocessing.corpus"]
    skipped = read_marker(out)["corpus"]
    assert skipped["files_skipped_binary"] == 1 and skipped["lines_skipped_over_1mb"] == 1


def test_a_folder_whose_vocab_txt_and_tokenizer_json_disagree_is_refused(tmp_path, minilm_dir):
    """The slow `transformers` tokenizer reads vocab.txt, the fast one tokenizer.json: a folder with a
    truncated vocab.txt beside a whole tokenizer.json was loaded (and exported) unsaid."""
    import shutil

    shutil.copy(minilm_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    words = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    (tmp_path / "vocab.txt").write_text("\n".join(words[:1000]) + "\n", encoding="utf-8")
    with pytest.raises(UserError) as refused:
        load_tokenizer(tmp_path)
    assert f"{tmp_path}: vocab.txt (1,000 tokens) and tokenizer.json ({len(words):,} tokens) disagree" in str(
        refused.value
    )
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    assert load_tokenizer(tmp_path)[0].get_vocab_size() == len(words)  # the same tokens: fine


def test_a_trained_vocabulary_in_a_named_output_is_not_retrained_over(tmp_path, data_dir, capsys):
    """`bertflow tokenizer --output DIR` with other settings than DIR's finished vocabulary retrained
    over it, unsaid (the vocabulary its shards and models were made with, gone); pretrain refuses
    the same mistake. Now refused, naming the setting, nothing touched; the old settings reuse it."""
    from pipelines.cli import main as cli

    src = tmp_path / "corpus.txt"
    src.write_text("\n\n".join(real_lines(data_dir, 400)), encoding="utf-8")
    out = tmp_path / "tok"
    command = ["tokenizer", "--input", str(src), "--output", str(out)]
    assert cli([*command, "--vocab-size", "500"]) == 0
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    assert cli([*command, "--vocab-size", "600"]) == 2
    err = capsys.readouterr().err
    assert f"{out} holds a finished tokenizer output made with other settings or inputs " in err
    assert "(tokenizer.vocab_size 500 -> 600)" in err and f"or delete {out} first" in err
    assert f"(the old ones find {out} again as it is)" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files
    assert cli([*command, "--vocab-size", "500"]) == 0  # the old settings find it again
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files


def test_a_corpus_written_on_lines_over_1_mb_is_said_so_not_empty(tmp_path, data_dir, caplog):
    """A document of megabytes on one line (lines over 1 MiB are skipped) was warned 'empty file'
    and refused with a fix about non-empty lines. Now the warning and the fix say that its every
    line was over 1 MB and how to break it up."""
    one_line = tmp_path / "book.txt"
    text = " ".join(real_lines(data_dir, 3000))
    assert len(text.encode()) > 2**20
    one_line.write_text(text + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=rf"{one_line}: all its text is in 1 line longer than 1 MB.*Break it"):
        run_tokenizer_stage(TokenizerConfig(input=[str(one_line)], vocab_size=300), tmp_path / "tok")
    assert "empty file" not in caplog.text


def test_a_model_folder_is_not_a_tokenizer_output(tmp_path, data_dir, minilm_dir, capsys):
    """`bertflow tokenizer --output RUN/pretrain/KEY/model` replaced the model's vocab.txt with a new
    vocabulary, rc 0: the model's own token ids then read as other words. Refused (as for every
    stage's output), nothing touched."""
    from pipelines.cli import main as cli

    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "vocab.txt"):
        (model / name).write_bytes((minilm_dir / name).read_bytes())
    src = tmp_path / "corpus.txt"
    src.write_text("\n\n".join(real_lines(data_dir, 400)), encoding="utf-8")
    command = ["tokenizer", "--input", str(src), "--vocab-size", "500", "--output", str(model)]
    assert cli(command) == 2
    assert f"the tokenizer output {model} is a model folder (it holds config.json)" in capsys.readouterr().err
    assert (model / "vocab.txt").read_bytes() == (minilm_dir / "vocab.txt").read_bytes()
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "vocab.txt"]


def test_a_loaded_vocabulary_in_a_named_output_is_not_replaced_by_another(
    tmp_path, data_dir, minilm_dir, capsys
):
    """`bertflow tokenizer --vocab OTHER --output T` over T's finished loaded vocabulary replaced it
    silently (`wrote T`): a loaded vocabulary's marker records no settings to compare. Now refused,
    naming both vocabularies and the fix, nothing touched; the same vocabulary again is a no-op."""
    from pipelines.cli import main as cli

    out = tmp_path / "tok"
    assert cli(["tokenizer", "--vocab", str(minilm_dir / "vocab.txt"), "--output", str(out)]) == 0
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    other = tmp_path / "other" / "vocab.txt"
    other.parent.mkdir()
    other.write_text("".join(f"{t}\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]))
    src = tmp_path / "corpus.txt"
    src.write_text("\n\n".join(real_lines(data_dir, 400)), encoding="utf-8")
    marked = (out / "_COMPLETE.json").stat().st_mtime_ns
    for command, new in (
        (["--vocab", str(other)], f"replace it with --vocab {other} (tokenizer sha256 "),
        (["--input", str(src), "--vocab-size", "500"], "replace it with a vocabulary trained from --input"),
    ):
        assert cli(["tokenizer", *command, "--output", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"{out} holds a finished tokenizer output loaded from {minilm_dir / 'vocab.txt'}" in err
        assert new in err and f"or delete {out} first" in err
        assert {p.name: p.read_bytes() for p in out.iterdir()} == files
    assert cli(["tokenizer", "--vocab", str(minilm_dir / "vocab.txt"), "--output", str(out)]) == 0
    assert (out / "_COMPLETE.json").stat().st_mtime_ns == marked  # the same vocabulary: nothing redone
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files


def test_a_folder_holding_the_users_tokenizer_files_is_refused(tmp_path, data_dir, capsys):
    """`bertflow tokenizer --output D` where D held the user's own vocab.txt and tokenizer.json
    (no marker: not a bertflow output) replaced both silently. Now refused before any work, naming
    the folder and the files; an empty folder, or one of unrelated files, is used; a killed run's
    leftovers (its _IN_PROGRESS.json) are rewritten."""
    from common.atomic import IN_PROGRESS_NAME
    from pipelines.cli import main as cli

    src = tmp_path / "corpus.txt"
    src.write_text("\n\n".join(real_lines(data_dir, 400)), encoding="utf-8")
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("vocab.txt", "tokenizer.json", "notes.md"):
        (mine / name).write_text("mine\n")
    command = ["tokenizer", "--input", str(src), "--vocab-size", "500", "--output"]
    assert cli([*command, str(mine)]) == 2
    err = capsys.readouterr().err
    assert f"the tokenizer output {mine} already holds tokenizer.json, vocab.txt, and it is not" in err
    assert "choose an --output folder of its own" in err
    assert all((mine / n).read_text() == "mine\n" for n in ("vocab.txt", "tokenizer.json", "notes.md"))
    assert sorted(p.name for p in mine.iterdir()) == ["notes.md", "tokenizer.json", "vocab.txt"]
    (mine / "vocab.txt").unlink()
    (mine / "tokenizer.json").unlink()
    assert cli([*command, str(mine)]) == 0  # only unrelated files: used, and they are kept
    assert (mine / "notes.md").read_text() == "mine\n" and read_marker(mine) is not None
    killed = tmp_path / "killed"  # what a run killed after writing vocab.txt leaves
    killed.mkdir()
    (killed / "vocab.txt").write_text("[PAD]\n")
    (killed / IN_PROGRESS_NAME).write_text(json.dumps({"pid": 2**22 + 1, "host": "gone"}))
    (tmp_path / ".killed.lock").write_text(f"{2**22 + 1}\n")  # the lock it held while it wrote
    assert cli([*command, str(killed)]) == 0
    assert (killed / "vocab.txt").read_bytes() == (mine / "vocab.txt").read_bytes()
    assert not (killed / IN_PROGRESS_NAME).exists()


def test_a_users_tmp_files_and_a_stale_lock_do_not_make_a_folder_bertflows(tmp_path, data_dir, capsys):
    """Any `.tmp-*` file counted as a killed run's leftover: a folder of the user's holding
    vocab.txt and their own `.tmp-draft` passed as bertflow's, vocab.txt was replaced and
    `.tmp-draft` deleted (deleted too in a folder of only unrelated files). The lock file
    `PARENT/.D.lock`, which outlives D (`rm -rf D` leaves it), made a new folder of the user's
    under that name pass too. Now only a temp file of a name the stage writes
    (`.tmp-vocab.txt.<random>`) is a leftover of its own, and the lock is no sign."""
    from common.dir_lock import lock_file_of
    from pipelines.cli import main as cli

    src = tmp_path / "corpus.txt"
    src.write_text("\n\n".join(real_lines(data_dir, 400)), encoding="utf-8")
    command = ["tokenizer", "--input", str(src), "--vocab-size", "500", "--output"]
    mine, reused = tmp_path / "mine", tmp_path / "reused"
    for folder in (mine, reused):
        folder.mkdir()
        (folder / "vocab.txt").write_text("mine\n")
    (mine / ".tmp-draft").write_text("mine\n")
    lock_file_of(reused).write_text("12345\n")  # left by a tokenizer output once named so
    for folder in (mine, reused):
        assert cli([*command, str(folder)]) == 2
        err = capsys.readouterr().err
        assert "already holds vocab.txt, and it is not a bertflow tokenizer output" in err
        assert "(no _COMPLETE.json: never written, or deleted; no _IN_PROGRESS.json of a killed run)" in err
        assert (f"{lock_file_of(folder)} says a bertflow run wrote a folder of this name before" in err) == (
            folder == reused
        )
        # a marker deleted by hand is refused too: without the lock, the fix still says so
        assert ("(if these are the files of a bertflow run whose _COMPLETE.json was deleted" in err) == (
            folder == mine
        )
        assert (folder / "vocab.txt").read_text() == "mine\n"
    assert (mine / ".tmp-draft").read_text() == "mine\n"
    (mine / "vocab.txt").unlink()
    assert cli([*command, str(mine)]) == 0  # only unrelated files: used, and they are kept
    assert (mine / ".tmp-draft").read_text() == "mine\n"
    killed = tmp_path / "killed"  # a run killed while writing vocab.txt
    killed.mkdir()
    (killed / "vocab.txt").write_text("[PAD]\n")
    (killed / ".tmp-vocab.txt.k2j_9x0a").write_text("[PAD]\n")
    assert cli([*command, str(killed)]) == 0
    assert sorted(p.name for p in killed.iterdir()) == sorted(
        p.name for p in mine.iterdir() if p.name != ".tmp-draft"
    )


def test_a_stray_in_progress_record_does_not_make_a_users_folder_a_killed_run(tmp_path, capsys, data_dir):
    """An `_IN_PROGRESS.json` copied into a user's folder, with no stage's lock file beside it, made
    the folder count as a killed run's: the tokenizer wrote its vocab.txt over the user's, unsaid.
    Now refused naming the stray record; with the lock beside it (a run that was killed) it is used."""
    from common.atomic import IN_PROGRESS_NAME
    from common.dir_lock import lock_file_of
    from pipelines.cli import main as cli

    src = tmp_path / "corpus.txt"
    src.write_text("\n\n".join(real_lines(data_dir, 400)), encoding="utf-8")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "vocab.txt").write_text("mine\n")
    (mine / IN_PROGRESS_NAME).write_text('{"pid": 1, "host": "elsewhere"}')
    argv = ["tokenizer", "--input", str(src), "--vocab-size", "500", "--output", str(mine)]
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert "already holds vocab.txt, and it is not a bertflow tokenizer output" in err, err
    assert f"its {IN_PROGRESS_NAME} is no killed run's: no bertflow stage held the lock beside it" in err
    assert "move vocab.txt out of" in err and (mine / "vocab.txt").read_text() == "mine\n"
    lock_file_of(mine).write_text("1\n")  # a stage held the lock: a killed run's files, written over
    assert cli(argv) == 0
    assert (mine / "vocab.txt").read_text() != "mine\n" and (mine / "_COMPLETE.json").is_file()


def test_a_users_complete_json_does_not_make_a_folder_bertflows(tmp_path, data_dir, capsys):
    """Any readable `_COMPLETE.json` made a folder count as a stage's own: `echo '{}' >
    D/_COMPLETE.json` beside the user's vocab.txt passed the foreign-files check (the tokenizer
    then refused for another reason, "a finished tokenizer output loaded from a vocabulary";
    `--vocab`, or the report command, replaced the files). Ours is a marker naming the stage, or,
    written before markers named their stage, one holding the key that stage's marker held."""
    from common.stage_output import refuse_foreign_files
    from pipelines.cli import main as cli

    src = tmp_path / "corpus.txt"
    src.write_text("\n\n".join(real_lines(data_dir, 400)), encoding="utf-8")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "vocab.txt").write_text("mine\n")
    for marker in (
        b"{}",
        b'{"stage": "mine"}',  # a stage bertflow has not: was "holds a bertflow mine output"
        b'{"done": true}',
        b"[1]",
        b'"done"',
        b"\xff\xfe",
    ):  # the last three: a traceback before
        (mine / "_COMPLETE.json").write_bytes(marker)
        argv = ["tokenizer", "--input", str(src), "--vocab-size", "500", "--output", str(mine)]
        assert cli(argv) == 2
        err = capsys.readouterr().err
        assert "already holds _COMPLETE.json, vocab.txt, and it is not a bertflow tokenizer output" in err
        said = "(its _COMPLETE.json is none a bertflow tokenizer writes, and there is no _IN_PROGRESS.json"
        assert said in err and "no _COMPLETE.json" not in err and "was deleted" not in err, err
        assert (mine / "vocab.txt").read_text() == "mine\n"
    (mine / "vocab.txt").unlink()  # the user's _COMPLETE.json is itself a file the stage writes: said, kept
    (mine / "_COMPLETE.json").write_text("{}")
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert "already holds _COMPLETE.json, and it is not a bertflow tokenizer output" in err, err
    assert "holds a finished tokenizer output" not in err and (mine / "_COMPLETE.json").read_text() == "{}"
    written = {"tokenizer": ("vocab.txt",), "preprocess": ("stats.json",), "pretrain": ("run_spec.json",)}
    old = {  # markers as bertflow wrote them before they named their stage
        "tokenizer": {"identity": {}, "vocab_size": 500, "tokenizer_sha256": "ab", "corpus": {}},
        "preprocess": {"examples": 12},
        "pretrain": {"fingerprint": "f0", "max_steps": 10, "model": "m"},
    }
    for stage, names in written.items():
        out = tmp_path / stage
        out.mkdir()
        (out / names[0]).write_text("x\n")
        for marker in (old[stage], {"stage": stage}):
            (out / "_COMPLETE.json").write_text(json.dumps(marker))
            refuse_foreign_files(out, stage, names)  # its own: used
        for other in set(old) - {stage}:
            (out / "_COMPLETE.json").write_text(json.dumps(old[other]))
            with pytest.raises(UserError, match=f"not a bertflow {stage} output"):
                refuse_foreign_files(out, stage, names)


def test_a_refused_input_entry_is_named_by_its_entry_not_as_a_bad_flag_value(tmp_path, capsys):
    """A list flag's refusal names the entry refused (tokenizer.input.0), as its own message does,
    not the whole list as a bad flag value."""
    from pipelines.cli import main as cli

    assert cli(["tokenizer", "--input", "data:", "--output", str(tmp_path / "tok")]) == 2
    err = capsys.readouterr().err
    assert "invalid tokenizer settings: tokenizer.input.0: 'data:' with no path" in err, err
    assert "bad flag value" not in err and not (tmp_path / "tok").exists()
