"""`make deploy` + a process worker + `prefect deployment run 'bert-pipeline/default'` against a real
`prefect server start` on loopback; server and worker are stopped by pid. The deployment run makes
the report of a prepared run directory, and its Prefect artifact is checked as a person sees it:
self-contained (images inline, no relative links), and in the server's own UI in headless Chromium
(the images load, the scorecard table is there)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from common.atomic import read_marker
from common.paths import PROJECT_ROOT
from tests.flow_support import fresh_prefect_home

pytestmark = pytest.mark.slow

VENV_BIN = Path(PROJECT_ROOT) / ".venv" / "bin"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM the process group started for `proc`, then SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"prefect server exited early:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    pytest.fail(f"prefect server did not become healthy in {timeout} s:\n{log.read_text()[-3000:]}")


def _report_artifact(api: str) -> dict:
    request = urllib.request.Request(
        f"{api}/artifacts/filter",
        data=json.dumps({"artifacts": {"key": {"any_": ["bert-report-default"]}}, "limit": 5}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        found = json.load(resp)
    assert len(found) == 1, found
    return found[0]


def _check_artifact_in_the_ui(url: str, tmp_path: Path) -> None:
    from tests.browser import Browser, chromium_path

    if chromium_path() is None:  # the API check above still ran
        return
    browser = Browser(tmp_path / "chromium-profile", width=1400)
    try:
        browser.open(url, "document.querySelectorAll('table').length > 3", timeout=120)
        images = browser.images()
        assert len(images) == 4 and all(i["loaded"] and i["width"] > 300 for i in images), images
        assert browser.evaluate("document.body.innerText.includes('GLUE avg')")
        browser.screenshot(tmp_path / "prefect-artifact.png", height=4200)
    finally:
        browser.close()


def test_deploy_and_run_on_a_local_server_and_worker(
    tmp_path: Path, data_dir: Path, minilm_dir: Path
) -> None:
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(fresh_prefect_home(tmp_path / "prefect-home")),
        "PREFECT_API_URL": api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PYTHONPATH": str(PROJECT_ROOT),
        "COLUMNS": "200",
    }
    server_log, worker_log = tmp_path / "server.log", tmp_path / "worker.log"
    server = subprocess.Popen(
        [str(VENV_BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env={**{k: v for k, v in env.items() if k != "PREFECT_API_URL"}, "PREFECT_UI_API_URL": api},
        stdout=server_log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    worker = None
    try:
        _wait_healthy(api, server, server_log)
        deploy = subprocess.run(
            ["make", "-o", "install", "deploy"],  # -o install: never (re)install from a test
            cwd=PROJECT_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert deploy.returncode == 0, deploy.stdout + deploy.stderr
        assert "bert-pipeline/default" in deploy.stdout

        worker = subprocess.Popen(
            [str(VENV_BIN / "prefect"), "worker", "start", "--pool", "bertflow-process"],
            cwd=tmp_path,
            env=env,
            stdout=worker_log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        # a run directory whose stages are complete, as a flow run leaves it: the deployment's
        # flow run makes its report (the stage that publishes the artifact)
        run_dir = tmp_path / "run"
        overrides = [f"run_dir={run_dir}", "finetune.tasks=[rte]"]
        from pipelines.config import load_config
        from tests.report_fixtures import make_stage_outputs

        make_stage_outputs(
            load_config(PROJECT_ROOT / "configs" / "default.yaml", overrides), minilm_dir, data_dir
        )
        trigger = subprocess.run(
            [
                str(VENV_BIN / "prefect"),
                "deployment",
                "run",
                "bert-pipeline/default",
                "-p",
                "only=report",
                "-p",
                "overrides=" + json.dumps(overrides),
                "--watch",
                "--watch-timeout",
                "300",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=360,
        )
        out = trigger.stdout + trigger.stderr
        assert trigger.returncode == 0 and "Completed" in out, out + worker_log.read_text()[-3000:]
        # the worker ran the flow from the project checkout, with our parameters
        report_dirs = list((run_dir / "report").iterdir())
        assert len(report_dirs) == 1 and read_marker(report_dirs[0]) is not None
        record = json.loads(next((run_dir / "flow_runs").glob("*.json")).read_text())
        assert [s["stage"] for s in record["stages"]] == ["report"]
        # the artifact is the whole report, self-contained: a UI page has no files next to it
        artifact = _report_artifact(api)
        text = artifact["data"]
        assert text.startswith("# ") and "## Result" in text and "GLUE avg" in text
        targets = re.findall(r"\]\(([^)]*)\)", text)
        assert len(targets) == 4 and all(t.startswith("data:image/png;base64,") for t in targets)
        _check_artifact_in_the_ui(f"http://127.0.0.1:{port}/artifacts/artifact/{artifact['id']}", tmp_path)
    finally:
        if worker is not None:
            _stop(worker)
        _stop(server)
    assert server.poll() is not None and (worker is None or worker.poll() is not None)


def test_the_image_and_the_slurm_script_set_only_variables_that_take_effect() -> None:
    """Each BERTFLOW_* variable the image sets is one the code reads (BERTFLOW_HOME was read by
    nothing), and the Slurm script sets NCCL's async error handling under the name torch reads since
    2.2 (TORCH_NCCL_ASYNC_ERROR_HANDLING; NCCL_ASYNC_ERROR_HANDLING is deprecated)."""
    dockerfile = (PROJECT_ROOT / "infra" / "docker" / "Dockerfile").read_text()
    set_in_image = set(re.findall(r"\b(BERTFLOW_\w+)=", dockerfile))
    packages = ("common", "model", "preprocessing", "training", "finetuning", "pipelines")
    code = "\n".join(p.read_text() for d in packages for p in (PROJECT_ROOT / d).rglob("*.py"))
    assert set_in_image and not [name for name in sorted(set_in_image) if f'"{name}"' not in code]
    sbatch = (PROJECT_ROOT / "infra" / "slurm" / "pretrain.sbatch").read_text()
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in sbatch
    assert not re.search(r"(?<!TORCH_)NCCL_ASYNC_ERROR_HANDLING", sbatch)
