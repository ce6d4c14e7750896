"""Stage 2 on a real distributed engine: Beam's DaskRunner against a dask.distributed cluster of
separate processes (a scheduler and 2 workers, each with its own working and temp directory, no
shared work dir), reading the corpus from and writing the shards to an S3-compatible object store
(moto in server mode), everything on 127.0.0.1 and started and stopped here by pid. The shards
must equal the DirectRunner's on local disk byte for byte.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.errors import UserError
from common.paths import PROJECT_ROOT
from pipelines.stage_preprocess import run_preprocess_stage
from preprocessing.config import PreprocessConfig
from preprocessing.shard_format import read_manifest
from tests.test_preprocess import cli, make_corpus
from training.launch import free_port

pytestmark = pytest.mark.slow

HOST = "127.0.0.1"
BUCKET = "bertflow-test"
S3_CREDENTIALS = [
    "--s3_access_key_id=testing",
    "--s3_secret_access_key=testing",
    "--s3_region_name=us-east-1",
]


def wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection((HOST, port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{what} did not listen on {HOST}:{port} within {timeout}s")


def stop(procs: list[subprocess.Popen]) -> None:
    """Stop the servers this module started, by pid: SIGTERM, then SIGKILL after 20 s."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


def start(cmd: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    """moto's S3 server on loopback, with one empty bucket."""
    root = tmp_path_factory.mktemp("moto")
    port = free_port()
    proc = start([sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)], root, root / "moto.log")
    try:
        wait_for_port(port, proc, "moto server")
        endpoint = f"http://{HOST}:{port}"
        s3_client(endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        stop([proc])


def s3_client(endpoint: str):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    """`dask scheduler` + 2 `dask worker` processes (no nanny: one process each, stopped by pid),
    each worker with its own working directory, --local-directory and TMPDIR."""
    from distributed import Client

    root = tmp_path_factory.mktemp("dask")
    port = free_port()
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    scheduler = start(
        [*dask, "--host", HOST, "--port", str(port), "--no-dashboard"],
        root / "scheduler",
        root / "scheduler.log",
    )
    procs = [scheduler]
    try:
        wait_for_port(port, scheduler, "dask scheduler")
        address = f"tcp://{HOST}:{port}"
        for i in range(2):
            home = root / f"worker{i}"
            (home / "tmp").mkdir(parents=True)
            env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "TMPDIR": str(home / "tmp")}
            env["OMP_NUM_THREADS"] = "1"
            cmd = [sys.executable, "-m", "distributed.cli.dask_worker", address, "--host", HOST,
                   "--nthreads", "1", "--no-nanny", "--no-dashboard", "--name", f"worker{i}",
                   "--local-directory", str(home / "local")]  # fmt: skip
            procs.append(start(cmd, home, root / f"worker{i}.log", env))
        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
            pids = client.run(os.getpid)
        assert sorted(pids.values()) == sorted(p.pid for p in procs[1:])  # our processes, no others
        yield address, root
    finally:
        # The workers are killed, not asked to stop: a worker that ran the Beam job takes 10-40 s
        # (a core's CPU much of it) after SIGTERM and its "End worker" line to exit, its interpreter's
        # final garbage collections going over the heap the job left (gdb: Py_FinalizeEx ->
        # finalize_modules -> gc_collect_main), so `stop` waited out its 20 s for each. They keep
        # nothing this test reads.
        for worker in procs[1:]:
            worker.kill()
        stop(procs[::-1])


def config(inputs: list[str]) -> PreprocessConfig:
    return PreprocessConfig(
        input=inputs, dupe_factor=2, num_shards=3, validation_fraction=0.05, bucket_size_mb=0.29, seed=11
    )


def test_dask_cluster_on_s3_writes_the_directrunner_shards_byte_for_byte(
    s3_endpoint, dask_cluster, tmp_path, data_dir, minilm_dir
):
    from distributed import Client

    address, dask_root = dask_cluster
    corpus = make_corpus(tmp_path, data_dir)
    (corpus / "AC_wiki_07.gz").unlink()
    s3 = s3_client(s3_endpoint)
    for f in sorted(corpus.iterdir()):
        s3.upload_file(str(f), BUCKET, f"corpus/{f.name}")

    local_out = tmp_path / "local"
    local_stats = run_preprocess_stage(config([str(corpus / "*")]), minilm_dir, local_out)

    options = [
        f"--dask_client_address={address}",
        f"--temp_location=s3://{BUCKET}/tmp",
        f"--s3_endpoint_url={s3_endpoint}",
        *S3_CREDENTIALS,
    ]
    cfg = config([f"s3://{BUCKET}/corpus/*"]).model_copy(
        update={"runner": "DaskRunner", "beam_options": options}
    )
    stats = run_preprocess_stage(cfg, minilm_dir, f"s3://{BUCKET}/shards")

    def s3_bytes(key: str) -> bytes:
        return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()

    shards = sorted(p.relative_to(local_out).as_posix() for p in local_out.rglob("*.parquet"))
    assert len(shards) == 4  # 3 train + 1 validation
    for rel in shards:
        assert s3_bytes(f"shards/{rel}") == (local_out / rel).read_bytes(), rel
    # the same manifest but for the input setting (same inputs by relative name and content)
    manifest, local_manifest = json.loads(s3_bytes("shards/manifest.json")), read_manifest(local_out)
    assert manifest["config"].pop("input") == [f"s3://{BUCKET}/corpus/*"]
    local_manifest["config"].pop("input")
    assert manifest == local_manifest
    timing = ("seconds", "mb_per_second", "warnings")  # warnings name each run's own input path
    assert {k: v for k, v in stats.items() if k not in timing} == {
        k: v for k, v in local_stats.items() if k not in timing
    }
    s3_corpus, local_corpus = f"s3://{BUCKET}/corpus", str(corpus)
    assert [w.replace(s3_corpus, local_corpus) for w in stats["warnings"]] == local_stats["warnings"]
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])}
    assert "shards/_COMPLETE.json" in keys
    assert not [k for k in keys if k.startswith("tmp/")]  # the work files under temp_location are gone
    assert not [k for k in keys if "/.tmp-" in k]  # no temp object left behind
    # both workers ran tasks; neither left a work file in its own directories
    with Client(address, timeout=60) as client:
        transitions = client.run(lambda dask_worker: dask_worker.state.transition_counter)
    assert len(transitions) == 2 and all(n > 0 for n in transitions.values()), transitions
    for i in range(2):
        leftovers = [
            p for p in (dask_root / f"worker{i}").rglob("*") if p.suffix in (".arrow", ".parquet", ".json")
        ]
        assert not leftovers, leftovers

    # a rerun finds the finished output on S3 and does nothing
    before = s3.head_object(Bucket=BUCKET, Key=f"shards/{shards[0]}")["LastModified"]
    assert run_preprocess_stage(cfg, minilm_dir, f"s3://{BUCKET}/shards") == stats
    assert s3.head_object(Bucket=BUCKET, Key=f"shards/{shards[0]}")["LastModified"] == before


def test_no_dask_scheduler_at_the_address_is_said_at_once_naming_the_flag(tmp_path, minilm_dir):
    """Nothing listens at --dask_client_address: one line naming the flag and the fix, exit 2, in
    seconds and before the output is made (Dask itself gave a traceback after 30 s)."""
    (tmp_path / "a.txt").write_text("Some text. More text.\n")
    address = f"tcp://{HOST}:{free_port()}"
    started = time.monotonic()
    r = cli(
        "preprocess", str(PROJECT_ROOT / "infra/beam/dask.yaml"), "--input", str(tmp_path / "a.txt"),
        "--vocab", str(minilm_dir), "--output", str(tmp_path / "o"),
        f"--dask_client_address={address}", f"--temp_location={tmp_path / 'tmp'}",
    )  # fmt: skip
    assert time.monotonic() - started < 20
    assert r.returncode == 2, r.stderr
    assert f"no Dask scheduler answers at --dask_client_address={address}" in r.stderr
    assert "Fix: start the scheduler" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists() and not (tmp_path / "tmp").exists()


def test_no_s3_service_at_the_endpoint_is_said_at_once_naming_the_flag(tmp_path, minilm_dir):
    """Nothing listens at --s3_endpoint_url: one line naming the flag and the fix, exit 2, in seconds
    (Beam retried with growing waits, a traceback each, for minutes)."""
    endpoint = f"http://{HOST}:{free_port()}"
    started = time.monotonic()
    r = cli(
        "preprocess", "--input", f"s3://{BUCKET}/corpus/*", "--vocab", str(minilm_dir),
        "--output", f"s3://{BUCKET}/shards", f"--s3_endpoint_url={endpoint}", *S3_CREDENTIALS,
        timeout=60,
    )  # fmt: skip
    assert time.monotonic() - started < 20
    assert r.returncode == 2, r.stderr
    assert f"nothing answers at --s3_endpoint_url={endpoint}" in r.stderr
    assert "Fix: start the S3 service there, or correct --s3_endpoint_url" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_missing_bucket_is_said_before_the_job_naming_the_setting(s3_endpoint, minilm_dir):
    """An output bucket that does not exist: one line naming the setting, the bucket and the fix, exit
    2, nothing written; it was 90 lines of Beam's NoSuchBucket tracebacks from the job's first upload,
    exit 1. A missing input or --temp_location bucket is said the same way (an input one said 'matches
    no file')."""
    endpoint = [f"--s3_endpoint_url={s3_endpoint}", *S3_CREDENTIALS]
    text = b"The first sentence of a document.\nAnd its second one, for the pair.\n"
    s3_client(s3_endpoint).put_object(Bucket=BUCKET, Key="one-doc/a.txt", Body=text)
    r = cli(
        "preprocess", "--input", f"s3://{BUCKET}/one-doc/*", "--vocab", str(minilm_dir),
        "--output", "s3://no-such-bucket/shards", *endpoint, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "bertflow preprocess: error: output s3://no-such-bucket/shards: the bucket 'no-such-bucket' does not "
        f"exist at {s3_endpoint}. Fix: create it (`aws s3 mb s3://no-such-bucket --endpoint-url {s3_endpoint}`) "
        "or name a bucket that exists."
    ), r.stderr
    assert "Traceback" not in r.stderr
    names = {b["Name"] for b in s3_client(s3_endpoint).list_buckets()["Buckets"]}
    assert "no-such-bucket" not in names
    for cfg, temp, said in (
        (
            config(["s3://no-input-bucket/corpus/*"]),
            f"s3://{BUCKET}/tmp",
            "input s3://no-input-bucket/corpus/*",
        ),
        (
            config([f"s3://{BUCKET}/corpus/*"]),
            "s3://no-temp-bucket/tmp",
            "--temp_location s3://no-temp-bucket/tmp",
        ),
    ):
        options = [f"--temp_location={temp}", *endpoint]
        with pytest.raises(UserError, match=re.escape(f"{said}: the bucket")):
            run_preprocess_stage(
                cfg.model_copy(update={"beam_options": options}), minilm_dir, f"s3://{BUCKET}/out"
            )


def test_s3_credentials_only_in_the_drivers_environment_are_warned_about_before_the_job(tmp_path, minilm_dir):
    """AWS_* in the driver's environment reach no Dask worker: said before the job (naming the
    options that do reach them, never the secret), not after minutes of 'Unable to locate
    credentials'. Given as options, nothing is said. (No scheduler runs: the job stops at its check.)"""
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "AKIDSECRETID", "AWS_SECRET_ACCESS_KEY": "s3cr3t-value"}
    args = [
        "preprocess", str(PROJECT_ROOT / "infra/beam/dask.yaml"), "--input", f"s3://{BUCKET}/corpus/*",
        "--vocab", str(minilm_dir), "--output", f"s3://{BUCKET}/shards",
        f"--dask_client_address=tcp://{HOST}:{free_port()}",
    ]  # fmt: skip
    r = cli(*args, env=env)
    assert r.returncode == 2 and "no Dask scheduler answers" in r.stderr, r.stderr
    said = "the S3 credentials are in this machine's environment"
    warning = next(line for line in r.stderr.splitlines() if said in line)
    assert "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY" in warning and "DaskRunner workers" in warning
    assert "--s3_access_key_id=... --s3_secret_access_key=..." in warning
    assert "AKIDSECRETID" not in r.stderr and "s3cr3t-value" not in r.stderr
    r = cli(*args, "--s3_access_key_id=AKIDSECRETID", "--s3_secret_access_key=s3cr3t-value", env=env)
    assert r.returncode == 2 and said not in r.stderr, r.stderr


def test_progress_lines_from_a_work_folder_on_s3(s3_endpoint):
    """On a cluster the work folder is on the object store (--temp_location=s3://...): the driver
    lists it there for the progress lines (they were reported for local folders only)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.preprocess_progress import watch_preprocess
    from preprocessing import storage

    storage.use_options(PipelineOptions([f"--s3_endpoint_url={s3_endpoint}", *S3_CREDENTIALS]))
    work, out = f"s3://{BUCKET}/progress/tmp/bertflow-preprocess-0", f"s3://{BUCKET}/progress/shards"
    lines: list[str] = []
    with watch_preprocess(work, out, n_files=4, n_shards=3, log=lines.append, every=0.05):
        s3 = s3_client(s3_endpoint)
        s3.put_object(Bucket=BUCKET, Key="progress/tmp/bertflow-preprocess-0/stats/read-a.json", Body=b"{}")
        s3.put_object(
            Bucket=BUCKET, Key="progress/tmp/bertflow-preprocess-0/entries/train-00000.json", Body=b"{}"
        )
        deadline = time.monotonic() + 30
        while not any("1/4" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert lines and "1/4 input files tokenized, 1/3 shards written" in lines[-1], lines
