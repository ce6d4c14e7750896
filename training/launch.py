"""Start the per-rank script under the DeepSpeed launcher (or torchrun) and stream its output.

One node (default, `launcher: auto`): `python -m torch.distributed.run --nproc_per_node N -m
training.train --spec ...` (it starts faster than DeepSpeed's launcher, which imports DeepSpeed
twice before the ranks do); `launcher: deepspeed` gives `python -m deepspeed.launcher.runner
--num_gpus N --module training.train ...` (on a CPU-only machine DeepSpeed's CPU accelerator starts
N gloo processes). Multi-node: one torchrun per node (`pretrain.nnodes`, `--node-rank R` on each node, static
rendezvous at `pretrain.master_addr:master_port`: what `bertflow pretrain --node-rank R` starts and
infra/slurm/ runs), or DeepSpeed's launcher with `--hostfile` (see infra/hostfile.example; the
runner reaches the other nodes through pdsh and starts the same command there, so the project and
data must be at the same path on every node).
Both launchers stop every local rank as soon as one exits with an error.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from common.child_process import die_with_parent, start_time, stat_fields
from common.errors import TransientError, UserError, stop_request
from common.paths import PROJECT_ROOT, check_input_file, torch_extensions_dir
from common.temp_dir import named_temp_dir
from common.textfile import read_user_text
from training.lost_ranks import LOST_PREFIX
from training.stop_request import LAUNCHER_DIED

if TYPE_CHECKING:
    from training.config import PretrainConfig

ERROR_LINE = re.compile(r"rank \S+: error: (.*)")
# the last line of a Python traceback: what a failure without a rank's own error says
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt): \S")
# torch's TCPStore when nodes did not all come: "Timed out after 601 seconds waiting for clients. 1/2 clients joined."
NODES_JOINED = re.compile(r"Timed out after (\d+) seconds waiting for clients\. (\d+)/(\d+) clients joined")
# a rank ended by a signal, as torchrun reports it: "failed (exitcode: -9) local_rank: 0 (pid: 1918) of binary"
KILLED_RANK = re.compile(r"failed \(exitcode: -(\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
# DeepSpeed's launcher when it cannot ssh to the hostfile's first host
SSH_UNREACHABLE = re.compile(r"Using hostfile at \S+ but host=(\S+) was not reachable via ssh")


def explained_failure(line: str) -> tuple[str, str] | None:
    """The launcher's (not a rank's) failure that `line` says and `launch_failure` turns into its own
    message: ("no_ssh", the host) or ("missing_nodes", how many came); None for any other line. Such
    a line ends a traceback, which then stays in launcher.log (`pipelines.launcher_log`)."""
    if unreachable := SSH_UNREACHABLE.search(line):
        return "no_ssh", unreachable.group(1)
    if joined := NODES_JOINED.search(line):
        seconds, came, nodes = joined.groups()
        return "missing_nodes", f"only {came} of {nodes} nodes joined in {seconds} s"
    return None


def killed_rank(line: str) -> str | None:
    """What `line` says if it reports a rank ended by a signal (no line of its own: kill -9, the
    kernel's OOM killer), in a user's words; None for any other line."""
    if not (m := KILLED_RANK.search(line)):
        return None
    signum, local_rank, pid = (int(g) for g in m.groups())
    name = signal.Signals(signum).name if signum in signal.valid_signals() else f"signal {signum}"
    oom = " (the kernel's OOM killer does that when memory runs out: `dmesg` then says 'Killed process')"
    return f"local rank {local_rank} (pid {pid}) was killed by {name}" + (oom if name == "SIGKILL" else "")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port_free(port: int) -> None:
    """pretrain.master_port on node 0, before any rank starts: a port another program listens on
    failed the launch with a 38-line torch traceback ending EADDRINUSE, which a flow then retried."""
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError as exc:
            raise UserError(
                f"pretrain.master_port {port} is in use on this machine ({exc.strerror}): node 0's ranks "
                "listen there to meet each other.",
                fix="set pretrain.master_port to a free port (the same on every node), or leave it unset "
                "in a one-node run (a free one is then chosen).",
            ) from None


def hostfile_slots(path: Path) -> int:
    """Total slots in a DeepSpeed hostfile (`host slots=N` per line, # comments)."""
    check_input_file(path, "hostfile", fix="see infra/hostfile.example.")
    total = 0
    for n, line in enumerate(read_user_text(path, "hostfile").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"\S+\s+slots=(\d+)", line)
        if not m:
            raise UserError(
                f"{path}:{n}: expected 'HOSTNAME slots=N', got {line!r}.", fix="see infra/hostfile.example."
            )
        total += int(m.group(1))
    if total == 0:
        raise UserError(f"hostfile {path} lists no hosts.", fix="see infra/hostfile.example.")
    return total


def world_size(pretrain: PretrainConfig) -> int:
    """Ranks in the run: the hostfile's slots, else pretrain.num_processes x pretrain.nnodes."""
    if pretrain.hostfile:
        return hostfile_slots(Path(pretrain.hostfile))
    return pretrain.num_processes * pretrain.nnodes


def local_ranks(pretrain: PretrainConfig, world: int) -> int:
    """This node's ranks: `num_processes` on each node of a multi-node run, else the whole world."""
    return pretrain.num_processes if pretrain.nnodes > 1 else world


def build_command(
    launcher: str,
    num_processes: int,
    spec_path: Path,
    port: int,
    hostfile: str | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    join_timeout_s: float | None = None,
) -> list[str]:
    """`num_processes` ranks on this node (with a hostfile: in all); the settings are checked
    (`pipelines.stage_pretrain.check_nodes`). Nodes wait `join_timeout_s` for each other (torchrun's
    static rendezvous, else its 600 s)."""
    py = sys.executable
    if launcher == "auto":
        launcher = "deepspeed" if hostfile else "torchrun"
    script = ["training.train", "--spec", str(spec_path)]
    if launcher == "torchrun":
        nodes = []
        if nnodes > 1:  # static rendezvous: node ranks are given, global rank = node rank x N + local rank
            nodes = [f"--nnodes={nnodes}", f"--node_rank={node_rank}", f"--master_addr={master_addr}"]
            if join_timeout_s is not None:
                nodes.append(f"--rdzv_conf=timeout={int(join_timeout_s)}")
        return [py, "-m", "torch.distributed.run", f"--nproc_per_node={num_processes}", *nodes,
                f"--master_port={port}", "--max_restarts=0", "-m", *script]  # fmt: skip
    cmd = [py, "-m", "deepspeed.launcher.runner", f"--master_port={port}"]
    if hostfile:
        cmd += ["--hostfile", hostfile]
    else:
        cmd += ["--num_gpus", str(num_processes)]
    return [*cmd, "--module", *script]


def child_env(num_processes: int, on_gpu: bool, stop_grace_s: float) -> dict[str, str]:
    env = dict(os.environ)
    # torchrun's wait between passing a SIGTERM on to the ranks and SIGKILL (its default is 30 s);
    # DeepSpeed's launcher always waits 30 s
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(int(stop_grace_s))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["TORCH_EXTENSIONS_DIR"] = str(torch_extensions_dir())
    # rank 0 starts a W&B service of its own: through the one of the process that launched it (the
    # flow's, whose token W&B leaves here), a kill -9 of bertflow took the pretraining's W&B run with
    # it (a 7-byte file), while the ranks went on to save their step
    env.pop("WANDB_SERVICE", None)
    if not on_gpu:
        env.setdefault("OMP_NUM_THREADS", str(cpu_threads_per_rank(num_processes)))
    return env


def cpu_threads_per_rank(local_ranks: int) -> int:
    """The torch threads of each CPU rank: OMP_NUM_THREADS where the user set a number, else one
    core share (N ranks each spawning all-core thread pools thrash). torch's float sums depend on
    it, so a checkpoint records it and a resume under another count says so."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, (os.cpu_count() or 1) // local_ranks)


def run_launcher(
    cmd: list[str], env: dict[str, str], log_line: Callable[[str], None], stop_grace_s: float
) -> None:
    """Run the launcher, forwarding every output line; a failed run raises with the ranks' error.
    Interrupted (Ctrl-C, SIGTERM), it stops the ranks with `_stop_group` and raises. The launcher
    and its ranks get a temp directory of their own (`TMPDIR`), removed when it ends: torchrun's
    `torchelastic_*` log tree and the folders W&B's modules make at import were left in /tmp by
    every run. Those of launches whose bertflow was killed (kill -9: nothing removed them) go at the
    next launch, an hour on (`common.temp_dir.named_temp_dir`)."""
    with named_temp_dir(LAUNCH_TMP) as tmp:
        _run_launcher(cmd, _with_own_tmp(env, str(tmp)), log_line, stop_grace_s)


LAUNCH_TMP = "bertflow-launch-"  # + the launching bertflow's pid, "-", a random part


def _with_own_tmp(env: dict[str, str], tmp: str) -> dict[str, str]:
    """`env` with TMPDIR `tmp`, and torch's compile cache kept where it was (torch puts it under the
    temp directory unless told: a warm cache must outlive the run)."""
    cache = env.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"torchinductor_{_user()}"
    )  # torch._inductor.runtime.cache_dir_utils.default_cache_dir, without importing torch here
    return {**env, "TMPDIR": tmp, "TORCHINDUCTOR_CACHE_DIR": cache}


def _user() -> str:
    import getpass

    try:
        return re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    except (KeyError, ModuleNotFoundError, OSError):
        return f"uid_{os.getuid()}"


def _run_launcher(
    cmd: list[str], env: dict[str, str], log_line: Callable[[str], None], stop_grace_s: float
) -> None:
    log_line("launch: " + " ".join(cmd))
    proc = subprocess.Popen(
        cmd,
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,
        preexec_fn=die_with_parent,  # the launcher passes SIGTERM on to the ranks
    )
    errors: list[str] = []
    # no_ssh: hosts DeepSpeed's launcher could not reach; missing_nodes: torchrun's static
    # rendezvous timed out (`explained_failure`)
    explained: dict[str, list[str]] = {"no_ssh": [], "missing_nodes": []}
    raised: list[str] = []  # the launcher's or a rank's last exception line, for a failure not explained
    killed: list[str] = []  # ranks ended by a signal, which say nothing themselves
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            m = ERROR_LINE.search(line)
            if m and m.group(1) not in errors:
                errors.append(m.group(1))
            if failure := explained_failure(line):
                explained[failure[0]].append(failure[1])
            if EXCEPTION_LINE.match(line):
                raised.append(line)
            if what := killed_rank(line):
                killed.append(what)
            log_line(line)
        rc = proc.wait()
    except BaseException as exc:
        _stop_group(proc, log_line, stop_grace_s, stop_reason(exc))
        raise
    if rc != 0:
        raise launch_failure(rc, errors, explained["no_ssh"], explained["missing_nodes"], raised, killed)


def launch_failure(
    rc: int,
    errors: list[str],
    no_ssh: list[str],
    missing_nodes: list[str],
    raised: list[str],
    killed: Sequence[str] = (),
) -> Exception:
    """What a failed launch raises: the ranks' own errors (UserError), else their lost contact with
    each other, after the ranks `killed` by a signal, or their stop after their launcher died
    (TransientError), a hostfile host without ssh, nodes that did not all join, or (a bug, or a
    crash without a message) the exit code with the last exception line printed."""
    # a rank's own error is the cause; the others then lost contact with it. Ranks whose launcher
    # died (kill -9, the OOM killer) stopped and saved: the machine's failure, which a flow retries
    if causes := [e for e in errors if not e.startswith((LOST_PREFIX, LAUNCHER_DIED))]:
        return UserError("pretraining stopped: " + " | ".join(causes))
    if errors:  # the others lost contact; first who was killed, if one was
        return TransientError("pretraining stopped: " + " | ".join([*killed, *errors]))
    if killed:
        return TransientError(
            "pretraining stopped: " + " | ".join(killed) + ".",
            fix="rerun the same command to resume from the newest checkpoint in OUT/checkpoints.",
        )
    if no_ssh:
        return UserError(
            f"pretrain.hostfile names host {no_ssh[0]}, which this machine cannot reach by ssh without a "
            "password: DeepSpeed's launcher starts every host's ranks over ssh.",
            fix=f"make `ssh {no_ssh[0]} true` work without a prompt from here (keys, known_hosts) for every "
            "host of the hostfile; or drop pretrain.hostfile and start one `bertflow pretrain --nnodes N "
            "--node-rank R` on each node (torchrun, no ssh).",
        )
    if missing_nodes:
        return TransientError(
            f"pretraining did not start: {missing_nodes[-1]} (the nodes wait pretrain.dist_timeout_s for each other).",
            fix="start the same command on every node, each with its --node-rank (0 .. nnodes-1) and the "
            "same pretrain.master_addr and master_port, within that time of each other.",
        )
    said = f": {raised[-1][:500]}" if raised else ""
    return RuntimeError(
        f"pretraining failed (launcher exit code {rc}){said}; the whole output is in the pretraining "
        "output's launcher.log."
    )


def stop_reason(exc: BaseException) -> str:
    """What stopped the run, as the user did it: the ranks see only the SIGTERM passed on to them."""
    return stop_request(exc) or f"{type(exc).__name__} in bertflow"


def _stop_group(
    proc: subprocess.Popen, log_line: Callable[[str], None], grace_s: float, reason: str = "a stop request"
) -> None:
    """SIGTERM to the launcher and its ranks, which save the step they reached and exit
    (training/stop_request.py); their last lines are still logged, after one naming `reason`. SIGKILL after `grace_s`, or at
    once when a second Ctrl-C or SIGTERM arrives meanwhile (which is then raised), to the launcher's
    group and to every process below it: torchrun starts each rank in a session of its own."""
    ranks = process_tree(proc.pid)  # now, while the launcher is their parent
    log_line = _without_console_errors(log_line)  # the console's lost reader may be what stops the run
    drain = threading.Thread(target=_forward_lines, args=(proc, log_line), daemon=True)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        log_line(
            f"pretrain: stopping ({reason}); the ranks save the step they reached (up to {grace_s:g} s, "
            "pretrain.stop_grace_s; interrupt again to kill them now)"
        )
        drain.start()
        proc.wait(timeout=grace_s)
        drain.join(timeout=5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        _kill_group(proc, ranks)
    except BaseException:
        _kill_group(proc, ranks)
        raise


def _without_console_errors(log_line: Callable[[str], None]) -> Callable[[str], None]:
    """`log_line` that lets an OSError pass (a pipe whose reader left, a hung-up terminal): during a
    stop, such an error from a line is no second interrupt; it killed the ranks before they saved."""

    def say(line: str) -> None:
        try:
            log_line(line)
        except OSError:
            pass

    return say


def _kill_group(proc: subprocess.Popen, known: dict[int, int]) -> None:
    """SIGKILL to the launcher's group and to each process below it, those found now and the
    `known` ones found before (pid: start time; a pid reused since by another process is spared)."""
    below = {**known, **process_tree(proc.pid)}
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid, started in below.items():
        if start_time(pid) == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def process_tree(root: int) -> dict[int, int]:
    """pid: start time of every process below `root`, from /proc (Linux; {} elsewhere)."""
    children: dict[int, list[tuple[int, int]]] = {}  # ppid: [(pid, start time)]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        if fields := stat_fields(stat):
            children.setdefault(int(fields[1]), []).append((int(stat.parent.name), int(fields[19])))
    found, todo = {}, [root]
    while todo:
        for child, started in children.get(todo.pop(), []):
            found[child] = started
            todo.append(child)
    return found


def _forward_lines(proc: subprocess.Popen, log_line: Callable[[str], None]) -> None:
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            log_line(line.rstrip("\n"))
    except (OSError, ValueError):  # the pipe closed under us
        pass


# DeepSpeed's CPU inference all-reduce (its shm op): one buffer per rank in shared memory, named
# deepspeed_allreduce_buffer_<uid>_<master addr>_<port>_<rank>. Our ranks leave the op out since
# 2026-11-28 (training.build_ops.leave_out_cpu_inference_op); runs before that, and other DeepSpeed
# programs of the user, still leave such buffers behind when killed.
SHM_DIR = Path("/dev/shm")
SHM_BUFFER = "deepspeed_allreduce_buffer"
STALE_AFTER_S = 60.0  # a buffer no process maps, older than this, belongs to a run that is over


def remove_stale_shm_buffers(shm_dir: Path = SHM_DIR, stale_after_s: float = STALE_AFTER_S) -> int:
    """Remove this user's DeepSpeed shared-memory buffers that no process maps any more; returns
    their bytes. Each CPU rank holds a 67 MB buffer there (RAM, not disk), which DeepSpeed unlinks
    only at a clean exit: every killed run left its ranks' buffers behind (20 GB after a day of
    tests here), and a later run on the same port could open a dead rank's buffer as its peer's."""
    mine = list(shm_dir.glob(f"{SHM_BUFFER}_{os.getuid()}_*"))
    if not mine:
        return 0
    mapped, now, freed = _mapped_names(), time.time(), 0
    for path in mine:
        try:
            stat = path.stat()
            if path.name not in mapped and now - stat.st_mtime > stale_after_s:
                path.unlink()
                freed += stat.st_size
        except OSError:  # gone meanwhile, or not ours to remove
            continue
    return freed


def _mapped_names() -> set[str]:
    """The names of the shared-memory files that some process (one this user may inspect) maps."""
    names: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if SHM_BUFFER in line:
                names.add(Path(line.split(maxsplit=5)[-1].removesuffix(" (deleted)")).name)
    return names
