"""CoNLL-2003 features: labels on each word's first sub-token only; word-level entity F1."""

from __future__ import annotations

from pathlib import Path

from finetuning.batching import IGNORE_INDEX
from finetuning.ner import TokenTask, encode_words
from finetuning.tasks import get_task
from preprocessing.wordpiece import load_tokenizer


def test_first_subtoken_labels(minilm_dir):
    tok = load_tokenizer(minilm_dir)[0]
    spec = get_task("conll2003")
    label_ids = {t: i for i, t in enumerate(spec.labels)}
    sentences = [
        (["Akram", "Wasim", "beat", "Nottinghamshire", "1996-08-30"], ["B-PER", "I-PER", "O", "B-ORG", "O"])
    ]
    (feat,) = encode_words(tok, sentences, label_ids, 64)
    tokens = [tok.id_to_token(i) for i in feat["input_ids"]]
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    # ak ##ram was ##im beat nottinghamshire 1996 - 08 - 30: 11 pieces for 5 words
    assert len(tokens) == 13
    labelled = [(t, lab) for t, lab in zip(tokens, feat["labels"]) if lab != IGNORE_INDEX]
    assert [lab for _, lab in labelled] == [label_ids[t] for t in sentences[0][1]]
    assert all(not t.startswith("##") for t, _ in labelled)
    assert all(lab == IGNORE_INDEX for t, lab in zip(tokens, feat["labels"]) if t.startswith("##"))
    assert feat["labels"][0] == IGNORE_INDEX and feat["labels"][-1] == IGNORE_INDEX


def test_metric_reads_predictions_at_first_subtokens(minilm_dir, data_dir):
    tok = load_tokenizer(minilm_dir)[0]
    task = TokenTask(get_task("conll2003"), tok, 128, max_train=4, max_eval=200, data_root=str(data_dir))
    assert task.n_eval == 200 and task.notes["eval_words_truncated"] == 0
    # gold labels at first sub-tokens, garbage (label 1 = B-PER) on every other position
    perfect = [[lab if lab != IGNORE_INDEX else 1 for lab in f["labels"]] for f in task.eval_features]
    assert task.metrics(perfect)["entity_f1"] == 100.0
    all_o = [[0] * len(f["labels"]) for f in task.eval_features]
    assert task.metrics(all_o)["entity_f1"] == 0.0


def test_words_cut_by_the_sequence_length_are_counted_and_said_in_the_scorecard(
    minilm_dir, data_dir, tmp_path
):
    """They are scored as O, which caps the reachable F1 (99.5 at 64 tokens, 94 at 32): the
    count was in each unit's result only."""
    from finetuning.scorecard import build_scorecard

    tok = load_tokenizer(minilm_dir)[0]
    task = TokenTask(get_task("conll2003"), tok, 32, max_train=4, max_eval=200, data_root=str(data_dir))
    cut = task.notes["eval_words_truncated"]
    assert cut > 0
    result = {"unit": "conll2003-lr1e-3-s1", "task": "conll2003", "metric_names": ["entity_f1"],
              "metrics": {"entity_f1": 50.0}, "score": 50.0, "lr": 1e-3, "seed": 1, "checkpoint": "random:tiny",
              "checkpoint_label": "random:tiny", "checkpoint_kind": "random", "glue": False, "n_train": 4,
              "n_eval": 200, "epochs": 1.0, "max_seq_length": 32, "train_examples_per_s": 1.0, "notes": task.notes}  # fmt: skip
    card = build_scorecard([result], tmp_path)
    assert any(f"CoNLL dev words past max_seq_length, scored as O: {cut}" in n for n in card["notes"])


def _conll_task(folder: Path, train: str, dev: str, labels: str) -> Path:
    """A tasks.yaml of one CoNLL task 'ner' over `train` and `dev` (their text), tagged `labels`."""
    (folder / "train.txt").write_text(train)
    (folder / "dev.txt").write_text(dev)
    cfg = folder / "tasks.yaml"
    cfg.write_text(
        "ner: {format: conll, kind: token_classification, train: train.txt, dev: dev.txt, label: 1, "
        f"labels: [{labels}], metrics: [entity_f1]}}\n"
    )
    return cfg


def test_a_tag_of_the_dev_set_never_trained_on_is_warned_about(tmp_path, minilm_dir):
    """A CoNLL task whose dev set tags B-MISC where its training sentences never do ran silently, its
    MISC entities all missed: the data check now says so, as for a classification label, and the unit
    keeps the note for the scorecard's Notes."""
    from finetuning.tasks import check_requested_tasks, load_task_specs

    train, dev = (
        "Paris B-LOC\nis O\nnice O\n\nBob B-PER\nran O\n",
        "Bob B-PER\nsaw O\nEuro B-MISC\n2000 I-MISC\n",
    )
    cfg = _conll_task(tmp_path, train, dev, "O, B-PER, I-PER, B-LOC, I-LOC, B-MISC, I-MISC")
    notes = check_requested_tasks(["ner"], str(cfg), None, None, None)
    assert notes == [
        f"task 'ner': tags 'B-MISC', 'I-MISC' occur in {tmp_path / 'dev.txt'} (2 words) but never in the "
        f"2 training sentences read from {tmp_path / 'train.txt'}; the model cannot learn to predict "
        "them, so the entities they mark count as missed."
    ]
    task = TokenTask(load_task_specs(str(cfg))["ner"], load_tokenizer(minilm_dir)[0], 32, None, None, None)
    assert task.notes["labels"] == notes[0]


def test_a_conll_task_that_evaluates_on_its_training_file_is_said_so(tmp_path):
    """As for a TSV task: a CoNLL task whose `dev` is its train file scores examples it trained on."""
    from finetuning.tasks import check_requested_tasks

    cfg = _conll_task(tmp_path, "Paris B-LOC\nis O\nnice O\n", "", "O, B-LOC, I-LOC")
    cfg.write_text(cfg.read_text().replace("dev: dev.txt", "dev: train.txt"))
    notes = check_requested_tasks(["ner"], str(cfg), None, None, None)
    assert notes == [
        f"task 'ner': its dev file is its train file {tmp_path / 'train.txt'}, so its dev scores are "
        "measured on examples it was trained on, not on held-out ones."
    ]


def test_a_dev_set_without_entities_is_warned_about(tmp_path):
    """A dev set tagged O throughout (a few sentences of a cap, a file of one class) scored entity F1
    0.0 whatever the model predicted, shown as a result: the data check now says it measures nothing."""
    from finetuning.tasks import check_requested_tasks

    cfg = _conll_task(tmp_path, "Paris B-LOC\nis O\nnice O\n", "it O\nrains O\n", "O, B-LOC, I-LOC")
    assert check_requested_tasks(["ner"], str(cfg), None, None, None) == [
        f"task 'ner': the 1 dev sentence(s) read from {tmp_path / 'dev.txt'} hold no entity (every word "
        "is tagged O), so entity F1 is 0 whatever the model predicts."
    ]
