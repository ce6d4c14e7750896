"""The benchmarks refuse a bad option value at once, naming the option (exit 2): they raised a
traceback, some after minutes of set-up (`bench_model_step.py --case mini:x`, `bench_pretrain.py
--presets tiny`, `bench_loader_memory.py --ranks 0`), or measured something else (`bench_flow.py
--documents 0` timed the whole corpus and printed "0 documents"; `bench_time_to_quality.py
--budget-s -1` trained)."""

from __future__ import annotations

import sys

import pytest

from common.paths import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))

import bench_finetune  # noqa: E402
import bench_flow  # noqa: E402
import bench_loader_memory  # noqa: E402
import bench_model_step  # noqa: E402
import bench_preprocess  # noqa: E402
import bench_pretrain  # noqa: E402
import bench_time_to_quality  # noqa: E402


@pytest.mark.parametrize(
    "bench, argv",
    [
        (bench_finetune, ["--seeds", "x"]),
        (bench_finetune, ["--tasks", "sst2,cola"]),
        (bench_preprocess, ["--runs", "AA:x"]),
        (bench_preprocess, ["--workers", "0"]),
        (bench_flow, ["--documents", "0"]),
        (bench_loader_memory, ["--ranks", "0"]),
        (bench_loader_memory, ["--dupe-factor", "two"]),
        (bench_model_step, ["--case", "mini:x"]),
        (bench_model_step, ["--case", "mini"]),
        (bench_model_step, ["--case", "huge:8"]),
        (bench_pretrain, ["--presets", "mini,tiny"]),
        (bench_pretrain, ["--steps", "0"]),
        (bench_time_to_quality, ["--preset", "huge"]),
        (bench_time_to_quality, ["--budget-s", "-1"]),
        (bench_time_to_quality, ["--lr", "nan"]),
    ],
)
def test_a_bad_option_value_is_refused_naming_the_option(bench, argv, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        bench.parser().parse_args(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and f"error: argument {argv[0]}: {argv[1]!r} " in err, err
    assert "Traceback" not in err


def test_good_values_and_the_defaults_parse() -> None:
    args = bench_model_step.parser().parse_args(["--case", "mini:32", "--case", "base:8", "--warmup", "0"])
    assert args.case == [("mini", 32), ("base", 8)] and args.warmup == 0
    assert bench_pretrain.parser().parse_args([]).presets == ["mini", "base"]
    assert bench_time_to_quality.parser().parse_args([]).budget_s == 240.0
    assert bench_flow.parser().parse_args(["--documents", "50"]).documents == 50
    assert bench_finetune.parser().parse_args(["--seeds", "1,2"]).seeds == [1, 2]
    assert bench_finetune.parser().parse_args([]).tasks == ["sst2", "mrpc", "stsb"]
    assert bench_preprocess.parser().parse_args(["--runs", "AA+AB:5"]).runs == [(["AA", "AB"], 5)]
    assert bench_preprocess.parser().parse_args([]).runs[0] == (["AA"], 1)


@pytest.mark.parametrize(
    "bench",
    [bench_finetune, bench_flow, bench_loader_memory, bench_model_step, bench_preprocess, bench_pretrain]
    + [bench_time_to_quality],
)
def test_help_says_what_the_benchmark_measures_in_a_whole_sentence(bench) -> None:
    """`bench_loader_memory.py --help` said "Memory of the training examples across the ranks of one
    node: Parquet read per rank vs the" and stopped: its description was the docstring's first line."""
    said = " ".join(bench.parser().format_help().split())
    first_sentence = " ".join(bench.__doc__.split()).split(". ")[0]
    assert first_sentence in said, said


def test_bench_flow_leaves_no_folder_behind_even_when_it_fails(tmp_path, monkeypatch) -> None:
    """bench_flow.py made its corpus, run directories and Prefect home in /tmp/bench_flow_* and left
    them there (16 MB a run, `make bench` included), and on a failure too. Here it fails at once (no
    data root), so no flow runs; its folder is gone all the same."""
    import os
    import tempfile

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # TMPDIR, for this process
    monkeypatch.setenv("BERTFLOW_DATA", str(tmp_path / "no-data"))
    monkeypatch.setenv("PREFECT_HOME", os.environ.get("PREFECT_HOME", str(tmp_path)))  # the bench sets it
    monkeypatch.setattr(sys, "argv", ["bench_flow.py", "--documents", "5"])
    with pytest.raises(FileNotFoundError, match="summaries_en.txt"):
        bench_flow.main()
    assert list((tmp_path / "tmp").iterdir()) == []
