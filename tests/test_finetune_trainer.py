"""The fine-tuning loop and evaluation on a tiny model: the schedule, clipping, weight decay and
seed it is documented to use, fractional epochs, evaluation without dropout and with each
feature's segment ids, label dtypes, and what `build_model` takes from the unit's settings."""

from __future__ import annotations

import copy

import pytest
import torch

from common.errors import UserError
from finetuning.batching import collate, train_batches
from finetuning.trainer import LOG_EVERY, predict, train
from model.config import BertConfig
from model.heads import BertForSequenceClassification
from training.optim import warmup_linear_decay

CPU = torch.device("cpu")


def _features(n: int, seed: int = 0) -> list[dict]:
    """Sentence pairs of 6 + 5 tokens (segment ids 0 then 1) with a binary label."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 64, (n, 11), generator=g).tolist()
    return [{"input_ids": row, "token_type_ids": [0] * 6 + [1] * 5, "label": int(row[0] % 2)} for row in ids]


def _model(dropout: float = 0.0) -> BertForSequenceClassification:
    cfg = BertConfig.from_preset(
        "tiny", vocab_size=64, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout
    )
    torch.manual_seed(0)
    return BertForSequenceClassification(cfg, 2)


def _train(model, features, **overrides) -> tuple[object, dict[int, dict]]:
    logged: dict[int, dict] = {}
    settings = dict(lr=1e-3, epochs=1.0, batch_size=4, weight_decay=0.01, warmup_proportion=0.25, seed=1)
    settings.update(overrides)
    stats = train(model, features, device=CPU, log=lambda row, step: logged.setdefault(step, row), **settings)
    return stats, logged


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _differ(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a)


def test_the_lr_warms_up_then_decays_linearly_to_zero():
    features = _features(80)  # 20 steps of 4: 5 of warmup (25 %)
    stats, logged = _train(_model(), features)
    assert stats.steps == 20 and sorted(logged) == [1, LOG_EVERY, 20]
    factor = warmup_linear_decay(5, 20)
    for step, row in logged.items():  # the rate of the next update
        assert row["train/lr"] == pytest.approx(1e-3 * factor(step)), step
    assert logged[20]["train/lr"] == 0.0


def test_a_fraction_of_an_epoch_rounds_its_steps_up():
    stats, _ = _train(_model(), _features(20), epochs=0.5)  # 5 batches: half is 2.5
    assert stats.steps == 3 and stats.examples == 12


def test_gradients_are_clipped_at_norm_1(monkeypatch):
    seen: list[float] = []
    clip = torch.nn.utils.clip_grad_norm_

    def spy(parameters, max_norm, *args, **kwargs):
        seen.append(max_norm)
        return clip(parameters, max_norm, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    _train(_model(), _features(8))
    assert seen == [1.0, 1.0]


def test_the_seed_orders_the_batches_and_weight_decay_is_applied():
    """Without dropout only the batch order depends on the unit's seed: two seeds train other
    weights, the same seed the same ones; weight decay changes the weights as well."""
    features = _features(16)
    start = _model()
    runs = {}
    for name, overrides in {
        "seed 1": {},
        "again": {},
        "seed 2": {"seed": 2},
        "no decay": {"weight_decay": 0.0},
    }.items():
        model = copy.deepcopy(start)
        _train(model, features, **overrides)
        runs[name] = _weights(model)
    assert not _differ(runs["seed 1"], runs["again"])
    assert _differ(runs["seed 1"], runs["seed 2"])
    assert _differ(runs["seed 1"], runs["no decay"])


def test_predict_runs_without_dropout_and_with_each_features_segment_ids():
    model = _model(dropout=0.5).train()  # left in training mode, as after `train`
    features = _features(6)
    logits = lambda outputs, batch: outputs[1].tolist()  # noqa: E731
    first = predict(model, features, logits, CPU)
    assert predict(model.train(), features, logits, CPU) == first  # no dropout: the same each time
    batch = collate(features)
    with torch.no_grad():
        want = model.eval()(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])[1]
        one_segment = model(
            batch["input_ids"], torch.zeros_like(batch["token_type_ids"]), batch["attention_mask"]
        )[1]
    torch.testing.assert_close(torch.tensor(first), want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(want, one_segment, atol=1e-4)  # the segment ids matter


def test_regression_labels_stay_floats_and_class_labels_integers():
    pair = {"input_ids": [5, 6], "token_type_ids": [0, 1]}
    scores = collate([{**pair, "label": 3.8}, {**pair, "label": 4.0}])["labels"]
    assert scores.dtype == torch.float32 and scores.tolist() == pytest.approx([3.8, 4.0])
    classes = collate([{**pair, "label": 1}, {**pair, "label": 0}])["labels"]
    assert classes.dtype == torch.long and classes.tolist() == [1, 0]


def test_length_grouped_batches_are_shuffled_not_run_longest_first():
    lengths = [int(x) for x in torch.randint(5, 100, (3200,), generator=torch.Generator().manual_seed(0))]
    batches = train_batches(lengths, 32, torch.Generator().manual_seed(0))  # 2 mega-batches of 50
    longest = [max(lengths[i] for i in b) for b in batches]
    assert longest[:50] != sorted(longest[:50], reverse=True)


class _Task:
    notes: dict = {}

    def make_model(self, config: BertConfig) -> BertForSequenceClassification:
        return BertForSequenceClassification(config, 2)


def test_build_model_sets_both_dropouts_and_refuses_a_larger_tokenizer(minilm_dir):
    from finetuning.units import build_model

    model = build_model(_Task(), "random:tiny", 64, dropout=0.3, seed=1)
    assert model.config.hidden_dropout_prob == 0.3 and model.config.attention_probs_dropout_prob == 0.3
    with pytest.raises(UserError, match="the tokenizer has 40,000 tokens but the model.s vocab_size is"):
        build_model(_Task(), str(minilm_dir), 40000, dropout=0.1, seed=1)
    # a truncated vocabulary (1,000 of MiniLM's 30,522 tokens) made every word [UNK], unsaid
    with pytest.raises(UserError, match="the tokenizer has 1,000 tokens for the model.s 30,522 embeddings"):
        build_model(_Task(), str(minilm_dir), 1000, dropout=0.1, seed=1)


def test_a_larger_tokenizer_is_refused_with_what_the_command_and_the_flow_can_do(minilm_dir):
    """The fix said "(--tokenizer)", but the flow (`bertflow run`, where a finetune.baselines model
    meets the flow's tokenizer) has no such option: it names the finetune flag and the flow's remedy."""
    from finetuning.units import build_model

    with pytest.raises(UserError) as exc:
        build_model(_Task(), str(minilm_dir), 40000, dropout=0.1, seed=1)
    said = str(exc.value)
    assert (
        f"Fix: read it with the tokenizer it was trained with: `bertflow finetune --checkpoint {minilm_dir} --tokenizer DIR`"
        in said
    )
    assert (
        f"for a finetune.baselines model of a config (no --tokenizer there), put that tokenizer's vocab.txt into {minilm_dir}"
        in said
    )
