"""SQuAD v1.1: the fixed article split, doc-stride windows, answer labelling and n-best decoding."""

from __future__ import annotations

import numpy as np
import pytest

from finetuning.squad import SquadTask, best_span, encode_windows, read_squad, split_articles
from finetuning.tasks import get_task
from preprocessing.wordpiece import load_tokenizer


@pytest.fixture(scope="module")
def squad(data_dir):
    spec = get_task("squad")
    return spec, read_squad(spec.path("train", str(data_dir)), spec)


def test_split_by_article_is_fixed(squad):
    spec, articles = squad
    assert len(articles) == 48 and sum(len(a) for a in articles) == 10570
    train, dev = split_articles(articles, spec.squad_train_articles)
    assert len(train) + len(dev) == 10570
    train_contexts = {e.context for e in train}
    assert not any(e.context in train_contexts for e in dev)  # no paragraph on both sides
    assert [e.qid for e in split_articles(articles, 38)[1][:5]] == [e.qid for e in articles[38][:5]]


def test_windows_cover_long_contexts_and_label_answers(squad, minilm_dir):
    _, articles = squad
    tok = load_tokenizer(minilm_dir)[0]
    examples = articles[0][:60]
    features = encode_windows(tok, examples, max_seq_length=128, train=True)
    assert len(features) > len(examples)  # long contexts were split into several windows
    assert max(len(f["input_ids"]) for f in features) == 128
    per_example: dict[int, list] = {}
    for f in features:
        per_example.setdefault(f["example"], []).append(f)
    for i, ex in enumerate(examples):
        windows = per_example[i]
        answered = [f for f in windows if f["start"] > 0]
        assert answered, f"answer of {ex.qid} is in no window"
        # exactly the context tokens that overlap the answer's characters: not the token before
        # that ends where the answer starts ('"', '(') nor the one after that starts where it
        # ends ('.', ',')
        tok.no_truncation()
        full = tok.encode(ex.question, ex.context)
        first, end = ex.answer_start, ex.answer_start + len(ex.answers[0])
        gold = [
            t
            for t, (a, b), s in zip(full.ids, full.offsets, full.sequence_ids)
            if s == 1 and a < end and b > first
        ]
        for f in answered:
            assert f["input_ids"][f["start"] : f["end"] + 1] == gold, (ex.answers[0], tok.decode(gold))
    # every context token of the full pair appears in some window (doc stride drops nothing)
    eval_features = encode_windows(tok, examples, max_seq_length=128, train=False)
    for i, ex in enumerate(examples):
        tok.no_truncation()
        full = tok.encode(ex.question, ex.context)
        wanted = {off for off, s in zip(full.offsets, full.sequence_ids) if s == 1}
        covered = {off for f in eval_features if f["example"] == i for off in f["context_offsets"].values()}
        assert covered == wanted


def test_best_span_respects_rules():
    offsets = {i: (10 * i, 10 * i + 5) for i in range(3, 10)}  # tokens 3..9 are context
    start = np.zeros(12)
    end = np.zeros(12)
    start[1], end[1] = 50, 50  # question token: not allowed
    start[6], end[4] = 10, 10  # end before start: not allowed
    start[5], end[7] = 5, 6
    score, span = best_span(start, end, offsets)
    assert span == (60, 75) and score == pytest.approx(16)  # (6, 7); (6, 4) would score 20
    start[3], end[9] = 100, 100
    assert best_span(start, end, offsets)[1] == (30, 95)
    assert best_span(start, end, {k: v for k, v in offsets.items() if k != 9})[1] == (30, 45)
    # at most MAX_ANSWER_LENGTH (30) tokens: tokens 3..32 may be the answer, 3..33 may not
    offsets = {i: (10 * i, 10 * i + 5) for i in range(3, 40)}
    start, end = np.full(40, -100.0), np.full(40, -100.0)
    start[3], end[32], end[33] = 10, 5, 20
    assert best_span(start, end, offsets)[1] == (30, 325)  # (3, 33) would score 30


def test_perfect_logits_decode_to_gold_answers(squad, minilm_dir, data_dir):
    """Logits that peak at the gold tokens must decode to the gold text: EM near 100 on the eval part."""
    spec, _ = squad
    tok = load_tokenizer(minilm_dir)[0]
    task = SquadTask(spec, tok, 128, max_train=5, max_eval=80, data_root=str(data_dir))
    assert "first 38 articles train" in task.notes["squad_split"]
    # each cap applies to its own part, and counts questions, not their (more) context windows
    assert (task.n_train, task.n_eval, len(task.dev)) == (5, 80, 80)
    assert len(task.eval_features) > task.n_eval
    labelled = encode_windows(tok, task.dev, 128, train=True)
    assert len(labelled) == len(task.eval_features)
    outputs = []
    for f in labelled:
        n = len(f["input_ids"])
        start, end = np.zeros(n, dtype=np.float32), np.zeros(n, dtype=np.float32)
        if f["start"] > 0:
            start[f["start"]] = end[f["end"]] = 10.0
        outputs.append((start, end))
    scores = task.metrics(outputs)
    assert scores["exact_match"] >= 95.0 and scores["f1"] >= 97.0
    shuffled = outputs[1:] + outputs[:1]  # logits of the wrong windows: far worse
    assert task.metrics(shuffled)["f1"] < 50.0


@pytest.mark.parametrize("max_seq_length", [32, 48, 54, 128])
def test_short_windows_and_long_questions_are_windowed_not_crashed(squad, minilm_dir, max_seq_length):
    """Questions longer than the window raised a truncation error, and at 38-54 tokens the
    tokenizer's windowing panicked (a BaseException that took the whole command down): the
    question is cut to leave the context more than the stride."""
    from finetuning.squad import QAExample

    _, articles = squad
    tok = load_tokenizer(minilm_dir)[0]
    long = articles[0][0]
    long = QAExample(
        long.qid,
        " ".join(["what"] * 120) + " " + long.question,
        long.context,
        long.answers,
        long.answer_start,
    )
    examples = [*articles[0][:20], long]
    features = encode_windows(tok, examples, max_seq_length=max_seq_length, train=True)
    assert {f["example"] for f in features} == set(range(len(examples)))
    assert max(len(f["input_ids"]) for f in features) <= max_seq_length


def test_windows_too_short_for_squad_and_no_questions_are_user_errors(squad, minilm_dir, tmp_path):
    import json

    from common.errors import UserError
    from finetuning.trainer import train

    _, articles = squad
    tok = load_tokenizer(minilm_dir)[0]
    with pytest.raises(UserError, match="max_seq_length 12 is too short for SQuAD"):
        encode_windows(tok, articles[0][:2], max_seq_length=12, train=True)
    # the training part without a question: the step loop waited forever for a first batch
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"data": [{"paragraphs": []}] * 40 + [{"paragraphs": [{"context": "a b",
        "qas": [{"id": f"q{i}", "question": "a?", "answers": [{"text": "b", "answer_start": 2}]}]}]}
        for i in range(10)]}))  # fmt: skip
    spec = get_task("squad").model_copy(update={"train": str(path), "dev": str(path)})
    with pytest.raises(UserError, match="hold 0 questions to train on"):
        SquadTask(spec, tok, 128, None, None, None)
    with pytest.raises(UserError, match="no training examples"):
        train(
            None,
            [],
            lr=1e-3,
            epochs=1,
            batch_size=8,
            weight_decay=0,
            warmup_proportion=0,
            seed=1,
            device=None,
        )


def test_malformed_squad_files_name_the_article_or_question(tmp_path):
    """A missing field was a bare KeyError; an answer_start that does not point at the answer
    trained on the wrong span without a word (BERT's run_squad warns and skips it)."""
    import json

    from common.errors import UserError

    spec = get_task("squad")
    path = tmp_path / "squad.json"
    qa = {"id": "q1", "question": "which?", "answers": [{"text": "gamma", "answer_start": 0}]}
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": "alpha beta gamma", "qas": [qa]}]}]}))
    with pytest.raises(
        UserError, match=r"question 'q1' \(article 0\): answer 'gamma' is not at answer_start 0"
    ):
        read_squad(path, spec)
    path.write_text(json.dumps({"data": [{"paragraphs": [{"qas": [qa]}]}]}))
    with pytest.raises(UserError, match=r"article 0 is not in the SQuAD v1.1 layout \(KeyError: 'context'\)"):
        read_squad(path, spec)


def test_qa_loss_is_the_mean_start_and_end_cross_entropy_over_real_tokens():
    """Padding is no answer candidate: the loss is (CE(start) + CE(end)) / 2 over each window's
    own tokens, the same however wide the batch is padded (BERT's run_squad loss)."""
    import torch
    import torch.nn.functional as F

    from model.config import BertConfig
    from model.heads import BertForQuestionAnswering

    torch.manual_seed(0)
    model = BertForQuestionAnswering(BertConfig.from_preset("tiny", vocab_size=100)).eval()
    lengths, starts, ends = [10, 7], torch.tensor([2, 5]), torch.tensor([4, 6])
    gen = torch.Generator().manual_seed(1)
    ids = [torch.randint(1, 100, (n,), generator=gen) for n in lengths]

    def batch(width):
        input_ids = torch.zeros(len(ids), width, dtype=torch.long)
        mask = torch.zeros(len(ids), width, dtype=torch.long)
        for i, row in enumerate(ids):
            input_ids[i, : len(row)], mask[i, : len(row)] = row, 1
        with torch.no_grad():
            return model(input_ids, torch.zeros_like(input_ids), mask, starts, ends)

    loss, start_logits, end_logits = batch(10)
    real = [
        (F.cross_entropy(start_logits[i, :n], starts[i]) + F.cross_entropy(end_logits[i, :n], ends[i])) / 2
        for i, n in enumerate(lengths)
    ]
    assert loss.item() == pytest.approx(torch.stack(real).mean().item(), rel=1e-5)
    assert batch(16)[0].item() == pytest.approx(loss.item(), rel=1e-5)  # 6 more pad columns


def test_a_squad_unit_counts_questions_not_windows(minilm_dir, data_dir, tmp_path):
    """A unit's n_eval is the number of dev questions (the chance margin's n), not the number of
    context windows they are cut into."""
    from common.tracking import WandbTarget
    from finetuning.config import FinetuneConfig
    from finetuning.fanout import plan
    from finetuning.units import run_finetune_unit

    cfg = FinetuneConfig(
        tasks=["squad"],
        max_train_examples=4,
        max_eval_examples=4,
        epochs=1.0,
        max_seq_length=64,
        batch_size=8,
    )
    [job] = plan(cfg, ["random:tiny"], tmp_path, tokenizer_dir=minilm_dir, data_root=str(data_dir))
    result = run_finetune_unit(cfg, job, data_root=str(data_dir), wandb=WandbTarget(mode="disabled"))
    assert result["n_train"] == 4 and result["n_eval"] == 4
    assert set(result["metrics"]) == {"exact_match", "f1"}


def _squad_file(path, prefix: str, n_articles: int) -> None:
    import json

    qas = [{"id": f"{prefix}{i}", "question": "which?", "answers": [{"text": "gamma", "answer_start": 11}]}
           for i in range(n_articles)]  # fmt: skip
    articles = [{"paragraphs": [{"context": "alpha beta gamma", "qas": [qa]}]} for qa in qas]
    path.write_text(json.dumps({"data": articles}))


def test_an_own_squad_task_evaluates_on_its_dev_file(minilm_dir, tmp_path):
    """A task with its own `dev` file was split by article like the built-in one: it failed with
    `squad_train_articles=38 leaves no article for evaluation` (no fix), or with
    squad_train_articles: 2 evaluated on the train file's third article, never reading dev."""
    from common.errors import UserError
    from finetuning.tasks import load_task_specs

    _squad_file(tmp_path / "qa_train.json", "t", 3)
    _squad_file(tmp_path / "qa_dev.json", "d", 2)
    cfg = tmp_path / "tasks.yaml"
    cfg.write_text("myqa: {format: squad, kind: span_extraction, train: qa_train.json, dev: qa_dev.json, "
                   "metrics: [exact_match, f1]}\n")  # fmt: skip
    tok = load_tokenizer(minilm_dir)[0]
    task = SquadTask(load_task_specs(str(cfg))["myqa"], tok, 64, None, None, None)
    assert [e.qid for e in task.dev] == ["d0", "d1"] and task.n_train == 3
    assert (
        task.notes["squad_split"]
        == "train on qa_train.json, evaluate on qa_dev.json (3 train / 2 eval questions used)"
    )
    cfg.write_text(cfg.read_text().replace("metrics:", "squad_train_articles: 2, metrics:"))
    with pytest.raises(UserError, match=r"task 'myqa' is invalid: .*remove squad_train_articles"):
        load_task_specs(str(cfg))
    # the train file split by article (dev: the same file) still needs an article left to evaluate
    cfg.write_text(cfg.read_text().replace("qa_dev.json", "qa_train.json").replace(": 2", ": 3"))
    with pytest.raises(
        UserError,
        match=r"qa_train.json: squad_train_articles=3 leaves no article.*Fix: set squad_train_articles below 3",
    ):
        SquadTask(load_task_specs(str(cfg))["myqa"], tok, 64, None, None, None)


def test_squad_chance_is_a_no_learning_baseline_on_the_evaluation_questions(
    squad, minilm_dir, data_dir, tmp_path
):
    """SQuAD's chance was 0 with a 1-point margin, so random init (EM 0.5 / F1 2.6) was not marked
    "(chance)" while the context sentence sharing most words with the question scores F1 ~21 on
    the same questions (official EM/F1). That baseline is now the reference point."""
    from finetuning.scorecard import build_scorecard

    spec, _ = squad
    task = SquadTask(
        spec, load_tokenizer(minilm_dir)[0], 64, max_train=2, max_eval=200, data_root=str(data_dir)
    )
    chance = task.chance_metrics()
    assert chance["f1"] > 15.0 and set(chance) == {"exact_match", "f1"}

    def result(label, kind, metrics):
        return {"unit": "squad-lr5e-05-s1", "task": "squad", "metric_names": list(metrics), "metrics": metrics,
                "score": sum(metrics.values()) / 2, "lr": 5e-5, "seed": 1, "checkpoint": "/x/" + label,
                "checkpoint_label": label, "checkpoint_kind": kind, "glue": False, "n_train": 2, "n_eval": 200,
                "epochs": 1.0, "max_seq_length": 64, "train_examples_per_s": 1.0, "notes": {},
                "chance_metrics": chance}  # fmt: skip

    results = [result("ours", "pretrained", {"exact_match": 40.0, "f1": 50.0}),
               result("random:tiny", "random", {"exact_match": 0.5, "f1": 2.6})]  # fmt: skip
    card = build_scorecard(results, tmp_path)
    assert [row["tasks"]["squad"]["at_chance"] for row in card["rows"]] == [False, True]
    md = (tmp_path / "scorecard.md").read_text()
    assert "| random init (tiny) | 0.5 (chance) | 2.6 (chance) |" in md
    assert (
        "| chance: best constant prediction; SQuAD: the context sentence sharing most words with the question |"
        in md
    )


def test_readme_states_the_squad_windowing_settings():
    """The doc stride, question and answer lengths and n-best were in the code only."""
    from pathlib import Path

    from finetuning.squad import DOC_STRIDE, MAX_ANSWER_LENGTH, MAX_QUERY_LENGTH, N_BEST

    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    assert f"overlap by min({DOC_STRIDE}, max_seq_length / 4) tokens (transformers' `stride`" in readme
    assert f"cut to at most {MAX_QUERY_LENGTH} tokens" in readme
    assert f"at most {MAX_ANSWER_LENGTH} tokens among each window's {N_BEST} best starts" in readme


def test_a_question_id_used_twice_in_a_squad_file_is_refused(tmp_path):
    """Answers and predictions are keyed by question id: a second question with the same id replaced
    the first, so the unit scored one question fewer than the scorecard's eval count said, silently."""
    import json

    from common.errors import UserError

    spec = get_task("squad")
    path = tmp_path / "squad.json"
    qa = {"id": "q1", "question": "which?", "answers": [{"text": "gamma", "answer_start": 11}]}
    other = {**qa, "question": "what?"}
    paragraphs = [
        {"context": "alpha beta gamma", "qas": [qa]},
        {"context": "alpha beta gamma", "qas": [other]},
    ]
    path.write_text(json.dumps({"data": [{"paragraphs": paragraphs[:1]}, {"paragraphs": paragraphs[1:]}]}))
    with pytest.raises(UserError, match=r"question id 'q1' is used twice \(articles 0 and 1\)"):
        read_squad(path, spec)


def test_a_squad_file_of_one_article_is_not_told_to_split_below_one(squad):
    """Where `dev` is the train file and it holds one article (or none), the fix said 'set
    squad_train_articles below 1', a value the schema refuses (ge=1): only a separate dev file helps."""
    from common.errors import UserError

    _, articles = squad
    for few in (articles[:1], []):
        with pytest.raises(UserError) as err:
            split_articles(few, 38)
        assert "below" not in str(err.value)
        assert f"(the file has {len(few)})" in str(err.value)
        assert "too few to split into training and evaluation articles" in str(err.value)
        assert "give the task a separate `dev` file" in str(err.value)


def test_an_unanswerable_squad2_question_is_refused_with_a_fix(tmp_path):
    """A SQuAD 2.0 file (questions with `is_impossible: true` and no answers) was refused with
    'question 'q2' (article 0) has no answers.' and no fix: the task reads SQuAD v1.1, every question
    answered in its context; the message now says so and what to do."""
    import json

    from common.errors import UserError

    spec = get_task("squad")
    path = tmp_path / "squad2.json"
    answered = {"id": "q1", "question": "which?", "answers": [{"text": "gamma", "answer_start": 11}]}
    unanswerable = {"id": "q2", "question": "why?", "answers": [], "is_impossible": True}
    paragraph = {"context": "alpha beta gamma", "qas": [answered, unanswerable]}
    path.write_text(json.dumps({"version": "v2.0", "data": [{"paragraphs": [paragraph]}]}))
    with pytest.raises(UserError) as err:
        read_squad(path, spec)
    assert "question 'q2' (article 0) has no answers: it is unanswerable (SQuAD 2.0" in str(err.value)
    assert "Fix: remove the unanswerable questions" in str(err.value)
