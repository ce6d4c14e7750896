"""The bad-input catalogue of issue 7, run through the real `bertflow` entry point in-process.

Each case: exit code 2 (user error), stderr is one short paragraph that names the offending
file/key, and no traceback. Two grouped runs cover what is not an error of the command: corrupt
corpus files that are counted skips (one preprocess run, counts checked in stats.json) and bad
task files that fail their fine-tuning unit (one finetune run, exit 1, every unit names its file).
The list is mirrored in docs/reliability.md ("Bad-input catalogue").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from common.atomic import read_marker
from pipelines.cli import main
from tests.shard_fixtures import make_shards, make_tokenizer_dir

SPECIALS = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, data_dir, minilm_dir) -> dict[str, Path]:
    """Small real inputs (shards from real text, the MiniLM vocab) plus every malformed file."""
    root = tmp_path_factory.mktemp("catalogue")
    tok = make_tokenizer_dir(minilm_dir, root / "tok")
    f = {
        "root": root,
        "tok": tok,
        "minilm": minilm_dir,
        "shards": make_shards(root / "shards", tok, data_dir, num_docs=40),
    }
    lines = (data_dir / "wiki" / "summaries_en.txt").read_text(encoding="utf-8").split("\n")[:60]
    f["good_txt"] = root / "good.txt"
    f["good_txt"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    f["blank_txt"] = root / "blank.txt"
    f["blank_txt"].write_text("\n\n\n")
    f["empty_txt"] = root / "empty.txt"
    f["empty_txt"].write_bytes(b"")
    f["vocab_nospecial"] = root / "plain_vocab.txt"
    f["vocab_nospecial"].write_text("hello\nworld\n##s\n")
    f["regular_file"] = root / "a_regular_file"
    f["regular_file"].write_text("not a directory\n")
    f["ds_bad_batch"] = root / "ds_bad_batch.json"
    f["ds_bad_batch"].write_text(json.dumps({"train_batch_size": 30, "zero_optimization": {"stage": 1}}))
    configs = {
        "cfg_unknown_key": "pretrain:\n  max_stepz: 10\n",
        "cfg_wrong_type": "pretrain:\n  max_steps: many\n",
        "cfg_not_mapping": "- just\n- a list\n",
        "cfg_empty": "# my settings, to be written\n",
        "cfg_invalid_yaml": "pretrain:\n  max_steps: [1, 2\n",
        "cfg_unknown_preset": "model:\n  preset: huge\n",
        "cfg_good": "model:\n  preset: tiny\n",
        "cfg_duplicate_section": "pretrain:\n  max_steps: 10\nmodel:\n  preset: tiny\npretrain:\n  lr: 0.1\n",
    }
    for name, text in configs.items():
        f[name] = root / f"{name}.yaml"
        f[name].write_text(text)
    f["task_bad_key"] = root / "task_bad_key.yaml"
    f["task_bad_key"].write_text(
        "movies:\n  format: tsv\n  kind: classification\n  train: m.tsv\n  dev: m.tsv\n"
        "  text_a: text\n  label: sentiment\n  labels: [neg, pos]\n  metricz: [accuracy]\n"
    )
    f["task_invalid_yaml"] = root / "task_invalid_yaml.yaml"
    f["task_invalid_yaml"].write_text("movies:\n  format: [tsv\n")
    decoder = root / "hf_decoder"  # issue 14 item 5: an option this BERT does not compute
    decoder.mkdir()
    (decoder / "config.json").write_text(
        json.dumps({**json.loads((minilm_dir / "config.json").read_text()), "is_decoder": True})
    )
    (decoder / "model.safetensors").symlink_to(minilm_dir / "model.safetensors")
    f["hf_decoder"] = decoder
    pretrain_out = root / "a_pretrain_output"  # issue 14 item 13: its model is in model/
    (pretrain_out / "model").mkdir(parents=True)
    (pretrain_out / "run_spec.json").write_text("{}")
    (pretrain_out / "model" / "config.json").write_text((minilm_dir / "config.json").read_text())
    f["pretrain_out"] = pretrain_out
    hf = root / "hf_corrupt"
    hf.mkdir()
    (hf / "config.json").write_text((minilm_dir / "config.json").read_text())
    (hf / "model.safetensors").write_bytes((minilm_dir / "model.safetensors").read_bytes()[:1000])
    f["hf_corrupt"] = hf
    return f


@dataclass(frozen=True)
class Case:
    id: str
    argv: Callable[[dict[str, Path]], list[str]]
    names: Callable[[dict[str, Path]], list[str]]  # strings the error must contain (file/key)
    rc: int = 2


def _s(key: str) -> Callable[[dict[str, Path]], str]:
    return lambda f: str(f[key])


def _pretrain(*extra: str) -> Callable[[dict[str, Path]], list[str]]:
    def argv(f: dict[str, Path]) -> list[str]:
        out = f["root"] / "pretrain-out"
        base = ["pretrain", "--shards", str(f["shards"]), "--tokenizer", str(f["tok"]), "--output", str(out)]
        return base + ["--max-steps", "2", "--micro-batch-size", "2", *[a.format(**f) for a in extra]]

    return argv


def _finetune(*extra: str) -> Callable[[dict[str, Path]], list[str]]:
    def argv(f: dict[str, Path]) -> list[str]:
        base = ["finetune", "--checkpoint", "random:tiny", "--tokenizer", str(f["tok"]), "--baselines", ""]
        out = ["--output", str(f["root"] / "finetune-out")]
        return base + out + [a.format(**f) for a in extra]

    return argv


def _tokenizer(*extra: str) -> Callable[[dict[str, Path]], list[str]]:
    return lambda f: ["tokenizer", "--output", str(f["root"] / "tok-out"), *[a.format(**f) for a in extra]]


def _preprocess(*extra: str) -> Callable[[dict[str, Path]], list[str]]:
    def argv(f: dict[str, Path]) -> list[str]:
        base = ["preprocess", "--vocab", str(f["tok"]), "--workers", "1"]
        return base + [a.format(**f) for a in extra]

    return argv


CASES = [
    # corpus files
    Case(
        "empty-corpus-preprocess",
        _preprocess("--input", "{empty_txt}", "--output", "{root}/o1"),
        lambda f: [str(f["empty_txt"]), "empty"],
    ),  # noqa: E501
    Case(
        "blank-corpus-tokenizer",
        _tokenizer("--input", "{blank_txt}", "--vocab-size", "100"),
        lambda f: [str(f["blank_txt"]), "no documents"],
    ),  # noqa: E501
    Case(
        "corpus-glob-matches-nothing",
        _tokenizer("--input", "{root}/nothing*.txt"),
        lambda f: ["nothing*.txt", "matches no file"],
    ),  # noqa: E501
    Case(
        "corpus-empty-data-path",  # read the whole data root, evaluation files included (a small
        # root here, so that without the check the run ends quickly instead of reading the real one)
        _tokenizer("--input", "data:", "--set", "data_root={tok}"),
        lambda f: ["tokenizer.input", "'data:'", "whole data root"],
    ),
    Case(
        "corpus-glob-nothing-preprocess",
        _preprocess("--input", "{root}/nope/*.gz", "--output", "{root}/o2"),
        lambda f: ["nope/*.gz"],
    ),  # noqa: E501
    # vocabularies
    Case(
        "vocab-without-special-tokens",
        _tokenizer("--vocab", "{vocab_nospecial}"),
        lambda f: [str(f["vocab_nospecial"]), "[CLS]"],
    ),  # noqa: E501
    Case(
        "vocab-missing",
        _preprocess("--input", "{good_txt}", "--vocab", "{root}/no_vocab.txt", "--output", "{root}/o3"),
        lambda f: ["no_vocab.txt", "does not exist"],
    ),  # noqa: E501
    # negative or zero sizes
    Case(
        "vocab-size-zero",
        _tokenizer("--input", "{good_txt}", "--vocab-size", "0"),
        lambda f: ["tokenizer.vocab_size", "(got 0)"],
    ),
    Case(
        "max-seq-length-zero",
        _preprocess("--input", "{good_txt}", "--max-seq-length", "0", "--output", "{root}/o4"),
        lambda f: ["preprocess.max_seq_length", "(got 0)"],
    ),  # noqa: E501
    Case(
        "dupe-factor-negative",
        _preprocess("--input", "{good_txt}", "--dupe-factor", "-1", "--output", "{root}/o5"),
        lambda f: ["dupe_factor"],
    ),  # noqa: E501
    Case(
        "max-predictions-too-many",
        _preprocess(
            "--input",
            "{good_txt}",
            "--max-seq-length",
            "16",
            "--max-predictions-per-seq",
            "20",
            "--output",
            "{root}/o6",
        ),
        lambda f: ["max_predictions_per_seq", "max_seq_length=16"],
    ),  # noqa: E501
    Case(
        "preprocess-unknown-runner",  # issue 14 item 8 (a ValueError traceback before)
        _preprocess("--input", "{good_txt}", "--set", "preprocess.runner=FooRunner", "--output", "{root}/o8"),
        lambda f: ["preprocess.runner", "FooRunner", "DirectRunner"],
    ),
    Case(
        "global-batch-larger-than-the-data",  # issue 14 item 11 (a launcher traceback before)
        _pretrain("--micro-batch-size", "4000"),
        lambda f: [str(f["shards"]), "fewer than one global batch", "4000"],
    ),
    Case(
        "pretrain-output-is-the-shards",  # issue 14 item 13 (it advised deleting the shards)
        lambda f: _pretrain()(f)[:6] + [str(f["shards"])] + _pretrain()(f)[7:],
        lambda f: [str(f["shards"]), "shards directory", "--output"],
    ),
    Case(
        "finetune-max-seq-above-the-positions",  # issue 14 item 10 (an IndexError on long inputs)
        _finetune("--tasks", "sst2", "--max-seq-length", "1024"),
        lambda f: ["max_seq_length 1024", "512 positions", "random:tiny"],
    ),
    Case(
        "finetune-checkpoint-is-a-pretrain-output",  # issue 14 item 13 (it suggested --tokenizer)
        lambda f: [
            "finetune",
            "--checkpoint",
            str(f["pretrain_out"]),
            "--tasks",
            "sst2",
            "--baselines",
            "",
            "--output",
            str(f["root"] / "ft2"),
        ],  # fmt: skip
        lambda f: [str(f["pretrain_out"] / "model")],
    ),
    Case(
        "import-hf-is-decoder",  # issue 14 item 5 (wrote a bidirectional encoder)
        lambda f: ["import-hf", str(f["hf_decoder"]), str(f["root"] / "imp2")],
        lambda f: ["is_decoder", "not supported"],
    ),
    Case(
        "micro-batch-zero",
        _pretrain("--micro-batch-size", "0"),
        lambda f: ["--micro-batch-size 0", "pretrain.micro_batch_size", "(got 0)"],
    ),
    Case(
        "epochs-zero",
        _finetune("--tasks", "sst2", "--epochs", "0"),
        lambda f: ["--epochs", "finetune.epochs", "(got 0", "keep 3"],
    ),
    Case(
        "num-shards-yes",  # pydantic read the boolean as 1: one shard
        _preprocess("--input", "{good_txt}", "--set", "preprocess.num_shards=yes", "--output", "{root}/o9"),
        lambda f: ["preprocess.num_shards", "not a boolean"],
    ),
    Case(
        "num-shards-zero",
        _preprocess("--input", "{good_txt}", "--num-shards", "0", "--output", "{root}/o7"),
        lambda f: ["preprocess.num_shards", "(got 0)"],
    ),  # noqa: E501
    # model / training settings
    Case(
        "max-seq-above-max-positions",
        _pretrain("--set", "model.max_position_embeddings=64"),
        lambda f: ["64 positions"],
    ),  # noqa: E501
    Case(
        "pretrain-flag-value-with-a-config",  # was "config file CFG is invalid": the flag's value blamed on the file
        lambda f: ["pretrain", str(f["cfg_good"]), *_pretrain("--nnodes", "0")(f)[1:]],
        lambda f: ["bad flag value --nnodes 0", "pretrain.nnodes", "greater than or equal to 1"],
    ),
    Case(
        "pretrain-preset-flag-with-a-config",
        lambda f: ["pretrain", str(f["cfg_good"]), *_pretrain("--preset", "huge")(f)[1:]],
        lambda f: ["bad flag value --preset huge", "model.preset: 'huge' is unknown"],
    ),
    Case("zero-stage-4", _pretrain("--zero-stage", "4"), lambda f: ["ZeRO stage 4"]),
    Case(
        "fp16-on-cpu",
        _pretrain("--set", "pretrain.precision=fp16"),
        lambda f: ["pretrain.precision fp16 needs a GPU"],
    ),
    Case(
        "batch-sizes-do-not-divide",
        _pretrain("--set", "pretrain.deepspeed_config={ds_bad_batch}"),
        lambda f: ["train_batch_size=30"],
    ),  # noqa: E501
    Case(
        "unknown-preset-config",
        lambda f: [
            "pretrain",
            str(f["cfg_unknown_preset"]),
            "--shards",
            str(f["shards"]),
            "--tokenizer",
            str(f["tok"]),
            "--output",
            str(f["root"] / "p"),
        ],
        lambda f: [str(f["cfg_unknown_preset"]), "huge"],
    ),  # noqa: E501
    # missing paths
    Case(
        "shards-dir-missing",
        lambda f: _pretrain()(f)[:2] + [str(f["root"] / "no_shards")] + _pretrain()(f)[3:],
        lambda f: [str(f["root"] / "no_shards")],
    ),  # noqa: E501
    Case(
        "init-from-checkpoint-missing",
        _pretrain("--set", "pretrain.init_from={root}/no_ckpt"),
        lambda f: ["no_ckpt", "init_from"],
    ),  # noqa: E501
    Case(
        "finetune-checkpoint-missing",
        lambda f: [
            "finetune",
            "--checkpoint",
            str(f["root"] / "no_model"),
            "--tasks",
            "sst2",
            "--baselines",
            "",
            "--output",
            str(f["root"] / "ft"),
        ],
        lambda f: ["no_model"],
    ),  # noqa: E501
    Case(
        "finetune-tokenizer-missing",  # was a failed unit (exit 1) whose fix named --vocab
        _finetune("--tasks", "rte", "--tokenizer", "{root}/no_tok"),
        lambda f: [str(f["root"] / "no_tok"), "does not exist", "--tokenizer"],
    ),
    Case(
        "finetune-tokenizer-is-a-pretrain-output",
        _finetune("--tasks", "rte", "--tokenizer", "{pretrain_out}"),
        lambda f: [f"--tokenizer {f['pretrain_out']} holds neither", str(f["pretrain_out"] / "model")],
    ),
    Case("finetune-unknown-task", _finetune("--tasks", "sst3"), lambda f: ["sst3"]),
    Case(
        "task-config-unknown-key",
        _finetune("--tasks", "movies", "--task-config", "{task_bad_key}"),
        lambda f: [str(f["task_bad_key"]), "metricz"],
    ),  # noqa: E501
    Case(
        "task-config-missing",
        _finetune("--tasks", "sst2", "--task-config", "{root}/no_tasks.yaml"),
        lambda f: ["no_tasks.yaml"],
    ),  # noqa: E501
    Case(
        "task-config-is-a-folder",  # said "does not exist" of a folder that does
        _finetune("--tasks", "sst2", "--task-config", "{root}"),
        lambda f: [f"task config {f['root']} is a folder, not a file", "--task-config"],
    ),
    Case(
        "task-config-invalid-yaml",  # PyYAML's multi-line excerpt before, as the config file's was
        _finetune("--tasks", "movies", "--task-config", "{task_invalid_yaml}"),
        lambda f: [str(f["task_invalid_yaml"]), "not valid YAML at line 3, column 1"],
    ),
    Case(
        "import-hf-missing-dir",
        lambda f: ["import-hf", str(f["root"] / "no_hf"), str(f["root"] / "imp0")],
        lambda f: ["no_hf"],
    ),  # noqa: E501
    Case(
        "import-hf-corrupt-weights",
        lambda f: ["import-hf", str(f["hf_corrupt"]), str(f["root"] / "imp1")],
        lambda f: ["model.safetensors", "corrupt"],
    ),  # noqa: E501
    # configs and --set
    Case(
        "config-file-missing",
        _tokenizer("{root}/no_config.yaml"),
        lambda f: ["no_config.yaml", "does not exist"],
    ),
    Case(
        "config-is-a-folder",  # said "does not exist" of a folder that does
        lambda f: ["run", str(f["root"])],
        lambda f: [f"config file {f['root']} is a folder, not a file", "Fix:"],
    ),
    Case(
        "pretrain-config-is-a-folder",
        lambda f: ["pretrain", str(f["root"]), *_pretrain()(f)[1:]],
        lambda f: [f"config file {f['root']} is a folder, not a file", "Fix:"],
    ),
    Case(
        "deepspeed-config-is-a-folder",
        _pretrain("--set", "pretrain.deepspeed_config={root}"),
        lambda f: [f"DeepSpeed config {f['root']} is a folder, not a file", "pretrain.deepspeed_config"],
    ),
    Case(
        "hostfile-is-a-folder",
        _pretrain("--set", "pretrain.hostfile={root}"),
        lambda f: [f"hostfile {f['root']} is a folder, not a file"],
    ),
    Case(
        "config-unknown-key",
        _tokenizer("{cfg_unknown_key}"),
        lambda f: [str(f["cfg_unknown_key"]), "pretrain.max_stepz", "unknown key"],
    ),  # noqa: E501
    Case(
        "config-wrong-type",
        _tokenizer("{cfg_wrong_type}"),
        lambda f: [str(f["cfg_wrong_type"]), "pretrain.max_steps"],
    ),  # noqa: E501
    Case(
        "config-not-a-mapping",
        _tokenizer("{cfg_not_mapping}"),
        lambda f: [str(f["cfg_not_mapping"]), "mapping"],
    ),
    Case(
        "config-empty",  # ran every default: the 6-minute default flow into ./runs
        _tokenizer("{cfg_empty}"),
        lambda f: [str(f["cfg_empty"]), "holds no settings", "configs/default.yaml"],
    ),
    Case(
        "config-invalid-yaml",
        _tokenizer("{cfg_invalid_yaml}"),
        lambda f: [str(f["cfg_invalid_yaml"]), "not valid YAML"],
    ),  # noqa: E501
    Case(
        "config-duplicate-section",  # YAML kept the second `pretrain:` only, dropping max_steps
        _tokenizer("{cfg_duplicate_section}"),
        lambda f: [str(f["cfg_duplicate_section"]), "key 'pretrain' appears twice (lines 1 and 5)"],
    ),
    Case(
        "set-without-equals",
        _tokenizer("--set", "pretrain.max_steps"),
        lambda f: ["pretrain.max_steps", "KEY=VALUE"],
    ),  # noqa: E501
    Case(
        "set-unknown-key", _tokenizer("--set", "tokenizer.vocab_sise=10"), lambda f: ["tokenizer.vocab_sise"]
    ),
    Case("unknown-cli-flag", _tokenizer("--vocab-sise", "10"), lambda f: ["--vocab-sise"]),
    # unwritable outputs (root ignores chmod: a path below a regular file cannot be created)
    Case(
        "tokenizer-output-under-a-file",
        _tokenizer("--vocab", "{tok}", "--output", "{regular_file}/tok"),
        lambda f: [str(f["regular_file"])],
    ),  # noqa: E501
    Case(
        "preprocess-output-under-a-file",
        _preprocess("--input", "{good_txt}", "--output", "{regular_file}/shards"),
        lambda f: [str(f["regular_file"])],
    ),  # noqa: E501
    Case(
        "pretrain-output-under-a-file",
        lambda f: _pretrain()(f)[:6] + [str(f["regular_file"] / "run")] + _pretrain()(f)[7:],
        lambda f: [str(f["regular_file"])],
    ),  # noqa: E501
    Case(
        "run-dir-is-a-file",  # issue 14 item 11 (a Prefect traceback before)
        lambda f: ["run", "--set", f"run_dir={f['regular_file']}"],
        lambda f: ["run_dir", str(f["regular_file"]), "is a file"],
    ),
    Case(
        "runs-run-dir-missing",  # read "no flow runs yet", exit 0
        lambda f: ["runs", "--run-dir", str(f["root"] / "no_runs")],
        lambda f: ["--run-dir", str(f["root"] / "no_runs"), "does not exist"],
    ),
    Case(
        "runs-run-dir-is-a-file",
        lambda f: ["runs", "--run-dir", str(f["regular_file"])],
        lambda f: ["--run-dir", str(f["regular_file"]), "is a file"],
    ),
    Case(
        "evaluate-json-is-a-folder",  # evaluated, then an IsADirectoryError traceback
        lambda f: ["evaluate", str(f["minilm"]), "--shards", str(f["shards"]), "--json", str(f["root"])],
        lambda f: ["--json", str(f["root"]), "is a folder"],
    ),
    Case(
        "finetune-output-is-a-file",  # a NotADirectoryError traceback in every unit
        _finetune("--tasks", "rte", "--output", "{regular_file}"),  # the last --output wins
        lambda f: ["--output", str(f["regular_file"]), "is a file"],
    ),
    Case(
        "report-output-is-a-file",  # said "File exists" with a fix about the parent directory
        lambda f: ["report", "--output", str(f["regular_file"])],
        lambda f: ["--output", str(f["regular_file"]), "is a file, not a folder"],
    ),
    Case(
        "run-run-dir-under-proc",  # os.access says writable for root: a FileNotFoundError traceback in the flow
        lambda f: ["run", "configs/default.yaml", "--set", "run_dir=/proc/bertflow-run-dir"],
        lambda f: [
            "run_dir /proc/bertflow-run-dir",
            "cannot create a folder in /proc",
            "Fix: set run_dir to a writable folder",
        ],
    ),
    Case(
        "import-hf-output-under-a-file",
        lambda f: ["import-hf", str(f["minilm"]), str(f["regular_file"] / "m")],
        lambda f: [str(f["regular_file"])],
    ),
]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse errors
        rc = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return rc, out, err


def error_paragraph(err: str) -> str:
    """The error as the user sees it: the last paragraph of stderr."""
    return err.strip().split("\n\n")[-1]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_clear_paragraph(case: Case, inputs, capsys):
    rc, out, err = run_cli(case.argv(inputs), capsys)
    assert rc == case.rc, f"exit {rc}\nstdout: {out[-2000:]}\nstderr: {err[-2000:]}"
    assert "Traceback" not in err and "Traceback" not in out
    paragraph = error_paragraph(err)
    assert "error" in paragraph and len(paragraph) < 1500, err
    assert paragraph.count("\n") <= 2, err  # one paragraph, not a dump
    for name in case.names(inputs):
        assert name in paragraph, f"{name!r} not in: {paragraph}"


def test_corrupt_corpus_files_are_counted_skips(inputs, capsys, tmp_path):
    """Non-UTF-8 bytes, a binary file, a line over 1 MiB and an unclosed <doc>: one run, each counted."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a_good.txt").write_text(inputs["good_txt"].read_text())
    (corpus / "b_latin1.txt").write_bytes("Caf\xe9 au lait is a drink. It has milk.\n".encode("latin-1"))
    (corpus / "c_binary.bin").write_bytes(b"\x7fELF\x00\x01\x02" * 2000)
    (corpus / "d_huge_line.txt").write_bytes(
        b"x" * (1 << 20) + b"y" * 100 + b"\nA short line. Another one.\n"
    )
    (corpus / "e_wiki_unclosed").write_text(
        '<doc id="1" url="u" title="T">\nT\n\nFirst sentence here. Second sentence here.\n'
    )
    out = tmp_path / "shards"
    argv = _preprocess(
        "--input", f"{corpus}/*", "--output", str(out), "--dupe-factor", "1", "--num-shards", "1"
    )
    rc, stdout, err = run_cli(argv(inputs), capsys)
    assert rc == 0, err[-3000:]
    assert "Traceback" not in err and read_marker(out) is not None
    stats = json.loads((out / "stats.json").read_text())
    skipped = stats["skipped"]
    assert skipped.get("lines_with_invalid_utf8_replaced") == 1, skipped
    assert skipped.get("files_skipped_binary") == 1, skipped
    assert skipped.get("lines_skipped_over_1mb") == 1, skipped
    assert skipped.get("docs_unclosed_tag") == 1, skipped
    assert stats["input_files"] == 5 and stats["examples"] > 0


BAD_TSVS = {
    "wrong_columns": ("text\tsentiment\ngood film\tpos\nbad\tfilm\tneg\n", "3 tab-separated columns"),
    "unknown_label": ("text\tsentiment\ngood film\tpos\nbad film\tmeh\n", "unknown label 'meh'"),
    "empty": ("", "is empty"),
    "missing": (None, "does not exist"),
}


def test_bad_task_files_are_refused_before_any_unit_each_named(inputs, capsys, tmp_path):
    """One finetune run over four broken tasks: one error naming each file and its problem, exit 2,
    before any unit trains (each unit used to fail in turn, exit 1)."""
    lines = []
    for name, (rows, _) in BAD_TSVS.items():
        tsv = tmp_path / f"{name}.tsv"
        if rows is not None:
            tsv.write_text(rows)
        lines.append(
            f"{name}:\n  format: tsv\n  kind: classification\n  train: {tsv}\n  dev: {tsv}\n"
            "  text_a: text\n  label: sentiment\n  labels: [neg, pos]\n  metrics: [accuracy]\n"
        )
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text("".join(lines))
    argv = _finetune("--tasks", ",".join(BAD_TSVS), "--task-config", str(tasks), "--workers", "1")
    argv = argv(inputs)
    argv[argv.index("--output") + 1] = str(tmp_path / "ft")
    rc, out, err = run_cli(argv, capsys)
    assert rc == 2, f"stdout: {out[-3000:]}\nstderr: {err[-3000:]}"
    assert "Traceback" not in out + err and f"{len(BAD_TSVS)} fine-tuning tasks cannot be read" in err
    problems = [line for line in err.splitlines() if line.startswith("- ")]
    assert len(problems) == len(BAD_TSVS), err
    for name, (_, words) in BAD_TSVS.items():
        line = next(x for x in problems if str(tmp_path / f"{name}.tsv") in x)
        assert words in line, line
    assert not (tmp_path / "ft" / "units").exists()  # no unit started
