"""A real browser for the tests: headless Chromium (Debian's `chromium`, installed by the Makefile's
dev setup) driven over the DevTools protocol, to check what a person sees: that images load, that
tables render, and to take full-page screenshots. Tests that need it skip where it is absent.

Chromium runs with a fresh profile and every background service off, as a closed network would
otherwise make it wait on them; it is stopped by pid when the test ends.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def require_chromium() -> str:
    path = chromium_path()
    if path is None:
        pytest.skip("chromium is not installed (make install-browser, or apt-get install chromium)")
    return path


class Browser:
    def __init__(self, profile: Path, width: int = 1200, height: int = 900, timeout: float = 60.0) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        (profile / "DevToolsActivePort").unlink(missing_ok=True)  # a previous browser's port
        self.width, self.timeout = width, timeout
        self.proc = subprocess.Popen(
            [
                require_chromium(),
                *FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.ws = None
        self._id = 0
        try:
            port = self._devtools_port(profile / "DevToolsActivePort")
            page = self._page_target(port)
            from websockets.sync.client import connect

            self.ws = connect(page["webSocketDebuggerUrl"], max_size=64 * 2**20, open_timeout=timeout)
            self.call("Page.enable")
            self.call("Runtime.enable")
        except BaseException:
            self.close()
            raise

    def _devtools_port(self, path: Path) -> int:
        deadline = time.time() + self.timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with code {self.proc.returncode}")
            if path.is_file() and path.read_text().strip():
                return int(path.read_text().split()[0])
            time.sleep(0.2)
        raise TimeoutError("chromium did not open its DevTools port")

    def _page_target(self, port: int) -> dict[str, Any]:
        deadline = time.time() + self.timeout
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as resp:
                    pages = [t for t in json.load(resp) if t.get("type") == "page"]
            except OSError:  # not listening yet
                pages = []
            if pages:
                return pages[0]
            time.sleep(0.2)
        raise TimeoutError("chromium has no page target")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; events that arrive meanwhile are dropped."""
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        deadline = time.time() + self.timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.time())))
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url: str, ready: str = "true", timeout: float | None = None) -> None:
        """Load `url` and wait until the document is complete and the JS expression `ready` holds."""
        self.call("Page.navigate", url=url)
        deadline = time.time() + (timeout or self.timeout)
        check = f"document.readyState === 'complete' && Boolean({ready})"
        while time.time() < deadline:
            try:
                if self.evaluate(check):
                    return
            except RuntimeError:  # the page is between documents
                pass
            time.sleep(0.25)
        raise TimeoutError(f"{url}: not ready ({ready}) in time")

    def images(self) -> list[dict[str, Any]]:
        """Every <img> of the page: its source (data URIs shortened), whether it loaded, its size."""
        return self.evaluate(
            "Array.from(document.images).map(i => ({src: i.src.slice(0, 120), "
            "loaded: i.complete && i.naturalWidth > 0, width: i.naturalWidth, height: i.naturalHeight}))"
        )

    def screenshot(self, path: Path, height: int | None = None) -> Path:
        """The whole page, top to bottom, as a PNG (`height`: for apps that scroll inside a pane)."""
        height = height or int(self.evaluate("Math.ceil(document.documentElement.scrollHeight)"))
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=self.width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        if self.ws is not None:
            self.ws.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
