"""SQuAD v1.1 span extraction: start/end logits over T_i, doc-stride windows, n-best decoding.

A task whose `dev` file is another file trains on `train` and evaluates on `dev`. The built-in
task has only `dev-v1.1.json` offline (its `train` and `dev` are that one file), so it is split by
article: the first `squad_train_articles` articles (default 38) train, the remaining ones (10)
evaluate. The split is deterministic and recorded in every result.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from common.errors import UserError
from common.textfile import read_user_text
from finetuning.metrics import normalize_answer, squad_metrics
from finetuning.tasks import TaskSpec, check_file, redefined_builtin_note
from model.config import BertConfig
from model.heads import BertForQuestionAnswering

DOC_STRIDE = 128
MAX_QUERY_LENGTH = 64
MAX_ANSWER_LENGTH = 30
N_BEST = 20


@dataclass(frozen=True)
class QAExample:
    qid: str
    question: str
    context: str
    answers: tuple[str, ...]
    answer_start: int  # character offset of the first answer


def read_squad(path: Path, spec: TaskSpec) -> list[list[QAExample]]:
    """Examples grouped by article, in file order."""
    check_file(path, spec)
    try:
        data = json.loads(read_user_text(path, "SQuAD file"))["data"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not a SQuAD v1.1 JSON file: {exc}", fix="use dev-v1.1.json.") from None
    if not isinstance(data, list):
        raise UserError(f"{path}: 'data' is not a list of articles.", fix="use the SQuAD v1.1 layout.")
    articles = []
    for a_i, article in enumerate(data):
        try:
            articles.append(
                [
                    _example(path, a_i, p["context"], qa)
                    for p in article.get("paragraphs", [])
                    for qa in p["qas"]
                ]
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise UserError(
                f"{path}: article {a_i} is not in the SQuAD v1.1 layout ({type(exc).__name__}: {exc}).",
                fix="each article needs paragraphs of {context, qas: [{id, question, answers: [{text, answer_start}]}]}.",
            ) from None
    _check_unique_ids(path, articles)
    return articles


def _check_unique_ids(path: Path, articles: list[list[QAExample]]) -> None:
    """Answers and predictions are keyed by question id: a repeated id dropped a question from the
    score while the scorecard counted it."""
    seen: dict[str, int] = {}
    for a_i, article in enumerate(articles):
        for ex in article:
            if ex.qid in seen:
                where = f"article {a_i}" if seen[ex.qid] == a_i else f"articles {seen[ex.qid]} and {a_i}"
                raise UserError(
                    f"{path}: question id {ex.qid!r} is used twice ({where}); "
                    "answers and predictions are matched by id, so one of the two would not be scored.",
                    fix="give every question its own id.",
                )
            seen[ex.qid] = a_i


def _example(path: Path, article: int, context: str, qa: dict[str, Any]) -> QAExample:
    """One question; its first answer must be where `answer_start` says (it is the training span)."""
    if not qa.get("answers"):
        squad2 = (
            ": it is unanswerable (SQuAD 2.0 `is_impossible`), and the task reads SQuAD v1.1, every "
            "question answered by a span of its context"
            if qa.get("is_impossible")
            else ""
        )
        raise UserError(
            f"{path}: question {qa.get('id')!r} (article {article}) has no answers{squad2}.",
            fix="remove the unanswerable questions (or give each question its answers: text and "
            "answer_start, a character offset into the context).",
        )
    first = qa["answers"][0]
    start = first["answer_start"]
    if not isinstance(start, int) or context[start : start + len(first["text"])] != first["text"]:
        raise UserError(
            f"{path}: question {qa['id']!r} (article {article}): answer {first['text']!r} is not at "
            f"answer_start {start!r} of its context.",
            fix="fix that answer's answer_start (a character offset into the context) or its text.",
        )
    return QAExample(
        qa["id"], qa["question"].strip(), context, tuple(a["text"] for a in qa["answers"]), start
    )


def split_articles(
    articles: list[list[QAExample]], n_train: int, path: Path | None = None
) -> tuple[list[QAExample], list[QAExample]]:
    if len(articles) < 2:  # squad_train_articles is at least 1: no value leaves an article to evaluate
        raise UserError(
            f"{path or 'the SQuAD file'}: squad_train_articles={n_train} leaves no article for evaluation "
            f"(the file has {len(articles)}); one article or none is too few to split into training and "
            "evaluation articles.",
            fix="give the task a separate `dev` file (a SQuAD file with the questions to evaluate on).",
        )
    if n_train >= len(articles):
        raise UserError(
            f"{path or 'the SQuAD file'}: squad_train_articles={n_train} leaves no article for "
            f"evaluation (the file has {len(articles)}).",
            fix=f"set squad_train_articles below {len(articles)} in the task definition, or give the "
            "task a separate `dev` file.",
        )
    return [e for a in articles[:n_train] for e in a], [e for a in articles[n_train:] for e in a]


def read_squad_split(
    spec: TaskSpec, data_root: str | None, max_train: int | None, max_eval: int | None
) -> tuple[list[QAExample], list[QAExample]]:
    """The questions a unit trains and evaluates on (each part capped): `train` and `dev`, or the
    train file split by article where `dev` is that same file. A UserError when a part is empty."""
    path, dev_path = spec.path("train", data_root), spec.path("dev", data_root)
    split = spec.splits_train_file()
    if split:
        train, dev = split_articles(read_squad(path, spec), spec.squad_train_articles, path)
    else:
        train = [e for a in read_squad(path, spec) for e in a]
        dev = [e for a in read_squad(dev_path, spec) for e in a]
    train, dev = train[:max_train], dev[:max_eval]
    if not train or not dev:
        if split:
            raise UserError(
                f"{path}: the first {spec.squad_train_articles} articles hold {len(train)} questions to "
                f"train on and the rest {len(dev)} to evaluate; both are needed.",
                fix="change squad_train_articles in the task definition, or use a file with questions in both parts.",
            )
        raise UserError(
            f"task {spec.name!r}: {path} holds {len(train)} questions to train on and {dev_path} "
            f"{len(dev)} to evaluate; both are needed.",
            fix="point the task's `train` and `dev` at SQuAD files with questions.",
        )
    return train, dev


def _truncate_question(tok: Tokenizer, question: str, max_tokens: int) -> str:
    enc = tok.encode(question, add_special_tokens=False)
    if len(enc.ids) <= max_tokens:
        return question
    return question[: enc.offsets[max_tokens - 1][1]]


def encode_windows(
    tok: Tokenizer,
    examples: list[QAExample],
    max_seq_length: int,
    doc_stride: int = DOC_STRIDE,
    train: bool = True,
) -> list[dict[str, Any]]:
    """One feature per (question, context window). Train features carry `start`/`end` token
    positions (0 = [CLS] when the answer is not inside the window); eval features carry the
    context offsets needed to map a span back to text."""
    tok.no_padding()
    stride = min(doc_stride, max(1, max_seq_length // 4))
    # the question leaves the context more tokens than the stride ([CLS] Q [SEP] C [SEP]); with
    # fewer, the tokenizer's windowing panics
    max_query = min(MAX_QUERY_LENGTH, max_seq_length - 3 - stride - 1)
    if max_query < 8:
        raise UserError(
            f"max_seq_length {max_seq_length} is too short for SQuAD: a question and a window of its "
            "context do not fit.",
            fix="use max_seq_length 64 or more for squad (BERT uses 384).",
        )
    tok.no_truncation()  # the question alone, untruncated, to cut it at a token boundary
    pairs = [(_truncate_question(tok, e.question, max_query), e.context) for e in examples]
    tok.enable_truncation(max_seq_length, stride=stride, strategy="only_second")
    features = []
    for ex_index, (enc, ex) in enumerate(zip(tok.encode_batch(pairs), examples, strict=True)):
        for window in [enc, *enc.overflowing]:
            seq_ids = window.sequence_ids
            ctx = [i for i, s in enumerate(seq_ids) if s == 1]
            if not ctx:
                continue
            f: dict[str, Any] = {
                "input_ids": window.ids,
                "token_type_ids": window.type_ids,
                "example": ex_index,
            }
            if train:
                start_char = ex.answer_start
                end_char = start_char + len(ex.answers[0])
                offsets = window.offsets
                if offsets[ctx[0]][0] <= start_char and offsets[ctx[-1]][1] >= end_char:
                    s = next(i for i in ctx if offsets[i][1] > start_char)
                    e = next(i for i in reversed(ctx) if offsets[i][0] < end_char)
                    f["start"], f["end"] = s, e
                else:
                    f["start"], f["end"] = 0, 0
            else:
                f["context_offsets"] = {i: window.offsets[i] for i in ctx}
            features.append(f)
    return features


def best_span(
    start_logits: np.ndarray, end_logits: np.ndarray, offsets: dict[int, tuple[int, int]]
) -> tuple[float, tuple[int, int] | None]:
    """The highest-scoring valid span among the n-best starts and ends of one window:
    both inside the context, end >= start, at most MAX_ANSWER_LENGTH tokens."""
    best: tuple[float, tuple[int, int] | None] = (-np.inf, None)
    starts = np.argsort(start_logits)[::-1][:N_BEST]
    ends = np.argsort(end_logits)[::-1][:N_BEST]
    for s in starts:
        if s not in offsets:
            continue
        for e in ends:
            if e not in offsets or e < s or e - s + 1 > MAX_ANSWER_LENGTH:
                continue
            score = float(start_logits[s] + end_logits[e])
            if score > best[0]:
                best = (score, (offsets[s][0], offsets[e][1]))
    return best


class SquadTask:
    def __init__(
        self,
        spec: TaskSpec,
        tok: Tokenizer,
        max_seq_length: int,
        max_train: int | None,
        max_eval: int | None,
        data_root: str | None,
    ) -> None:
        self.spec = spec
        train, dev = read_squad_split(spec, data_root, max_train, max_eval)
        self.dev = dev
        self.train_features = encode_windows(tok, train, max_seq_length, train=True)
        self.eval_features = encode_windows(tok, dev, max_seq_length, train=False)
        self.n_train, self.n_eval = len(train), len(dev)
        used = f"{len(train)} train / {len(dev)} eval questions used"
        self.notes: dict[str, Any] = {
            **redefined_builtin_note(spec),
            "squad_split": f"{spec.path('train', data_root).name} split by article: first "
            f"{spec.squad_train_articles} articles train, the rest evaluate ({used})"
            if spec.splits_train_file()
            else f"train on {spec.path('train', data_root).name}, evaluate on {spec.path('dev', data_root).name} ({used})",
            "train_windows": len(self.train_features),
            "eval_windows": len(self.eval_features),
        }

    def make_model(self, config: BertConfig) -> torch.nn.Module:
        return BertForQuestionAnswering(config)

    def eval_outputs(self, outputs: tuple, batch: dict[str, torch.Tensor]) -> list[Any]:
        start, end = outputs[1].float(), outputs[2].float()
        lengths = batch["attention_mask"].sum(-1).tolist()
        return [(start[i, :n].numpy(), end[i, :n].numpy()) for i, n in enumerate(lengths)]

    def predictions(self, per_feature: list[Any]) -> dict[str, str]:
        best: dict[int, tuple[float, tuple[int, int] | None]] = {}
        for feat, (start, end) in zip(self.eval_features, per_feature, strict=True):
            cand = best_span(start, end, feat["context_offsets"])
            if cand[1] is not None and cand[0] > best.get(feat["example"], (-np.inf, None))[0]:
                best[feat["example"]] = cand
        out = {}
        for i, ex in enumerate(self.dev):
            span = best.get(i, (0.0, None))[1]
            out[ex.qid] = ex.context[span[0] : span[1]] if span else ""
        return out

    def metrics(self, per_feature: list[Any]) -> dict[str, float]:
        preds = self.predictions(per_feature)
        return squad_metrics(preds, {ex.qid: list(ex.answers) for ex in self.dev})

    def chance_metrics(self) -> dict[str, float]:
        """What no learning scores on these evaluation questions: `overlap_sentence_answers`
        (an uninformed span guess scores ~0, far below it: F1 ~21 on the built-in split)."""
        scores = squad_metrics(
            overlap_sentence_answers(self.dev), {ex.qid: list(ex.answers) for ex in self.dev}
        )
        return {m: scores[m] for m in self.spec.metrics}

    def chance_prediction(self) -> None:
        """No constant answer: `chance_metrics` is the overlap sentence of each question."""
        return None


def overlap_sentence_answers(examples: list[QAExample]) -> dict[str, str]:
    """A no-learning baseline, after the SQuAD paper's sliding window: each question answered with
    the sentence of its context that shares the most (normalized) words with it, the first of a tie."""
    answers = {}
    sentences: dict[str, list[tuple[str, set[str]]]] = {}  # per context: its questions share it
    for ex in examples:
        if ex.context not in sentences:
            split = re.split(r"(?<=[.!?])\s+", ex.context)
            sentences[ex.context] = [(s, set(normalize_answer(s).split())) for s in split]
        words = set(normalize_answer(ex.question).split())
        answers[ex.qid] = max(sentences[ex.context], key=lambda s: len(words & s[1]))[0]
    return answers
