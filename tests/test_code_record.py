"""Every stage output records the code that made it; reusing one that other code made is said.

The code is not in the stage keys (an upgrade must not cost a finished pretraining, nor a killed run
its progress), so these tests check the other half: the digest tracks code and only code, each
stage's record covers the files that compute it, and a reuse across a code change is said in the
log, the flow run's record and its end summary, with the files and the command that recomputes."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from common.atomic import MARKER_NAME, read_marker, write_marker
from common.paths import PROJECT_ROOT
from common.version import changed_sources, source_digests
from pipelines.config import load_config
from pipelines.stage_keys import STAGES, code_change_note, stage_code

CODE = '''"""A module."""


def scale(x):
    """Twice x."""
    return 2 * x
'''


def test_the_digest_changes_with_code_not_with_comments_docstrings_or_layout(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text(CODE)
    before = source_digests(("pkg/*.py",), root=tmp_path)
    assert list(before) == ["pkg/a.py"]

    (pkg / "a.py").write_text(
        '# a comment\n"""Other words."""\n\n\ndef scale(x):  # note\n    return 2 * x\n'
    )
    assert source_digests(("pkg/*.py",), root=tmp_path) == before

    (pkg / "a.py").write_text(CODE.replace("2 * x", "3 * x"))
    after = source_digests(("pkg/*.py",), root=tmp_path)
    assert changed_sources(before, after) == ["pkg/a.py"]

    (pkg / "b.py").write_text("VALUE = 1\n")  # a new file counts, a removed one too
    with_b = source_digests(("pkg/*.py",), root=tmp_path)
    assert changed_sources(after, with_b) == ["pkg/b.py"]
    (pkg / "b.py").unlink()
    assert changed_sources(with_b, source_digests(("pkg/*.py",), root=tmp_path)) == ["pkg/b.py"]


def test_each_stage_records_the_files_that_compute_it() -> None:
    assert set(stage_code("pretrain")) >= {"training/train.py", "training/data.py", "model/bert.py"}
    assert set(stage_code("preprocess")) >= {"preprocessing/masking.py", "preprocessing/examples.py"}
    assert set(stage_code("tokenizer")) >= {"preprocessing/wordpiece.py", "pipelines/stage_tokenizer.py"}
    assert set(stage_code("finetune")) >= {
        "finetuning/trainer.py",
        "finetuning/scorecard.py",
        "model/bert.py",
    }
    # the report renders the scorecard's headline and tables and the model card's held-out figures
    # itself: a page reused after they changed contradicted the end summary, which renders them anew
    assert set(stage_code("report")) >= {
        "pipelines/report_sections.py",
        "finetuning/scorecard.py",
        "model/model_card.py",
        "pipelines/pretrain_card.py",
    }
    assert not any(f.startswith(("training/", "model/")) for f in stage_code("tokenizer"))
    assert all(stage_code(stage) for stage in STAGES)


def test_a_note_names_the_outputs_and_files_made_by_other_code(tmp_path: Path) -> None:
    current = stage_code("finetune")
    same, other, unrecorded, incomplete = (tmp_path / n for n in ("same", "other", "old", "incomplete"))
    write_marker(same, {"code": current})
    write_marker(other, {"code": {**current, "finetuning/trainer.py": "0" * 16}})
    write_marker(unrecorded, {"unit": "made before code was recorded"})
    incomplete.mkdir()
    assert code_change_note("finetune", [same, incomplete]) == ""
    assert code_change_note("finetune", [same, other, unrecorded, incomplete]) == (
        "finetune: reusing 2 of 3 complete outputs made by other code (changed since: finetuning/trainer.py; "
        "some by a bertflow that did not record its code); to recompute with this code: "
        "bertflow run CONFIG --force finetune"
    )
    assert code_change_note("finetune", [unrecorded]) == (
        f"finetune: reusing {unrecorded} made by a bertflow that did not record its code; "
        "to recompute with this code: bertflow run CONFIG --force finetune"
    )


def test_the_tokenizer_stage_reuses_and_says_when_its_code_changed(
    tmp_path: Path, data_dir: Path, caplog
) -> None:
    from pipelines.stage_tokenizer import run_tokenizer_stage
    from preprocessing.config import TokenizerConfig

    cfg = TokenizerConfig(input=[str(data_dir / "wiki" / "summaries_en.txt")], vocab_size=300)
    out = tmp_path / "tok"
    run_tokenizer_stage(cfg, out)
    marker = read_marker(out)
    assert marker["code"] == stage_code("tokenizer")
    vocab_mtime = (out / "vocab.txt").stat().st_mtime_ns

    with caplog.at_level(logging.INFO, logger="bertflow"):
        run_tokenizer_stage(cfg, out)
    assert "up to date" in caplog.text and "other code" not in caplog.text

    marker["code"]["preprocessing/wordpiece.py"] = "0" * 16  # as if an older version had trained it
    (out / MARKER_NAME).write_text(json.dumps(marker))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="bertflow"):
        run_tokenizer_stage(cfg, out)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # not the flow's folder (a stage command's --output): `bertflow run --force` never writes it
    assert warnings == [
        f"tokenizer: reusing {out} made by other code (changed since: preprocessing/wordpiece.py); "
        f"to recompute with this code: delete {out} and run this command again"
    ]
    caplog.clear()
    flow = load_config(PROJECT_ROOT / "configs" / "default.yaml", [f"run_dir={tmp_path}"])
    with caplog.at_level(logging.INFO, logger="bertflow"):
        run_tokenizer_stage(cfg, out, flow=flow)  # the flow's folder of `flow`: its flow command
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings[0].endswith(
        f"to recompute with this code: bertflow run {PROJECT_ROOT / 'configs' / 'default.yaml'} "
        f"--force tokenizer --set run_dir={tmp_path}"
    ), warnings
    assert (out / "vocab.txt").stat().st_mtime_ns == vocab_mtime  # reused, not retrained


def test_a_stage_command_with_flags_in_the_flows_folder_names_the_flow_command_of_its_flags(
    tmp_path: Path, data_dir: Path, caplog, capsys
) -> None:
    """`bertflow tokenizer CONFIG --input F --vocab-size 300` (no --output) writes the flow's folder
    of those settings. Its note on an output of other code said "delete DIR and run this command
    again", a user's --output's advice, where the same settings given as --set items named the flow
    command. Now it names the flow command with the flags as --set items; parsed as typed, that
    command's config has the same settings and folder."""
    import shlex

    from pipelines.cli import build_parser
    from pipelines.cli import main as cli
    from pipelines.stage_keys import stage_dir

    corpus = tmp_path / "corpus.txt"
    lines = (data_dir / "wiki" / "summaries_en.txt").read_text(encoding="utf-8").splitlines()[:400]
    corpus.write_text("\n".join(lines), encoding="utf-8")
    config = str(PROJECT_ROOT / "configs" / "default.yaml")
    argv = [
        "tokenizer",
        config,
        "--set",
        f"run_dir={tmp_path}",
        "--input",
        str(corpus),
        "--vocab-size",
        "300",
    ]
    assert cli(argv) == 0
    out = Path(capsys.readouterr().out.strip().splitlines()[-1])
    marker = read_marker(out)
    marker["code"]["preprocessing/wordpiece.py"] = "0" * 16  # as if an older version had trained it
    (out / MARKER_NAME).write_text(json.dumps(marker))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertflow"):
        assert cli(argv) == 0
    note = next(r.getMessage() for r in caplog.records if "other code" in r.getMessage())
    command = note.partition("to recompute with this code: ")[2]
    assert command.startswith(f"bertflow run {config} --force tokenizer --set run_dir={tmp_path} "), note
    args = build_parser("run").parse_args(shlex.split(command)[1:])
    flow = load_config(args.config, args.overrides)
    assert flow.tokenizer.vocab_size == 300 and flow.tokenizer.input == [str(corpus)]
    assert stage_dir(flow, "tokenizer") == out
    # the flags' settings only, not every tokenizer key
    assert sorted(item.partition("=")[0] for item in args.overrides) == [
        "run_dir",
        "tokenizer.input",
        "tokenizer.vocab_size",
    ]


def test_a_flow_run_records_and_prints_a_reuse_across_a_code_change(tmp_path: Path, data_dir: Path) -> None:
    from pipelines.flow import bert_pipeline
    from pipelines.flow_command import end_summary

    overrides = [f"run_dir={tmp_path}"]
    first = bert_pipeline(config=None, overrides=overrides, only="verify")
    out = Path(first["stages"][0]["out_dir"])
    assert read_marker(out)["code"] == stage_code("verify") and first["stages"][0]["code_note"] == ""

    marker = read_marker(out)
    marker["code"] = {}  # made by a version whose verify code is gone
    (out / MARKER_NAME).write_text(json.dumps(marker))
    second = bert_pipeline(config=None, overrides=overrides, only="verify")
    [row] = second["stages"]
    assert row["status"] == "cached"
    assert row["code_note"] == (
        f"verify: reusing {out} made by other code (changed since: pipelines/verify_data.py); "
        f"to recompute with this code: bertflow run CONFIG --force verify --set run_dir={tmp_path}"
    )
    assert json.loads(Path(second["record"]).read_text())["stages"][0]["code_note"] == row["code_note"]
    assert f"  WARNING {row['code_note']}" in end_summary(second).splitlines()

    forced = bert_pipeline(config=None, overrides=overrides, only="verify", force=["verify"])
    assert forced["stages"][0]["code_note"] == "" and read_marker(out)["code"] == stage_code("verify")
