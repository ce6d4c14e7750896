"""The `bertflow` command line: every option explains itself, `--version`, the command order,
"did you mean" for typos, and `--set` taking list values the way the dedicated flags do."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from common.errors import UserError
from common.paths import PROJECT_ROOT
from pipelines.cli import COMMANDS, build_parser, main
from pipelines.config import load_config


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser(name)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_option_of_every_command_has_help(name: str) -> None:
    parser = _subparser(name)
    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    assert actions, f"bertflow {name} defines no arguments"
    missing = [a.option_strings or [a.dest] for a in actions if not (a.help or "").strip()]
    assert not missing, f"bertflow {name}: no help text for {missing}"
    sets = [a for a in actions if "--set" in a.option_strings]
    for action in sets:  # the one shared --set, which says what it takes
        assert "finetune.tasks=sst2,mrpc" in action.help


def test_version_and_command_order(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("bertflow 0.1.0 (python ") and "deepspeed " in out
    assert main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = [line.split()[0] for line in lines if line.startswith("    ") and line[4] != " "]
    assert listed[:6] == ["run", "tokenizer", "preprocess", "pretrain", "finetune", "report"], listed


def test_unknown_command_suggests_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pretrian", "--max-steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'pretrian'" in err and "Did you mean `bertflow pretrain`?" in err


def test_set_takes_comma_separated_lists() -> None:
    cfg = load_config(
        None,
        ["finetune.tasks=sst2,mrpc", "finetune.lrs=1e-4, 3e-5", "finetune.seeds=7", "report.title=a, b"],
    )
    assert cfg.finetune.tasks == ["sst2", "mrpc"]
    assert cfg.finetune.lrs == [1e-4, 3e-5]
    assert cfg.finetune.seeds == [7]
    assert cfg.report.title == "a, b"  # not a list setting: the text as written
    assert load_config(None, ["finetune.tasks=[rte, cola]"]).finetune.tasks == ["rte", "cola"]


@pytest.mark.parametrize("name", ["run", "pretrain", "finetune", "preprocess"])
def test_one_set_takes_several_settings_as_the_issue_typed_them(name: str) -> None:
    """`--set pretrain.max_steps=2400 pretrain.lr=1e-3 pretrain.warmup_steps=240` (issue 12's
    command) applies all three, beside a repeated --set; a config path after --set is refused
    with the fix, not read as a setting."""
    parser = build_parser(name)
    argv = [name, "configs/default.yaml", "--set", "pretrain.max_steps=2400", "pretrain.lr=1e-3",
            "pretrain.warmup_steps=240", "--set", "finetune.epochs=2"]  # fmt: skip
    args = parser.parse_args(argv)
    overrides = getattr(args, "set", None) or args.overrides
    cfg = load_config(PROJECT_ROOT / "configs" / "default.yaml", overrides)
    assert (cfg.pretrain.max_steps, cfg.pretrain.lr, cfg.pretrain.warmup_steps) == (2400, 1e-3, 240)
    assert cfg.finetune.epochs == 2
    late = parser.parse_args([name, "--set", "pretrain.max_steps=3", "configs/default.yaml"])
    with pytest.raises(UserError, match=r"--set 'configs/default.yaml'.*goes before --set"):
        load_config(None, getattr(late, "set", None) or late.overrides)


def test_unknown_keys_name_the_closest_known_key() -> None:
    with pytest.raises(
        UserError, match=r"pretrain\.max_step: unknown key \(did you mean pretrain\.max_steps\?\)"
    ):
        load_config(None, ["pretrain.max_step=3"])
    with pytest.raises(UserError, match=r"pretrian: unknown key \(did you mean pretrain\?\)"):
        load_config(None, ["pretrian.max_steps=3"])
    with pytest.raises(UserError, match=r"finetune\.xyzzy: unknown key") as exc:
        load_config(None, ["finetune.xyzzy=1"])
    assert "did you mean" not in str(exc.value)  # nothing close: no guess
    with pytest.raises(UserError, match=r"'bsae' is unknown \(did you mean base\?\)"):
        load_config(None, ["model.preset=bsae"])


def test_stage_flag_help_in_a_real_shell() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "finetune", "--help"],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env={**__import__("os").environ, "PYTHONPATH": str(PROJECT_ROOT), "COLUMNS": "200"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--epochs EPOCHS" in proc.stdout and "passes over the training examples" in proc.stdout


def test_end_of_run_summary_names_the_result_the_model_and_the_report(tmp_path, monkeypatch) -> None:
    import json

    from common.tracking import first_attempt_group_file
    from pipelines.flow_command import end_summary

    pre, fin = tmp_path / "pretrain" / "k1", tmp_path / "finetune" / "k2"
    (pre / "model").mkdir(parents=True)
    fin.mkdir(parents=True)
    headline = {"name": "pretrained (tiny, 300 steps)", "checkpoint": "k1/model", "versus_name": "random init (tiny)",
                "glue_average_delta": 1.5, "ahead_on": ["stsb"], "tasks": ["sst2", "stsb"], "seeds": 1,
                "at_chance": [], "random_at_chance": []}  # fmt: skip
    (fin / "scorecard.json").write_text(json.dumps({"headline": headline}))
    stages = [
        {"stage": "pretrain", "status": "ran", "seconds": 350.0, "out_dir": str(pre)},
        {"stage": "finetune", "status": "ran", "seconds": 4.0, "out_dir": str(fin)},
    ]
    summary = {
        "stages": stages,
        "run_dir": str(tmp_path),
        "wandb_group": "default-x",
        "report_html": "r.html",
    }
    text = end_summary(summary)
    assert (
        "Result: pretrained (tiny, 300 steps) vs random init (tiny): GLUE-style average +1.5 points" in text
    )
    assert f"Model:  {pre / 'model'}" in text and "Report: r.html" in text and "group default-x" in text
    assert "first attempt" not in text
    group_file = first_attempt_group_file(pre)  # written by the pretraining's first attempt
    group_file.parent.mkdir()
    group_file.write_text("default-x")  # this flow run's own first attempt
    assert "first attempt" not in end_summary(summary)
    group_file.write_text("default-earlier")  # resumed an earlier flow run's attempt
    assert (
        "        pretrain: its run is in group default-earlier, that of its first attempt, which it resumed"
        in end_summary(summary).splitlines()
    )
    cached = [{**r, "status": "cached"} for r in stages]
    cached.append(
        {"stage": "finetune-units", "status": "0 ran, 4 cached", "seconds": 0.2, "out_dir": str(fin)}
    )
    text = end_summary({**summary, "stages": cached})
    assert "default-x" not in text and "nothing new logged" in text  # no group in which no run was written
    # the hint at past runs names the run directory where `bertflow runs` would not look by itself
    (tmp_path / "latest").mkdir()
    assert f"(`bertflow runs --run-dir {tmp_path}` lists past runs)" in end_summary(summary)
    monkeypatch.chdir(tmp_path.parent)  # the default run_dir, `runs`, is here
    (tmp_path.parent / "runs" / "latest").mkdir(parents=True, exist_ok=True)
    assert "(`bertflow runs` lists past runs)" in end_summary({**summary, "run_dir": "runs"})


def test_end_of_run_summary_columns_line_up_for_long_stage_names_and_statuses(tmp_path) -> None:
    """A phase's stage (pretrain@short) and the units' status ("30 ran, 0 cached, 30 reused") were
    wider than their fixed columns and pushed the rest of their row out of line."""
    from pipelines.flow_command import end_summary

    stages = [
        {"stage": "verify", "status": "ran", "seconds": 1.2, "out_dir": "/r/verify/a"},
        {"stage": "pretrain@short-sequences", "status": "cached", "seconds": 48.8, "out_dir": "/r/pretrain/b"},
        {"stage": "finetune-units", "status": "30 ran, 0 cached, 30 reused", "seconds": 7000.0,
         "out_dir": "/r/finetune/units"},
    ]  # fmt: skip
    text = end_summary({"stages": stages, "run_dir": str(tmp_path), "wandb_group": "g"})
    rows = text.splitlines()[:3]
    statuses = [row[len("  pretrain@short-sequences  ") :].split("  ")[0] for row in rows]
    assert statuses == ["ran", "cached", "30 ran, 0 cached, 30 reused"]  # one status column
    assert len({row.index(" /r/") for row in rows}) == 1  # the times right-aligned, then the paths
    assert rows[2].endswith("30 ran, 0 cached, 30 reused  1 h 56 min  /r/finetune/units")


def test_make_run_goes_online_with_a_wandb_api_key_as_the_readme_says(tmp_path) -> None:
    """README: offline by default, online with WANDB_API_KEY, WANDB_MODE wins. The Makefile used
    to export WANDB_MODE=offline, so under `make run` the key never took effect."""
    import os

    show = (
        "show-wandb-mode: ; @$(PY) -c 'from common.tracking import WandbTarget as T;"
        ' print(T(mode="offline").resolved_mode())\''
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}

    def mode_under_make(**extra: str) -> str:
        cmd = ["make", "-s", "-o", "install", "--eval", show, "show-wandb-mode"]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT_ROOT, env={**env, **extra})
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    assert mode_under_make() == "offline"
    assert mode_under_make(WANDB_API_KEY="x" * 40) == "online"
    assert mode_under_make(WANDB_API_KEY="x" * 40, WANDB_MODE="disabled") == "disabled"


def test_set_of_a_key_below_a_value_is_a_user_error() -> None:
    """`--set pretrain.lr=1 pretrain.lr.x=2` makes a value a section: one clear error, no traceback."""
    with pytest.raises(UserError, match=r"--set pretrain\.lr\.x: 'lr' is not a section"):
        load_config(None, ["pretrain.lr=1", "pretrain.lr.x=2"])


def test_output_into_a_pipe_whose_reader_left_ends_quietly() -> None:
    """`bertflow model-info | head -1`: once `head` exits, the next print raises BrokenPipeError,
    which ended in a traceback; now the command stops quietly with a shell's SIGPIPE status."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has left before the first line
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "model-info", "--preset", "base"],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        timeout=120,
    )
    os.close(write_end)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr
