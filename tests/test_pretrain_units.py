"""Pieces of the pretrain stage without processes: optimizer recipe, LAMB, schedule, FLOPs,
DeepSpeed JSON checks, checkpoint verification."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from common.errors import UserError
from model.config import BertConfig
from model.heads import BertForPreTraining
from training import checkpoint
from training.config import PretrainConfig
from training.ds_config import build_ds_config
from training.flops import device_peak_tflops, step_flops
from training.optim import Lamb, adamw, build_optimizer, build_scheduler, param_groups, warmup_linear_decay


def tiny_model() -> BertForPreTraining:
    torch.manual_seed(0)
    return BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=500))


def test_weight_decay_skips_biases_and_layernorm():
    model = tiny_model()
    decay, no_decay = param_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert all(
        not n.endswith("bias") and "LayerNorm" not in n for n in (names[id(p)] for p in decay["params"])
    )
    assert all(n.endswith("bias") or "LayerNorm" in n for n in (names[id(p)] for p in no_decay["params"]))
    n_params = len({id(p) for p in model.parameters()})  # tied decoder counted once
    assert len(decay["params"]) + len(no_decay["params"]) == n_params


def test_bert_recipe_adamw_on_cpu():
    model = tiny_model()
    opt = build_optimizer(model, "adamw", 1e-4, 0.01, on_gpu=False)
    assert isinstance(opt, torch.optim.AdamW)
    assert (
        opt.defaults["betas"] == (0.9, 0.999) and opt.defaults["lr"] == 1e-4 and opt.defaults["eps"] == 1e-6
    )
    # weight decay 0.01 on the weights, none on biases and LayerNorm parameters; each parameter once
    names = {id(p): n for n, p in model.named_parameters()}
    decayed, plain = ({names[id(p)] for p in g["params"]} for g in opt.param_groups)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]
    assert "bert.embeddings.word_embeddings.weight" in decayed and "bert.pooler.dense.bias" in plain
    assert not any(n.endswith("bias") or "LayerNorm" in n for n in decayed)
    assert all(n.endswith("bias") or "LayerNorm" in n for n in plain) and len(decayed | plain) == len(names)


def test_muon_takes_the_encoder_matrices_and_adamw_the_rest():
    model = tiny_model()
    opt = build_optimizer(model, "muon", 2e-3, 0.01, on_gpu=False, muon_lr=0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    *adam_groups, muon_group = opt.param_groups
    assert muon_group["use_muon"] and muon_group["lr"] == 0.01 and muon_group["weight_decay"] == 0.0
    # the six matrices of each of the two layers; embeddings (tied decoder), pooler and heads are AdamW's
    assert sorted(names[id(p)] for p in muon_group["params"]) == sorted(
        f"bert.encoder.layer.{i}.{m}.weight"
        for i in range(2)
        for m in ("attention.self.query", "attention.self.key", "attention.self.value",
                  "attention.output.dense", "intermediate.dense", "output.dense")
    )  # fmt: skip
    assert not any(g["use_muon"] for g in adam_groups) and {g["lr"] for g in adam_groups} == {2e-3}
    decayed = {names[id(p)] for g in adam_groups if g["weight_decay"] == 0.01 for p in g["params"]}
    assert "bert.embeddings.word_embeddings.weight" in decayed and "cls.seq_relationship.weight" in decayed
    assert not any(n.endswith("bias") or "LayerNorm" in n for n in decayed)
    n_params = len({id(p) for p in model.parameters()})
    assert sum(len(g["params"]) for g in opt.param_groups) == n_params
    with pytest.raises(ValueError, match="muon_lr"):
        build_optimizer(model, "muon", 2e-3, 0.01, on_gpu=False)


def test_a_muon_step_moves_each_matrix_by_an_orthogonalized_update():
    """The first update of a matrix is lr times the Newton-Schulz orthogonalization of its
    gradient (times sqrt(rows / cols) for a tall one): its singular values gather near 1 (the quintic
    iteration puts them in about 0.6-1.2, all but the few smallest of the gradient's), where the
    gradient's own spread over a decade. AdamW's parameters take AdamW's first step. (Eager, as on
    the CPU path.)"""
    model = tiny_model()
    opt = build_optimizer(model, "muon", 2e-3, 0.01, on_gpu=False, muon_lr=0.01)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.manual_seed(3)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * torch.rand(p.shape[-1])  # columns on different scales
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    with torch.compiler.set_stance("force_eager"):
        opt.step()
    after = dict(model.named_parameters())

    def middle_spread(matrix: torch.Tensor) -> float:  # 90th over 10th percentile singular value
        singular = torch.linalg.svdvals(matrix)
        return float(singular.quantile(0.9) / singular.quantile(0.1))

    for name, scale in (("bert.encoder.layer.0.attention.self.query.weight", 1.0),
                        ("bert.encoder.layer.1.intermediate.dense.weight", 2.0)):  # fmt: skip
        update = (before[name] - after[name].detach()) / (0.01 * scale)
        singular = torch.linalg.svdvals(update)
        assert 0.55 < singular.quantile(0.1) and singular.max() < 1.3, (name, singular)
        assert middle_spread(update) < 1.8
        assert middle_spread(grads[name]) > 5
    bias = "bert.encoder.layer.0.attention.self.query.bias"
    step = before[bias] - after[bias].detach()
    g = grads[bias]  # Adam's first step: lr m / (sqrt(v) + eps) with m = g, v = g^2
    assert torch.allclose(step, 2e-3 * g / (g.abs() + 1e-6), atol=1e-8)


def test_lamb_step_matches_deepspeeds_fused_lamb_formula():
    # DeepSpeed's FusedLamb kernel (ops/csrc/lamb/fused_lamb_cuda_kernel.cu): the trust ratio on the
    # uncorrected moments, clamped to [0.01, 10]; the bias correction as a factor on the step.
    torch.manual_seed(1)
    w = torch.nn.Parameter(torch.randn(4, 3))
    tiny = torch.nn.Parameter(torch.full((5,), 1e-4))  # ||w|| / ||u|| far under 0.01: clamped
    w0, tiny0 = w.detach().clone(), tiny.detach().clone()
    g, g_tiny = torch.randn(4, 3), torch.randn(5)
    w.grad, tiny.grad = g.clone(), g_tiny.clone()
    Lamb([w, tiny], lr=0.1, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01).step()
    step_size = 0.1 * math.sqrt(1 - 0.999) / (1 - 0.9)

    def direction(p0: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        m, v = 0.1 * grad, 0.001 * grad * grad
        return m / (v.sqrt() + 1e-6) + 0.01 * p0

    def expected(p0: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        u = direction(p0, grad)
        return p0 - step_size * (p0.norm() / u.norm()).clamp(0.01, 10.0) * u

    assert torch.allclose(w.detach(), expected(w0, g), atol=1e-6)
    assert torch.allclose(tiny.detach(), expected(tiny0, g_tiny), atol=1e-7)
    assert tiny0.norm() / direction(tiny0, g_tiny).norm() < 0.01  # the clamp was what this case tested
    # a parameter at zero (a fresh bias): ||w|| = 0, so the ratio is 1, not the clamp's 0.01
    zero = torch.nn.Parameter(torch.zeros(3))
    zero.grad = torch.tensor([1.0, -2.0, 0.5])
    Lamb([zero], lr=0.1, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01).step()
    assert torch.allclose(zero.detach(), -step_size * direction(torch.zeros(3), zero.grad), atol=1e-7)


def test_lamb_trains_a_model():
    model = tiny_model()
    opt = build_optimizer(model, "lamb", 5e-3, 0.01, on_gpu=False)
    assert isinstance(opt, Lamb)
    ids = torch.randint(5, 500, (4, 16))
    labels = ids[:, :4].clone()
    pos = torch.arange(4).expand(4, 4)
    nsp = torch.zeros(4, dtype=torch.long)
    first = None
    for _ in range(40):  # FusedLamb's bias correction slows the first steps (its docstring)
        loss = model(ids, masked_lm_positions=pos, masked_lm_labels=labels, next_sentence_labels=nsp).loss
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first - 1.0


def test_warmup_then_linear_decay():
    """One schedule for pretraining and fine-tuning: the first update already has a non-zero rate."""
    f = warmup_linear_decay(4, 20)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(12) == pytest.approx(0.5) and f(20) == 0.0 and f(25) == 0.0
    opt = adamw(torch.nn.Linear(2, 2), lr=1.0, weight_decay=0.01)
    sched = build_scheduler(opt, warmup_steps=10, max_steps=100)
    lrs = []
    for _ in range(100):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[55] == pytest.approx(0.5) and lrs[99] == pytest.approx(1 / 90)


def test_step_flops_matches_torch_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    cfg = BertConfig.from_preset("tiny", vocab_size=1000)
    model = BertForPreTraining(cfg)
    b, s, p = 4, 64, 10
    ids = torch.randint(5, 1000, (b, s))
    pos = torch.randint(0, s, (b, p))
    with FlopCounterMode(display=False) as counter:
        out = model(ids, masked_lm_positions=pos, masked_lm_labels=ids.gather(1, pos),
                    next_sentence_labels=torch.zeros(b, dtype=torch.long))  # fmt: skip
        out.loss.backward()
    measured = counter.get_total_flops()
    assert step_flops(cfg, b, s, b * p) == pytest.approx(measured, rel=1e-3)  # the formula is exact here

    # a padded batch runs unpadded: the count follows the real tokens, not B·S
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    mask[3, 9:] = 0
    pos = pos % 9
    with FlopCounterMode(display=False) as counter:
        out = model(ids, None, mask, pos, ids.gather(1, pos), torch.zeros(b, dtype=torch.long))
        out.loss.backward()
    tokens = int(mask.sum())
    assert step_flops(cfg, b, s, b * p, tokens) == pytest.approx(counter.get_total_flops(), rel=1e-3)
    assert step_flops(cfg, b, s, b * p, tokens) < 0.8 * step_flops(cfg, b, s, b * p)


def test_peak_table_and_override():
    assert device_peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.0
    assert device_peak_tflops("NVIDIA H200", "bf16") == 989.0
    assert device_peak_tflops("Some GPU", "bf16") is None
    assert device_peak_tflops("NVIDIA H100", "bf16", override=700.0) == 700.0
    # the precision picks the column: fp32 (TF32) is half the bf16/fp16 peak; a V100 has no bf16
    assert device_peak_tflops("NVIDIA A100-SXM4-80GB", "fp32") == 156.0
    assert device_peak_tflops("NVIDIA A100-SXM4-80GB", "fp16") == 312.0
    assert device_peak_tflops("Tesla V100-SXM2-16GB", "fp16") == 125.0
    assert device_peak_tflops("Tesla V100-SXM2-16GB", "bf16") is None
    # a table name is a whole model name: an L40S is not an L4, an A10G not an A10
    assert device_peak_tflops("NVIDIA L4", "bf16") == 121.0
    assert device_peak_tflops("NVIDIA L40S", "bf16") is None
    assert device_peak_tflops("NVIDIA A10", "bf16") == 125.0
    assert device_peak_tflops("NVIDIA A10G", "bf16") is None
    assert device_peak_tflops("NVIDIA GH200 480GB", "bf16") == 989.0  # an entry of its own
    assert device_peak_tflops("Tesla V100S-PCIE-32GB", "fp16") == 130.0


def _pcfg(**kw) -> PretrainConfig:
    return PretrainConfig(**{"micro_batch_size": 8, "gradient_accumulation_steps": 2, **kw})


def test_ds_config_fills_batch_precision_and_stage():
    ds = build_ds_config(_pcfg(zero_stage=3), world_size=2, on_gpu=False, bf16_ok=False)
    assert ds["train_batch_size"] == 32 and ds["train_micro_batch_size_per_gpu"] == 8
    assert ds["zero_optimization"]["stage"] == 3
    assert not ds["fp16"]["enabled"] and not ds["bf16"]["enabled"]  # auto on CPU = fp32
    gpu = build_ds_config(_pcfg(), world_size=8, on_gpu=True, bf16_ok=True)
    assert gpu["bf16"]["enabled"]  # auto on a bf16 GPU
    old_gpu = build_ds_config(_pcfg(), world_size=8, on_gpu=True, bf16_ok=False)
    assert not old_gpu["bf16"]["enabled"] and not old_gpu["fp16"]["enabled"]  # auto without bf16: fp32
    # the run's clipping, whatever the template holds (DeepSpeed clips by the JSON's value)
    assert ds["gradient_clipping"] == 1.0
    assert (
        build_ds_config(_pcfg(gradient_clipping=0.5), 2, on_gpu=False, bf16_ok=False)["gradient_clipping"]
        == 0.5
    )
    fp16 = build_ds_config(_pcfg(precision="fp16"), world_size=1, on_gpu=True, bf16_ok=True)
    assert fp16["fp16"]["enabled"] and fp16["fp16"]["loss_scale"] == 0  # dynamic loss scaling


def test_ds_config_one_process_skips_zero_unless_asked_or_offloading(tmp_path):
    """One rank has nothing to partition: the template's ZeRO stage drops to 0, unless the stage
    was set explicitly or the template offloads (ZeRO-Offload on one GPU is a real use)."""

    def stage(world: int, **kw) -> int:
        return build_ds_config(_pcfg(**kw), world_size=world, on_gpu=False, bf16_ok=False)[
            "zero_optimization"
        ]["stage"]

    assert stage(1) == 0 and stage(2) == 2
    assert stage(1, zero_stage=2) == 2
    path = tmp_path / "offload.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}))
    offload = build_ds_config(_pcfg(deepspeed_config=str(path)), world_size=1, on_gpu=True, bf16_ok=True)
    assert offload["zero_optimization"]["stage"] == 2


def test_ds_config_muon_needs_zero_stage_0():
    """DeepSpeed's ZeRO 1/2 clip Muon's orthogonalized update like a gradient: Muon is refused there,
    naming the setting and the fix, before any process starts."""
    muon = {"optimizer": "muon"}

    def stage(world: int, **kw) -> int:
        return build_ds_config(_pcfg(**muon, **kw), world, on_gpu=False, bf16_ok=False)["zero_optimization"][
            "stage"
        ]

    assert stage(2, zero_stage=0) == 0 and stage(1) == 0  # one process: the template's ZeRO 2 drops to 0
    for kw, origin in (({}, "infra/deepspeed/zero2.json"), ({"zero_stage": 1}, "pretrain.zero_stage")):
        with pytest.raises(UserError, match=f"muon needs ZeRO stage 0; this run's is .*{origin}") as err:
            build_ds_config(_pcfg(**muon, **kw), 2, on_gpu=False, bf16_ok=False)
        assert "Fix: set pretrain.zero_stage: 0" in str(err.value)


@pytest.mark.parametrize(
    "kw,template,match",
    [
        ({"zero_stage": 4}, None, "ZeRO stage 4 does not exist"),
        ({"precision": "fp16"}, None, "fp16 needs a GPU"),
        ({}, {"train_batch_size": 30}, "train_batch_size=30 contradicts"),
        ({}, {"train_micro_batch_size_per_gpu": 4}, "train_micro_batch_size_per_gpu=4 contradicts"),
        ({"precision": "fp32"}, {"bf16": {"enabled": True}}, "enables bf16 but pretrain.precision"),
        ({}, {"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "enables both fp16 and bf16"),
        ({}, {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}, "offloads"),
        # DeepSpeed silently prefers the run's own optimizer and schedule over a template's
        ({}, {"optimizer": {"type": "Adam", "params": {"lr": 3e-4}}}, "'optimizer' section, which the run"),
        ({}, {"scheduler": {"type": "WarmupDecayLR"}}, "'scheduler' section, which the run would ignore"),
        ({}, {"gradient_clipping": 0.5}, "gradient_clipping=0.5 contradicts pretrain.gradient_clipping 1.0"),
    ],
)
def test_ds_config_contradictions_are_user_errors(tmp_path, kw, template, match):
    path = None
    if template is not None:
        path = tmp_path / "ds.json"
        path.write_text(json.dumps(template))
        kw["deepspeed_config"] = str(path)
    with pytest.raises(UserError, match=match):
        build_ds_config(_pcfg(**kw), world_size=2, on_gpu=False, bf16_ok=False)


def test_ds_config_keeps_parameter_offload_only_at_zero_3(tmp_path):
    """Only ZeRO 3 partitions (and can offload) the parameters: a template's offload_param is
    dropped at stages 1 and 2, where DeepSpeed has no use for it, and kept at 3."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}))
    for stage, kept in ((1, False), (2, False), (3, True)):
        ds = build_ds_config(
            _pcfg(deepspeed_config=str(path), zero_stage=stage), world_size=2, on_gpu=False, bf16_ok=False
        )
        assert ("offload_param" in ds["zero_optimization"]) is kept, stage


def test_ds_config_lamb_is_not_offloaded(tmp_path):
    """DeepSpeed takes only its own CPU Adam under ZeRO-Offload: refused here, not in every rank."""
    path = tmp_path / "offload.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}))
    with pytest.raises(UserError, match="only for its own CPU Adam, not pretrain.optimizer lamb"):
        build_ds_config(_pcfg(optimizer="lamb", deepspeed_config=str(path)), 1, on_gpu=True, bf16_ok=True)


def _fake_tag(root, step, payload=None):
    tag = root / checkpoint.tag_for(step)
    tag.mkdir(parents=True)
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"w" * 1000 + bytes([step]))
    (tag / "rng_state_rank0.pt").write_bytes(b"r" * 10)
    checkpoint.write_verification(tag, payload or {"step": step})
    return tag


def test_checkpoint_fallback_prune_and_unverified(tmp_path):
    root = tmp_path / "checkpoints"
    for s in (4, 8, 12):
        _fake_tag(root, s)
    half = root / checkpoint.tag_for(16)  # killed while saving: files but no verification file
    half.mkdir()
    (half / "mp_rank_00_model_states.pt").write_bytes(b"partial")
    victim = root / "global_step12" / "mp_rank_00_model_states.pt"  # truncated newest verified one
    victim.write_bytes(victim.read_bytes()[:500])
    warnings: list[str] = []
    tag, info = checkpoint.newest_good(root, warn=warnings.append)
    assert tag.name == "global_step8" and info["step"] == 8
    assert "global_step16" in warnings[0] and "incomplete" in warnings[0]
    assert "global_step12" in warnings[1] and "500 bytes" in warnings[1]
    # a flipped byte with the same size is caught by the checksum
    flip = root / "global_step8" / "rng_state_rank0.pt"
    flip.write_bytes(b"R" + flip.read_bytes()[1:])
    assert "checksum" in checkpoint.verify(flip.parent)
    assert checkpoint.newest_good(root, warn=warnings.append)[0].name == "global_step4"
    assert [t.name for t in checkpoint.remove_unverified(root)] == ["global_step16"]
    for s in (20, 24):
        _fake_tag(root, s)
    checkpoint.prune(root, keep=2)
    assert [t.name for t in checkpoint.tag_dirs(root)] == ["global_step24", "global_step20"]
    # an unverified tag older than the newest verified one is a dead save: pruned; a newer one may
    # be a save in progress: kept
    for step in (22, 28):
        (root / checkpoint.tag_for(step)).mkdir()
        (root / checkpoint.tag_for(step) / "mp_rank_00_model_states.pt").write_bytes(b"partial")
    assert [t.name for t in checkpoint.prune(root, keep=2)] == ["global_step22"]
    assert [t.name for t in checkpoint.tag_dirs(root)] == ["global_step28", "global_step24", "global_step20"]


def test_a_restart_resumes_from_the_newest_good_tag_and_clears_the_rest(tmp_path):
    """prepare_resume (rank 0, before the ranks load): a damaged newer tag is kept aside as
    *.corrupt, never reused; a save killed before its verification file is removed."""
    root = tmp_path / "checkpoints"
    for s in (4, 8, 12):
        _fake_tag(root, s)
    damaged = root / "global_step12" / "mp_rank_00_model_states.pt"
    damaged.write_bytes(damaged.read_bytes()[:10])
    half = root / checkpoint.tag_for(16)
    half.mkdir()
    (half / "mp_rank_00_model_states.pt").write_bytes(b"partial")
    tag, info = checkpoint.prepare_resume(root, warn=lambda _: None)
    assert tag.name == "global_step8" and info["step"] == 8
    assert sorted(p.name for p in root.iterdir()) == ["global_step12.corrupt", "global_step4", "global_step8"]


def test_step_stats_count_real_tokens_and_score_only_real_mlm_slots():
    """A padded micro batch: tokens are the attention mask's ones (not the padded width), MLM
    accuracy is over the real label slots only (not the NSP examples too)."""
    from training.step_stats import StepStats

    torch.manual_seed(0)
    cfg = BertConfig.from_preset("tiny", vocab_size=50)
    model = BertForPreTraining(cfg).eval()
    batch = {
        "input_ids": torch.randint(5, 50, (2, 8)),
        "token_type_ids": torch.tensor([[0] * 4 + [1] * 4, [0] * 3 + [1] * 2 + [0] * 3]),
        "attention_mask": torch.tensor([[1] * 8, [1] * 5 + [0] * 3]),
        "masked_lm_positions": torch.tensor([[1, 2, 6], [1, 3, 0]]),
        "masked_lm_labels": torch.tensor([[7, 8, 9], [10, 11, -100]]),
        "next_sentence_labels": torch.tensor([0, 1]),
    }
    batch["input_ids"][1, 5:] = 0
    with torch.no_grad():  # the model's own predictions as three of the five labels: 3 correct
        guesses = model(**batch).mlm_predictions
        batch["masked_lm_labels"][0] = guesses[:3]
        out = model(**batch)
    stats = StepStats()
    stats.add(out, batch, out.loss, cfg)
    assert stats.tokens == 13 and stats.quality.mlm_count == 5 and stats.quality.nsp_count == 2
    correct = int((out.mlm_predictions == torch.cat([guesses[:3], torch.tensor([10, 11])])).sum())
    assert correct >= 3 and stats.train_metrics()["mlm_acc"] == correct / 5
    assert stats.flops == step_flops(cfg, 2, 8, 5, 13)


def test_phase_2_starts_from_phase_1_weights(tmp_path, minilm_dir):
    """init_from: the model shape comes from the phase-1 dir, weights are loaded, dropouts from the
    config; a resume ignores init_from (the checkpoint wins)."""
    from model.hf_io import write_hf_dir
    from pipelines.config import load_config
    from training.preflight import model_config
    from training.train import build_model

    phase1 = tiny_model()
    write_hf_dir(phase1, tmp_path / "p1")  # no tokenizer: its 30,522 tokens exceed this model's 500
    cfg = load_config(None, [f"pretrain.init_from={tmp_path / 'p1'}", "model.hidden_dropout_prob=0.0"])
    mcfg = model_config(cfg, [f"t{i}" for i in range(500)], minilm_dir)
    assert mcfg.hidden_size == 128 and mcfg.hidden_dropout_prob == 0.0
    with pytest.raises(UserError, match="vocab_size 500"):
        model_config(cfg, [f"t{i}" for i in range(30522)], minilm_dir)
    pretrain = cfg.pretrain.model_copy(update={"seed": 3})
    model = build_model(mcfg, pretrain, resuming=False)
    ref = phase1.state_dict()
    assert all(torch.equal(v, ref[k]) for k, v in model.state_dict().items())
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    fresh = build_model(mcfg, pretrain, resuming=True)
    assert not torch.equal(
        fresh.bert.embeddings.word_embeddings.weight, ref["bert.embeddings.word_embeddings.weight"]
    )
    # phase 1 trained 48 positions (512 = 10 x 48 + 32): every later one starts as their copy
    longer = build_model(mcfg, pretrain, resuming=False, init_trained_length=48)
    positions = "bert.embeddings.position_embeddings.weight"
    n = ref[positions].shape[0]
    assert torch.equal(longer.state_dict()[positions], ref[positions][torch.arange(n) % 48])
    assert not torch.equal(ref[positions][48:96], ref[positions][:48])
    assert all(torch.equal(v, ref[k]) for k, v in longer.state_dict().items() if k != positions)


def test_multi_node_launch_command_and_refused_node_settings(tmp_path):
    """One torchrun per node with a static rendezvous at node 0; settings that cannot meet are
    refused before anything starts, naming the fix."""
    from pipelines.stage_pretrain import check_nodes
    from tests.pretrain_runs import config
    from training.launch import build_command
    from training.train import node_cache_dir

    cmd = build_command(
        "auto", 1, tmp_path / "spec.json", 29500, nnodes=2, node_rank=1, master_addr="10.0.0.1"
    )
    assert cmd[1:4] == ["-m", "torch.distributed.run", "--nproc_per_node=1"]
    assert {"--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1", "--master_port=29500"} <= set(cmd)
    assert "--nnodes=2" not in build_command("auto", 2, tmp_path / "spec.json", 29500)
    two = ["pretrain.nnodes=2", "pretrain.master_addr=127.0.0.1", "pretrain.master_port=29500"]
    check_nodes(config(*two), 1)
    with pytest.raises(UserError, match="DeepSpeed's launcher takes a hostfile"):
        check_nodes(config(*two, "pretrain.launcher=deepspeed"), 0)
    with pytest.raises(UserError, match="pretrain.hostfile needs launcher 'deepspeed'"):
        check_nodes(config("pretrain.hostfile=hosts", "pretrain.launcher=torchrun"), 0)
    with pytest.raises(UserError, match="--node-rank 2 is outside 0..1"):
        check_nodes(config(*two), 2)
    with pytest.raises(UserError, match="needs pretrain.master_addr and pretrain.master_port"):
        check_nodes(config("pretrain.nnodes=2"), 0)
    # each node's cache folder is named by host and first rank; $VARS are this node's
    assert node_cache_dir(None, tmp_path, 4).parent == tmp_path / "data_cache"
    assert node_cache_dir(None, tmp_path, 4).name.endswith("-rank4")
    os.environ["BERTFLOW_TEST_SCRATCH"] = str(tmp_path / "scratch")
    try:
        assert node_cache_dir("$BERTFLOW_TEST_SCRATCH/c", tmp_path, 0).parent == tmp_path / "scratch" / "c"
        # two runs sharing a data_cache_dir never share a cache (one would rebuild or delete the other's)
        shared = [node_cache_dir("$BERTFLOW_TEST_SCRATCH/c", tmp_path / run, 0) for run in ("a", "b", "a")]
        assert shared[0] != shared[1] and shared[0] == shared[2]
    finally:
        del os.environ["BERTFLOW_TEST_SCRATCH"]
    with pytest.raises(UserError, match="not set on"):
        node_cache_dir("$BERTFLOW_UNSET_VARIABLE/c", tmp_path, 0)


def _store_with_targets(mlm_ids: list[int]):
    import numpy as np

    from training.data import ExampleStore

    n = len(mlm_ids)
    return ExampleStore(
        input_ids=np.zeros(4, np.int32),
        segment_ids=np.zeros(4, np.int8),
        offsets=np.array([0, 4]),
        mlm_positions=np.arange(n, dtype=np.int32),
        mlm_ids=np.array(mlm_ids, np.int32),
        mlm_offsets=np.array([0, n]),
        nsp_labels=np.zeros(1, np.int8),
    )


def test_new_model_starts_at_the_unigram_prediction_and_pretrain_dropout_stays_out_of_the_config():
    """pretrain.mlm_bias_init=unigram: softmax(bias) is the add-one smoothed frequency of the
    training targets, so a context-free model is optimal from step 0; pretrain.dropout changes the
    modules that train, not the config that checkpoints and exports record."""
    from training.train import build_model

    mcfg = BertConfig.from_preset("tiny", vocab_size=500)
    store = _store_with_targets([7] * 30 + [9] * 10)
    p = PretrainConfig(dropout=0.0)
    model = build_model(mcfg, p, resuming=False, store=store)
    probs = torch.softmax(model.cls.predictions.bias.double(), 0)
    expected = torch.ones(500, dtype=torch.float64)
    expected[7], expected[9] = 31.0, 11.0
    assert torch.allclose(probs, expected / expected.sum(), atol=1e-6)
    assert (
        abs(model.cls.predictions.bias.double().mean().item()) < 1e-6
    )  # centred: the log prior minus its mean
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert model.bert.encoder.layer[0].attention.self.dropout_p == 0.0
    assert mcfg.hidden_dropout_prob == 0.1  # what the run spec and the export keep
    zero = build_model(mcfg, PretrainConfig(mlm_bias_init="zero"), resuming=False, store=store)
    assert not zero.cls.predictions.bias.any()
    assert all(m.p == 0.1 for m in zero.modules() if isinstance(m, torch.nn.Dropout))
    resumed = build_model(mcfg, p, resuming=True, store=store)  # a checkpoint's bias replaces it anyway
    assert not resumed.cls.predictions.bias.any()


def test_arch_list_with_hopper_suffix_is_rewritten_into_what_deepspeeds_jit_builder_parses(monkeypatch):
    # The GPU check's H200 image sets TORCH_CUDA_ARCH_LIST=9.0a; DeepSpeed 0.19 failed to build
    # FusedAdam on it, so no pretraining run started there.
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

    from training.optim import deepspeed_arch_list, prepare_fused_build

    builder = FusedAdamBuilder()
    builder.jit_mode = True
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0a 10.0f+PTX")
    with pytest.raises(ValueError, match="0a"):
        builder.compute_capability_args()
    prepare_fused_build()
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0;10.0+PTX"
    builder.compute_capability_args()  # parses now
    assert deepspeed_arch_list("8.6+PTX") == "8.6+PTX" and deepspeed_arch_list("sm_90") == "sm_90"


def test_the_slurm_template_runs_bertflow_pretrain_on_every_node_with_its_rank(tmp_path):
    """infra/slurm/pretrain.sbatch, run with stand-ins for srun (one task per node, SLURM_NODEID
    set in each), scontrol and the bertflow entry point (which records its arguments): every node
    gets a command the CLI parses, with its own --node-rank and the first node as master_addr."""
    import stat
    import subprocess

    from common.paths import PROJECT_ROOT
    from pipelines.cli import build_parser
    from pipelines.config import load_config
    from pipelines.stage_pretrain import check_nodes

    def executable(path, text):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)

    fake = tmp_path / "bin"
    executable(fake / "scontrol", "#!/bin/sh\nprintf 'gpu-a\\ngpu-b\\n'\n")
    executable(
        fake / "srun",
        '#!/bin/sh\nshift\nfor i in $(seq 0 $((SLURM_NNODES - 1))); do SLURM_NODEID=$i "$@" || exit 1; done\n',
    )
    executable(
        tmp_path / ".venv" / "bin" / "bertflow", '#!/bin/sh\nprintf "%s\\n" "$@" > "args-$SLURM_NODEID"\n'
    )
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "SLURM_NNODES": "2",
           "SLURM_JOB_NODELIST": "gpu-[a-b]", "SLURM_GPUS_ON_NODE": "4"}  # fmt: skip
    sbatch = PROJECT_ROOT / "infra" / "slurm" / "pretrain.sbatch"
    proc = subprocess.run(["bash", str(sbatch), "configs/default.yaml", "/s", "/t", "/o"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        argv = (tmp_path / f"args-{rank}").read_text().splitlines()
        args = build_parser("pretrain").parse_args(argv)
        assert (args.config, args.shards, args.tokenizer, args.output) == (
            "configs/default.yaml",
            "/s",
            "/t",
            "/o",
        )
        assert (args.nnodes, args.node_rank, args.num_processes) == (2, rank, "4")
        assert args.set == ["pretrain.master_addr=gpu-a", "pretrain.master_port=29500"]
        check_nodes(load_config(PROJECT_ROOT / args.config, [*args.set, "pretrain.nnodes=2"]), args.node_rank)


def test_a_nan_loss_without_a_checkpoint_claims_none_to_resume():
    """Only a checkpoint is resumed: a NaN before the first one must not send the user to "resume
    from that checkpoint"; at step 1 no update has been applied, so the lr is not the cause."""
    from pathlib import Path

    from training.train import check_finite

    with pytest.raises(FloatingPointError) as first:
        check_finite(float("nan"), 1, None, "fp32")
    assert "resumes from that checkpoint" not in str(first.value)
    assert "learning rate is not the cause" in str(first.value) and "masked-LM" in str(first.value)
    with pytest.raises(FloatingPointError) as later:
        check_finite(float("nan"), 7, None, "fp32")
    assert "resumes from that checkpoint" not in str(later.value)
    assert "starts again from step 0" in str(later.value) and "pretrain.lr" in str(later.value)
    with pytest.raises(FloatingPointError, match=r"global_step4\).*resumes from that checkpoint"):
        check_finite(float("nan"), 7, Path("ckpt/global_step4"), "fp32")
    check_finite(2.5, 1, None, "fp32")  # a finite loss passes


def test_a_small_held_out_split_is_said_before_training() -> None:
    """A validation split smaller than one step (2 ranks x 32) is still evaluated, and the run says
    how many examples its held-out figures rest on; one that the ranks cannot share says none."""
    from training.train import small_held_out_note

    p = PretrainConfig(micro_batch_size=32)
    assert small_held_out_note(64, p, world=2) is None
    note = small_held_out_note(59, p, world=2)
    assert "59 examples, fewer than one step's 64" in note and "from 58 of them" in note
    assert "preprocess.validation_fraction" in note
    assert "will not be logged" in small_held_out_note(1, p, world=2)
    accumulating = PretrainConfig(micro_batch_size=16, gradient_accumulation_steps=2)  # steps of 32, one rank
    assert small_held_out_note(32, accumulating, world=1) is None
    assert "fewer than one step's 32" in small_held_out_note(31, accumulating, world=1)


def test_a_torch_without_the_group_timeout_api_is_said_not_a_crash(monkeypatch, capsys) -> None:
    """`time_out_every_group` uses torch's private `_set_pg_timeout` (the GPU image has torch 2.11):
    where it is missing the run goes on with torch's default timeout, and says so."""
    from torch.distributed import distributed_c10d as c10d

    from training.train import time_out_every_group

    monkeypatch.delattr(c10d, "_set_pg_timeout")
    monkeypatch.setattr(c10d, "_pg_map", {object(): None})  # what `_world.pg_map` returns
    monkeypatch.setattr(c10d, "_rank_not_in_group", lambda group: False)
    time_out_every_group(60)
    assert "could not give DeepSpeed's process groups pretrain.dist_timeout_s" in capsys.readouterr().out


def test_consumed_tokens_of_a_resumed_run_start_from_the_real_tokens_of_the_steps_before() -> None:
    """metrics.jsonl's `consumed_tokens` is exact after a resume: the real tokens of every example
    of the steps before (all ranks, every micro batch, across an epoch boundary), then each step's."""
    import numpy as np

    from training.data import BatchPlan, ExampleStore
    from training.train import tokens_before

    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 40, size=50)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    empty = np.zeros(0, dtype=np.int32)
    store = ExampleStore(
        empty, empty, offsets, empty, empty, np.zeros(1, dtype=np.int64), np.zeros(50, np.int8)
    )
    plans = [BatchPlan(50, 3, 2, 2, rank, seed=7) for rank in (0, 1)]  # 12 a step, 4 steps an epoch
    for steps in (0, 3, 4, 9):
        expected = sum(
            int(lengths[plan.micro_batch_indices(step, micro)].sum())
            for step in range(steps)
            for micro in range(2)
            for plan in plans
        )
        assert tokens_before(plans[0], store, steps) == expected


def test_an_output_holding_the_users_files_is_refused_before_any_work(tmp_path, capsys) -> None:
    """`bertflow pretrain --output D` onto a folder of the user's (no bertflow output) overwrote
    their metrics.jsonl and mixed their files in model/ and checkpoints/ with the run's. Refused
    before any work, naming the files; a folder of only unrelated files, or a killed run's
    (its _IN_PROGRESS.json), passes the check."""
    from common.atomic import IN_PROGRESS_NAME
    from common.stage_output import refuse_foreign_files
    from pipelines.cli import main as cli

    mine = tmp_path / "mine"
    (mine / "model").mkdir(parents=True)
    (mine / "model" / "weights.bin").write_text("mine")
    (mine / "metrics.jsonl").write_text("mine\n")
    before = sorted(str(p.relative_to(mine)) for p in mine.rglob("*"))
    command = ["pretrain", "--shards", str(tmp_path / "s"), "--tokenizer", str(tmp_path / "t")]
    assert (
        cli(
            [*command, "--output", str(mine), "--preset", "tiny", "--max-steps", "10", "--num-processes", "1"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert f"the pretrain output {mine} already holds metrics.jsonl, model, and it is not" in err
    assert "choose an --output folder of its own" in err
    assert sorted(str(p.relative_to(mine)) for p in mine.rglob("*")) == before
    assert (mine / "metrics.jsonl").read_text() == "mine\n"
    (mine / "metrics.jsonl").unlink()
    (mine / "model" / "weights.bin").unlink()
    (mine / "model").rmdir()
    (mine / "notes.md").write_text("mine")
    from pipelines.stage_pretrain import OUTPUT_NAMES

    refuse_foreign_files(mine, "pretrain", OUTPUT_NAMES)  # only unrelated files: used
    (mine / "checkpoints").mkdir()  # an empty folder of a written name (its own disk mounted there): used
    refuse_foreign_files(mine, "pretrain", OUTPUT_NAMES)
    killed = tmp_path / "killed"
    (killed / "checkpoints").mkdir(parents=True)
    (killed / "run_spec.json").write_text("{}")
    (killed / IN_PROGRESS_NAME).write_text("{}")
    (tmp_path / ".killed.lock").write_text("1\n")  # the lock the killed run held beside it
    refuse_foreign_files(killed, "pretrain", OUTPUT_NAMES)  # a killed run's: resumed
    stray = tmp_path / "stray"  # a run_spec.json copied in with the user's files, no run's lock beside it
    stray.mkdir()
    (stray / "metrics.jsonl").write_text("mine\n")
    (stray / "run_spec.json").write_text("{}")
    assert cli([*command, "--output", str(stray), "--preset", "tiny", "--num-processes", "1"]) == 2
    err = capsys.readouterr().err
    said = f"the pretrain output {stray} already holds metrics.jsonl, run_spec.json, and it is not"
    assert said in err, err
    assert (stray / "metrics.jsonl").read_text() == "mine\n"
    many = tmp_path / "many"  # six of the names: four shown, the count of the others said
    many.mkdir()
    for name in ("data_cache", "launcher.log", "metrics.jsonl", "model", "run_spec.json", "wandb_files"):
        (many / name).write_text("mine\n")
    with pytest.raises(
        UserError, match="already holds data_cache, launcher.log, metrics.jsonl, model and 2 more,"
    ):
        refuse_foreign_files(many, "pretrain", OUTPUT_NAMES)
