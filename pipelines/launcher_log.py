"""The pretraining launcher's output, sorted for a person reading the log.

Every line the ranks print is kept, in order, in OUT/launcher.log. On the console and in the
Prefect task log, the lines about the run (steps, evaluations, checkpoints, errors) are shown at
INFO; what DeepSpeed and torch say about themselves on every run (`[WARNING] ... Setting
accelerator to CPU`, `FutureWarning: ... is deprecated` and the source line Python prints under
it, progress bars of internal loading) goes to DEBUG, and so does torchrun's report of a failed
rank once that rank has printed its own `rank R: error: ...` line (which the command reports), the
same error printed by another rank, and torchrun's own lines once it was told to stop (the ranks'
last lines stay at INFO).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from training.launch import ERROR_LINE, explained_failure

# `[2026-11-22 21:30:26,607] [WARNING] [real_accelerator.py:213:get_accelerator] ...`
DEEPSPEED_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,.]+\] \[(DEBUG|INFO|WARNING|ERROR|CRITICAL)\] ")
# `/path/c10d_logger.py:83: FutureWarning: ...` (Python's warnings module)
PYTHON_WARNING = re.compile(r"^\S+:\d+: [A-Za-z]*Warning: ")
# torchrun's report that a rank failed (`E1122 23:55:37.607000 PID .../api.py:1002] failed (exitcode:
# 2) local_rank: 0 ...`, then its own traceback and a summary): after a rank has printed its
# `rank R: error: ...` line, which the command reports, the rest of that output is self-talk
TORCHRUN_FAILED = re.compile(r"^E\d{4} .*\] failed \(exitcode: ")
# torchrun told to stop (SIGTERM or Ctrl-C reached it: `W1125 10:14:17.386000 PID .../api.py:753]
# Received 15 death signal, shutting down workers`): its own lines from then on (glog lines, the
# traceback of its SignalException) are self-talk, while the ranks save the step they reached and
# say so (training/stop_request.py). Searched anywhere in a line: a rank's progress line cut off by
# the signal has no newline, so torchrun's warning can follow it on the same line.
TORCHRUN_STOPPING = re.compile(r"[WI]\d{4} .*\] Received \d+ death signal")
TORCHRUN_TALK = re.compile(
    r"^([WEI]\d{4} \d\d:|Traceback \(most recent call last\):|\s|torch\.distributed\.elastic\.)"
)
# lines that chain one traceback to the next
CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
SELF_TALK = ("built successfully", "Loading checkpoint shards", "Loading extension module")


class LauncherLog:
    """A `log_line` callable: raw copy to `raw_path`, then INFO or DEBUG (`debug=None` drops)."""

    def __init__(
        self, info: Callable[[str], None], debug: Callable[[str], None] | None, raw_path: Path
    ) -> None:
        self.info, self.debug = info, debug
        raw_path.parent.mkdir(parents=True, exist_ok=True)
        self.raw = open(raw_path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (closed by close())
        self._in_warning = False
        self._rank_error = False  # a rank printed `rank R: error: ...`
        self._errors_shown: set[str] = set()  # the text of each such error, shown once
        self._failure_report = False  # torchrun is reporting that failure
        self._stopping = False  # torchrun got a stop signal
        self._traceback: list[str] = []  # a traceback's lines (chained ones too) until its exception line
        self._exception_seen = False  # the held traceback's exception line came (a chained one may follow)

    def is_self_talk(self, line: str) -> bool:
        if error := ERROR_LINE.search(line):
            self._rank_error = True
            if error.group(1) in self._errors_shown:
                return True  # every rank saw the same (a NaN loss is all-reduced): said once
            self._errors_shown.add(error.group(1))
        self._failure_report = self._failure_report or (
            self._rank_error and bool(TORCHRUN_FAILED.match(line))
        )
        if self._failure_report:
            return True
        self._stopping = self._stopping or bool(TORCHRUN_STOPPING.search(line))
        if self._stopping and TORCHRUN_TALK.match(line):
            return True
        if self._in_warning and line.startswith((" ", "\t")):
            return True  # the source line Python prints under a warning
        self._in_warning = bool(PYTHON_WARNING.match(line))
        if self._in_warning:
            return True
        m = DEEPSPEED_LINE.match(line)
        if m:
            return m.group(1) not in ("ERROR", "CRITICAL")
        return "\r" in line or any(s in line for s in SELF_TALK)

    def __call__(self, line: str) -> None:
        self.raw.write(line + "\n")
        if not line.strip():
            return
        if self._traceback and (self._exception_seen and not line.startswith(CHAINED)):
            self._flush_traceback()  # its last exception line came: shown (or not) as a whole
        if line.startswith("Traceback (most recent call last)") or self._traceback:
            self._traceback.append(line)  # held until its exception line says what it was
            self._exception_seen = not (line[0].isspace() or line.startswith(("Traceback", *CHAINED)))
            return
        self._show(line)

    def _flush_traceback(self) -> None:
        block, self._traceback, self._exception_seen = self._traceback, [], False
        quiet = any(explained_failure(held) is not None for held in block)  # bertflow's own error says it
        for held in block:
            self._show(held, quiet=quiet)

    def _show(self, line: str, quiet: bool = False) -> None:
        if quiet or self.is_self_talk(line):
            if self.debug is not None:
                self.debug(line)
        else:
            self.info(line)

    def close(self) -> None:
        self._flush_traceback()  # one that ended the output
        self.raw.close()
