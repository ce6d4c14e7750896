"""Task definitions and readers on the real GLUE/CoNLL files; bad input names file and line;
our tokenization equals transformers' fast tokenizer."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from common.errors import UserError
from finetuning.glue import SequenceTask, encode_pairs
from finetuning.ner import read_conll
from finetuning.tasks import (
    TextExample,
    check_requested_tasks,
    dev_is_train_note,
    get_task,
    label_warnings,
    load_task_specs,
    read_tsv_examples,
)
from preprocessing.wordpiece import load_tokenizer
from tests.flow_support import USER_TASK

GLUE_DEV_ROWS = {"sst2": 872, "cola": 1043, "mrpc": 408, "rte": 277, "stsb": 1500}


@pytest.mark.parametrize("task", sorted(GLUE_DEV_ROWS))
def test_glue_dev_sets_read_completely(task, data_dir):
    spec = get_task(task)
    examples = read_tsv_examples(spec, spec.path("dev", str(data_dir)))
    assert len(examples) == GLUE_DEV_ROWS[task]
    assert all(e.text_a.strip() for e in examples)
    if spec.text_b:  # pair tasks: every example has its second sentence
        assert all(e.text_b is not None and e.text_b.strip() for e in examples)
    else:
        assert all(e.text_b is None for e in examples)
    if spec.kind == "regression":
        assert min(e.label for e in examples) >= 0 and max(e.label for e in examples) <= 5
    else:
        assert {e.label for e in examples} == set(range(spec.num_labels))


def test_glue_quirks(data_dir):
    mrpc = read_tsv_examples(get_task("mrpc"), data_dir / "glue/MRPC/dev.tsv")
    assert not mrpc[0].text_a.startswith("\ufeff")
    assert mrpc[0].text_b.startswith('"The foodservice')  # stray quote kept verbatim (QUOTE_NONE)
    cola = read_tsv_examples(get_task("cola"), data_dir / "glue/CoLA/dev.tsv")
    assert cola[0].text_a == "The sailors rode the breeze clear of the rocks." and cola[0].line == 1
    train = read_tsv_examples(get_task("sst2"), data_dir / "glue/SST-2/train.tsv", limit=10)
    assert len(train) == 10 and train[0].line == 2


def test_train_and_dev_caps_apply_to_their_own_split(minilm_dir, data_dir):
    """max_train caps the training examples and max_eval the dev set, each alone (a dev set cut to
    max_train scores on fewer examples than asked)."""
    tok = load_tokenizer(minilm_dir)[0]
    task = SequenceTask(get_task("sst2"), tok, 32, max_train=8, max_eval=20, data_root=str(data_dir))
    assert (task.n_train, task.n_eval) == (8, 20)
    assert (len(task.train_features), len(task.eval_features)) == (8, 20)


def test_builtin_task_files_exist(data_dir):
    for spec in load_task_specs().values():
        assert spec.path("train", str(data_dir)).is_file(), spec.name
        assert spec.path("dev", str(data_dir)).is_file(), spec.name


def _user_task(tmp_path: Path, data_dir: Path, body: str, rows: str | None = None) -> tuple[Path, Path]:
    tsv = tmp_path / "movies.tsv"
    if rows is None:
        src = (data_dir / "glue/SST-2/dev.tsv").read_text().splitlines()[1:41]
        rows = "text\tsentiment\n" + "".join(
            f"{line.split(chr(9))[0]}\t{'pos' if line.split(chr(9))[1].strip() == '1' else 'neg'}\n"
            for line in src
        )
    tsv.write_text(rows)
    cfg = tmp_path / "tasks.yaml"
    cfg.write_text(body.format(tsv=tsv))
    return cfg, tsv


def test_user_task_from_config(tmp_path, data_dir):
    cfg, tsv = _user_task(tmp_path, data_dir, USER_TASK)
    spec = load_task_specs(str(cfg))["movies"]
    assert spec.source == str(cfg) and "sst2" in load_task_specs(str(cfg))
    examples = read_tsv_examples(spec, spec.path("train"))
    assert len(examples) == 40 and {e.label for e in examples} == {0, 1}
    relative = tmp_path / "relative.yaml"  # a relative path is relative to the task config file
    relative.write_text(USER_TASK.format(tsv="movies.tsv"))
    assert load_task_specs(str(relative))["movies"].path("dev") == tsv


def test_a_task_config_edited_between_two_reads_is_read_again(tmp_path, data_dir):
    """Task files are parsed once per content stamp (a plan asks once per unit): an edit in the
    same process, a long-lived flow's, is seen; the parsed tasks are never shared for mutation."""
    cfg, _ = _user_task(tmp_path, data_dir, USER_TASK)
    assert load_task_specs(str(cfg))["movies"].metrics == ["accuracy", "f1"]
    cfg.write_text(cfg.read_text().replace("[accuracy, f1]", "[f1]") + "\n")
    assert load_task_specs(str(cfg))["movies"].metrics == ["f1"]
    load_task_specs(str(cfg)).pop("sst2")
    assert "sst2" in load_task_specs(str(cfg)) and "movies" not in load_task_specs()


def test_a_task_written_twice_is_refused(tmp_path, data_dir):
    cfg, _ = _user_task(tmp_path, data_dir, USER_TASK + USER_TASK.replace("[accuracy, f1]", "[f1]"))
    with pytest.raises(UserError, match=r"tasks.yaml: key 'movies' appears twice \(lines 2 and 12\)"):
        load_task_specs(str(cfg))


@pytest.mark.parametrize(
    "rows, words",
    [
        (
            "text\tsentiment\ngood film\tpos\nbad\tfilm\tneg\n",
            ["line 3", "3 tab-separated columns, expected 2"],
        ),
        ("text\tsentiment\ngood film\tpos\nbad film\t\n", ["line 3", "label is missing"]),
        ("text\tsentiment\ngood film\tpos\nbad film\tmeh\n", ["line 3", "unknown label 'meh'"]),
        ("", ["is empty"]),
        ("text\tsentiment\n", ["no examples"]),
        ("words\tsentiment\ngood\tpos\n", ["line 1", "no column 'text'"]),
    ],
)
def test_bad_tsv_names_file_and_line(tmp_path, data_dir, rows, words):
    cfg, tsv = _user_task(tmp_path, data_dir, USER_TASK, rows)
    spec = load_task_specs(str(cfg))["movies"]
    with pytest.raises(UserError) as err:
        read_tsv_examples(spec, spec.path("train"))
    assert str(tsv) in str(err.value)
    for w in words:
        assert w in str(err.value)


REGRESSION_TASK = (
    USER_TASK.replace("classification", "regression")
    .replace("  labels: [neg, pos]\n", "")
    .replace("[accuracy, f1]", "[pearson]")
)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "high"])
def test_a_regression_label_that_is_not_a_finite_number_is_refused(tmp_path, data_dir, value):
    """An infinite or NaN score would make the loss and the correlations non-finite."""
    rows = f"text\tsentiment\ngood film\t4.5\nbad film\t{value}\n"
    cfg, tsv = _user_task(tmp_path, data_dir, REGRESSION_TASK, rows)
    spec = load_task_specs(str(cfg))["movies"]
    with pytest.raises(UserError, match=rf"{re.escape(str(tsv))} line 3: label '{value}' is not a number"):
        read_tsv_examples(spec, spec.path("train"))
    good = read_tsv_examples(spec, spec.path("train"), limit=1)
    assert [e.label for e in good] == [4.5]


def test_bad_task_configs(tmp_path, data_dir):
    cfg, _ = _user_task(tmp_path, data_dir, USER_TASK.replace("{tsv}", "/nonexistent/movies.tsv"))
    spec = load_task_specs(str(cfg))["movies"]
    with pytest.raises(UserError, match="/nonexistent/movies.tsv does not exist"):
        read_tsv_examples(spec, spec.path("train"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(USER_TASK.format(tsv="m.tsv").replace("metrics:", "metricz:"))
    with pytest.raises(
        UserError,
        match=r"bad.yaml: task 'movies' is invalid: .*metricz: unknown key\. Fix: fix or remove the entry 'movies'",
    ):
        load_task_specs(str(bad))
    bad.write_text(USER_TASK.format(tsv="m.tsv").replace("[accuracy, f1]", "[pearson]"))
    with pytest.raises(UserError, match="do not fit kind classification"):
        load_task_specs(str(bad))
    with pytest.raises(UserError, match="does not exist"):
        load_task_specs(str(tmp_path / "missing.yaml"))
    with pytest.raises(UserError, match="unknown task 'nope'"):
        get_task("nope")
    bad.write_text(USER_TASK.format(tsv="m.tsv").replace("[neg, pos]", "[neg, pos, neg]"))
    with pytest.raises(UserError, match="`labels` has duplicates"):  # which id would 'neg' be?
        load_task_specs(str(bad))
    # token classification reads IOB2 chunks: BIOES tags (an S- or E- tag was read as O) and a
    # CoNLL label given by column name are refused up front
    ner = ("ner:\n  format: conll\n  kind: token_classification\n  train: t.txt\n  dev: t.txt\n"
           "  label: LABEL\n  labels: LABELS\n  metrics: [entity_f1]\n")  # fmt: skip
    bad.write_text(ner.replace("LABELS", "[O, S-PER, B-PER, E-PER]").replace("LABEL", "3"))
    with pytest.raises(UserError, match=r"labels \['S-PER', 'E-PER'\] are not IOB2 tags"):
        load_task_specs(str(bad))
    bad.write_text(ner.replace("LABELS", "[O, B-PER, I-PER]").replace("LABEL", "ner"))
    with pytest.raises(UserError, match="format conll takes `label` as a 0-based column index"):
        load_task_specs(str(bad))


def test_conll_reader(data_dir, tmp_path):
    spec = get_task("conll2003")
    sentences = read_conll(spec, data_dir / "conll2003/valid.txt")
    assert len(sentences) == 3250
    assert sentences[0] == (
        ["CRICKET", "-", "LEICESTERSHIRE", "TAKE", "OVER", "AT", "TOP", "AFTER", "INNINGS", "VICTORY", "."],
        ["O", "O", "B-ORG", "O", "O", "O", "O", "O", "O", "O", "O"],
    )
    bad = tmp_path / "bad.txt"
    bad.write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP B-VERB\n")
    with pytest.raises(UserError, match=r"bad.txt line 2: unknown tag 'B-VERB'"):
        read_conll(spec, bad)
    bad.write_text("EU NNP B-NP B-ORG\nrejects VBZ O\n")
    with pytest.raises(UserError, match=r"bad.txt line 2: 3 columns, expected 4"):
        read_conll(spec, bad)
    bad.write_text("EU B-ORG\nrejects O\n")  # the tags in column 1, the task reads column 3
    with pytest.raises(UserError, match=r"bad.txt line 1: 2 columns, so no label column 3"):
        read_conll(spec, bad)
    bad.write_bytes("M\xfcnchen NNP B-NP B-LOC\n".encode("latin-1"))  # CoNLL-2003 German ships Latin-1
    with pytest.raises(UserError, match=r"CoNLL file .*bad.txt is not UTF-8 text"):
        read_conll(spec, bad)


def test_tokenization_matches_transformers_fast(minilm_dir, data_dir, tmp_path):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(minilm_dir))
    ours_json = load_tokenizer(minilm_dir)[0]
    vocab_only = tmp_path / "vocab_only"
    vocab_only.mkdir()
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(minilm_dir / name, vocab_only / name)
    ours_vocab = load_tokenizer(vocab_only)[0]
    examples = read_tsv_examples(get_task("mrpc"), data_dir / "glue/MRPC/dev.tsv")[:100]
    examples.append(TextExample("Ünïcode café — naïve 東京 résumé", "don't STOP!!  tabs\tand  spaces", 0, 0))
    # a short first sentence and a long second one: only the second is cut, as transformers does
    examples.append(TextExample("Is it long?", " ".join(["a very long second sentence"] * 30), 0, 0))
    pairs = [(e.text_a, e.text_b) for e in examples]
    for max_len in (32, 128):
        want = hf([a for a, _ in pairs], [b for _, b in pairs], truncation=True, max_length=max_len)
        for tok in (ours_json, ours_vocab):
            got = encode_pairs(tok, examples, max_len)  # what the task models are fed
            assert [f["input_ids"] for f in got] == want["input_ids"]
            assert [f["token_type_ids"] for f in got] == want["token_type_ids"]
    assert any(
        len(ids) == 32
        for ids in hf([a for a, _ in pairs], [b for _, b in pairs], truncation=True, max_length=32)[
            "input_ids"
        ]
    )


def test_f1_is_refused_for_a_task_with_more_than_two_labels(tmp_path, data_dir):
    """`f1` is the F1 of the positive class, the last of two labels: on a 3-class task it was
    silently the F1 of the middle label."""
    cfg, _ = _user_task(tmp_path, data_dir, USER_TASK.replace("[neg, pos]", "[neg, neu, pos]"))
    with pytest.raises(UserError) as err:
        load_task_specs(str(cfg))
    assert re.search(
        r"tasks.yaml: task 'movies' is invalid: .*metric f1 is the F1 of the positive class, the last of "
        r"two labels, but the task has 3 labels .*; use mcc or accuracy",
        str(err.value),
    )
    assert load_task_specs()["mrpc"].metrics == ["accuracy", "f1"]  # two labels: f1 of "1"


def test_a_label_never_trained_on_or_a_one_class_dev_set_is_warned_about_once(
    tmp_path, data_dir, minilm_dir, capsys
):
    """Such a task ran silently (MCC 0.0, or accuracy with chance 100.0): now the data check before
    the units (`check_requested_tasks`, run by the flow's verify stage and by `bertflow finetune`)
    returns a warning naming the task, the file and the label, and each unit's result keeps it for
    the scorecard's Notes. A unit does not print it again: `bertflow finetune` printed it once per unit."""
    rows = "text\tsentiment\ngood film\tneg\nbad film\tneg\nfine film\tneg\n"
    cfg, tsv = _user_task(tmp_path, data_dir, USER_TASK, rows)
    notes = check_requested_tasks(["movies"], str(cfg), None, None, None)
    assert notes == [
        f"task 'movies': label 'pos' never occurs in the 3 training examples read from {tsv}; "
        "the model cannot learn to predict it.",
        f"task 'movies': every example of {tsv} has label 'neg'; F1 is undefined there and "
        "accuracy measures that one class only.",
        *dev_is_train_note(load_task_specs(str(cfg))["movies"], None).values(),  # USER_TASK's dev is train
    ]
    task = SequenceTask(
        load_task_specs(str(cfg))["movies"], load_tokenizer(minilm_dir)[0], 32, None, None, None
    )
    assert task.notes["labels"] == " ".join(notes[:2])
    assert capsys.readouterr().err == ""  # the unit keeps it, the check said it
    cfg, tsv = _user_task(tmp_path, data_dir, USER_TASK)  # both labels on both sides: no label warning
    assert check_requested_tasks(["movies"], str(cfg), None, None, None) == notes[2:]


def test_a_dev_set_of_the_positive_label_only_is_not_said_to_leave_f1_undefined(tmp_path, data_dir):
    """F1 is that of the positive label: a dev set of `pos` only defines it (the scorecard showed F1 0.0
    or 100.0), but the warning said 'MCC and F1 are undefined there' whatever the class and metrics.
    It now names the task's metrics the dev set leaves undefined and those it still measures."""
    rows = "text\tsentiment\ngood film\tpos\nbad film\tneg\n"
    cfg, tsv = _user_task(tmp_path, data_dir, USER_TASK, rows)
    dev = tmp_path / "dev.tsv"
    dev.write_text("text\tsentiment\nfine film\tpos\ngreat film\tpos\n")
    spec = load_task_specs(str(cfg))["movies"].model_copy(update={"dev": str(dev)})
    train = read_tsv_examples(spec, tsv)
    notes = label_warnings(spec, train, read_tsv_examples(spec, dev), tsv, dev)
    assert notes == [
        f"task 'movies': every example of {dev} has label 'pos'; accuracy and F1 measure that one class only."
    ]
    spec = spec.model_copy(update={"metrics": ["accuracy", "mcc", "f1"]})
    notes = label_warnings(spec, train, read_tsv_examples(spec, dev), tsv, dev)
    assert notes == [
        f"task 'movies': every example of {dev} has label 'pos'; MCC is undefined there and accuracy and F1 "
        "measure that one class only."
    ]


def test_a_csv_or_jsonl_file_given_as_tsv_is_named_as_such(tmp_path, data_dir):
    """README's task files are TSV. A user's CSV or JSON-lines file was refused with 'header has no
    column 'text' ... it has ['text,sentiment']' and 'Fix: name an existing column', which sends
    the user to the task definition; the fix now says the file is not tab-separated and to convert it."""
    for rows, kind in (
        ("text,sentiment\ngood film,pos\n", "comma-separated (CSV)"),
        ('{"text": "good film", "sentiment": "pos"}\n', "JSON lines"),
        ("good film\n", "one column"),
    ):
        cfg, tsv = _user_task(tmp_path, data_dir, USER_TASK, rows)
        with pytest.raises(UserError) as err:
            read_tsv_examples(load_task_specs(str(cfg))["movies"], tsv)
        assert f"{tsv} line 1 has no tab: it looks {kind}" in str(err.value)
        assert "format tsv reads tab-separated columns" in str(err.value)
    # the first line with text is the one judged, and named by its number
    cfg, tsv = _user_task(tmp_path, data_dir, USER_TASK, "\n\ntext,sentiment\ngood film,pos\n")
    with pytest.raises(UserError, match=re.escape(f"{tsv} line 3 has no tab: it looks comma-separated")):
        read_tsv_examples(load_task_specs(str(cfg))["movies"], tsv)
    headerless = NUMBERED_TASK.replace("HEADER", "header: false\n  ").replace("t.tsv", "movies.tsv")
    cfg, tsv = _user_task(tmp_path, data_dir, headerless, "\ngood film\tpos\n")
    assert [e.text_a for e in read_tsv_examples(load_task_specs(str(cfg))["mine"], tsv)] == ["good film"]
    # a task that reads one column only (its text is its label) needs no tab
    one = headerless.replace("label: 1", "label: 0").replace("[neg, pos]", "[good, bad]")
    cfg, tsv = _user_task(tmp_path, data_dir, one, "good\nbad\n")
    assert [e.label for e in read_tsv_examples(load_task_specs(str(cfg))["mine"], tsv)] == [0, 1]


def test_a_task_that_evaluates_on_its_training_file_is_said_so(tmp_path, data_dir, minilm_dir):
    """A user task with `dev` set to its train file trained and scored without a word: its dev scores
    were measured on the examples it trained on. The data check warns, and the scorecard's Notes keep it."""
    cfg, tsv = _user_task(tmp_path, data_dir, USER_TASK)
    note = (
        f"task 'movies': its dev file is its train file {tsv}, so its dev scores are measured on "
        "examples it was trained on, not on held-out ones."
    )
    assert check_requested_tasks(["movies"], str(cfg), None, None, None) == [note]
    task = SequenceTask(
        load_task_specs(str(cfg))["movies"], load_tokenizer(minilm_dir)[0], 32, None, None, None
    )
    assert task.notes["dev"] == note
    from finetuning.scorecard import build_scorecard

    result = {
        "unit": "movies-lr5e-05-s1", "task": "movies", "metric_names": ["accuracy"], "metrics": {"accuracy": 90.0},
        "score": 90.0, "lr": 5e-5, "seed": 1, "checkpoint": "/x/ours", "checkpoint_label": "ours",
        "checkpoint_kind": "pretrained", "glue": False, "n_train": 40, "n_eval": 40, "epochs": 1.0,
        "max_seq_length": 32, "train_examples_per_s": 1.0, "notes": task.notes, "chance_metrics": None,
    }  # fmt: skip
    build_scorecard([result], tmp_path / "card")
    assert f"- Dev set: {note}" in (tmp_path / "card" / "scorecard.md").read_text()


def test_the_dev_is_train_note_compares_the_files_themselves_and_spares_squad(tmp_path, data_dir):
    """The note is given where `dev` names the train file however written, not where it names another
    file; never for a SQuAD task, whose one file is split by article into train and dev."""
    cfg, tsv = _user_task(tmp_path, data_dir, USER_TASK)
    spec = load_task_specs(str(cfg))["movies"]
    (tmp_path / "sub").mkdir()
    same = spec.model_copy(update={"dev": str(tmp_path / "sub" / ".." / tsv.name)})
    assert list(dev_is_train_note(same, None)) == ["dev"]
    other = tmp_path / "dev.tsv"
    shutil.copy(tsv, other)
    assert dev_is_train_note(spec.model_copy(update={"dev": str(other)}), None) == {}
    squad = get_task("squad")
    assert squad.path("train", str(data_dir)) == squad.path("dev", str(data_dir))
    assert dev_is_train_note(squad, str(data_dir)) == {}


def test_a_classification_with_one_label_is_refused(tmp_path, data_dir):
    """`labels: [pos]` trained a one-way classifier that can only answer `pos`: it reported accuracy
    100.0 on a dev set of that label (a kept model's config, num_labels 1, reads as a regression in
    transformers). Refused where the task file is read."""
    cfg, _ = _user_task(tmp_path, data_dir, USER_TASK.replace("[neg, pos]", "[pos]").replace(", f1", ""))
    with pytest.raises(UserError) as err:
        load_task_specs(str(cfg))
    assert re.search(
        r"task 'movies' is invalid: .*kind classification needs two labels or more, this task has 1 \['pos'\]",
        str(err.value),
    )


def test_integer_labels_are_read_as_their_text(tmp_path, data_dir):
    """`labels: [0, 1]` failed with `labels.0: Input should be a valid string` and a fix that did not
    say to quote them, blocking every other task of the file; TSV labels are read as text."""
    rows = "text\tsentiment\ngood film\t1\nbad film\t0\n"
    cfg, _ = _user_task(tmp_path, data_dir, USER_TASK.replace("[neg, pos]", "[0, 1]"), rows)
    spec = load_task_specs(str(cfg))["movies"]
    assert spec.labels == ["0", "1"]
    assert [e.label for e in read_tsv_examples(spec, spec.path("train"))] == [1, 0]


NUMBERED_TASK = """mine:
  format: tsv
  kind: classification
  train: t.tsv
  dev: t.tsv
  HEADERtext_a: 0
  label: 1
  labels: [neg, pos]
  metrics: [accuracy]
"""


def test_columns_by_number_without_header_set_are_refused_not_read_losing_a_row(tmp_path):
    """`text_a: 0, label: 1` with no `header:` line read a header-less file's first row as a header
    and skipped it (two rows trained on one), unsaid. Refused with the fix; `header: false` reads
    every row and `header: true` skips the first line as before."""
    (tmp_path / "t.tsv").write_text("good film\tpos\nbad film\tneg\n")
    cfg = tmp_path / "tasks.yaml"
    cfg.write_text(NUMBERED_TASK.replace("HEADER", ""))
    with pytest.raises(UserError, match=r"task 'mine' is invalid: .*`header` is not set.*`header: false`"):
        load_task_specs(str(cfg))
    for header, rows in (("false", ["good film", "bad film"]), ("true", ["bad film"])):
        cfg.write_text(NUMBERED_TASK.replace("HEADER", f"header: {header}\n  "))
        spec = load_task_specs(str(cfg))["mine"]
        assert [e.text_a for e in read_tsv_examples(spec, spec.path("train"))] == rows
    # columns by name and number: the header is read by default, as a name needs one
    (tmp_path / "t.tsv").write_text("text\tsentiment\ngood film\tpos\n")
    cfg.write_text(NUMBERED_TASK.replace("HEADER", "").replace("text_a: 0", "text_a: text"))
    spec = load_task_specs(str(cfg))["mine"]
    assert [(e.text_a, e.label) for e in read_tsv_examples(spec, spec.path("train"))] == [("good film", 1)]
    # num_columns is the row width, also where a header names fewer columns than a row holds
    (tmp_path / "t.tsv").write_text("text\tsentiment\ngood film\tpos\tsource\n")
    cfg.write_text(NUMBERED_TASK.replace("HEADER", "header: true\n  num_columns: 3\n  "))
    spec = load_task_specs(str(cfg))["mine"]
    assert [e.text_a for e in read_tsv_examples(spec, spec.path("train"))] == ["good film"]


@pytest.mark.parametrize("text", ["", "# my tasks, to be written\n\n", "{}\n"])
def test_an_empty_task_config_is_refused_not_read_as_no_change(tmp_path, text):
    """An empty --task-config (a file saved empty, or only comments) was read as no definitions, so
    `--tasks sst2 --task-config mine.yaml` fine-tuned the built-in SST-2 instead of the user's own
    data, unsaid. Refused, naming the file and the fix."""
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(
        UserError, match=rf"task config {re.escape(str(path))} defines no task .*Fix: define"
    ) as err:
        get_task("sst2", str(path))
    assert "or drop --task-config / finetune.task_config." in str(err.value)  # `bertflow run` has no flag


def test_task_config_messages_name_the_config_key_too(tmp_path, monkeypatch):
    """`bertflow run` has no --task-config flag: its messages told a user of `finetune.task_config`
    to pass one (`bertflow run: error: unrecognized arguments` when followed), and a relative path
    did not say where it was looked for."""
    from finetuning.config import FinetuneConfig
    from finetuning.units import finetune_units

    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        UserError, match=re.escape(f"relative to the current directory, {tmp_path}")
    ) as missing:
        load_task_specs("ut/tasks.yaml")
    with pytest.raises(UserError) as unknown_task:
        get_task("nope")
    with pytest.raises(UserError) as unknown_tasks:
        finetune_units(FinetuneConfig(tasks=["nope"]))
    for exc in (missing, unknown_task, unknown_tasks):
        assert "--task-config / finetune.task_config" in str(exc.value)
