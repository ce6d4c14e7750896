"""The GPU check's summary: one JSON document (and its Markdown rendering) that every part appends to.

Layout of `gpu_check.json`:
  schema, dry_run, device (the GPU's name, or the CPU's in a dry run)
  calls         one entry per device call: parts asked for, start and end time, host, env (versions,
                the measured bf16 matmul ceiling)
  parts         per part: status (ok / failed / timeout / skipped), seconds, error, call
  measurements  one row per throughput measurement, each with at least MEASUREMENT_KEYS
  probes        per probe (ops, sdpa_kernels, attention_paths, compile, micro_batch_*, fp16, finetune)
  not_run       what the check does not run, and why
Several calls' files are joined with `merge` (`gpu_check.py --merge`).
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

from common.atomic import atomic_write_json, atomic_write_text
from common.jsonfile import read_json_object

SCHEMA = 1
MEASUREMENT_KEYS = (
    "device",
    "preset",
    "seq",
    "precision",
    "tokens_per_s",
    "samples_per_s",
    "tflops",
    "mfu_spec",
)
NOT_RUN = {
    "flow": "the whole Prefect flow: prefect and apache-beam (and their dependencies) are not on the GPU "
    "image and are not carried; the check runs the pretraining stage and one fine-tuning unit instead",
}


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def new_summary(dry_run: bool, parts: list[str]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "dry_run": dry_run,
        "device": None,
        "calls": [{"parts": parts, "started": now_iso(), "finished": None, "env": None}],
        "parts": {},
        "measurements": [],
        "probes": {},
        "not_run": dict(NOT_RUN),
    }


def add_part(summary: dict[str, Any], name: str, outcome: dict[str, Any], result: dict[str, Any]) -> None:
    """Record one part: its outcome (status, seconds, error) and what it measured."""
    call = len(summary["calls"]) - 1
    failed = failed_rows(result)
    if outcome.get("status") == "ok" and failed:  # the process ended well, but what it measured did not
        outcome = {**outcome, "status": "failed", "error": f"failed inside the part: {', '.join(failed)}"}
    summary["parts"][name] = {**outcome, "call": call}
    if result.get("env"):
        summary["calls"][call]["env"] = result["env"]
    if result.get("device") and not summary.get("device"):
        summary["device"] = result["device"]
    for row in result.get("measurements", []):
        summary["measurements"].append({**{k: None for k in MEASUREMENT_KEYS}, **row, "call": call})
    for key, probe in result.get("probes", {}).items():
        summary["probes"][key] = {**probe, "call": call}


def failed_rows(result: dict[str, Any]) -> list[str]:
    """The measurements and probes of one part's result that record a failure or an error."""
    rows = [(m.get("name", "?"), m) for m in result.get("measurements", [])]
    rows += list(result.get("probes", {}).items())
    return [str(key) for key, row in rows if row.get("status") not in (None, "ok") or row.get("error")]


def load(path: str | Path) -> dict[str, Any]:
    return read_json_object(Path(path), "GPU check summary")


def merge(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Join the summaries of several device calls (in call order) into one."""
    out = new_summary(any(s.get("dry_run") for s in summaries), [])
    out["calls"] = []
    devices = sorted({s["device"] for s in summaries if s.get("device")})
    out["device"] = devices[0] if len(devices) == 1 else " / ".join(devices) or None
    for s in summaries:
        offset = len(out["calls"])
        out["calls"].extend(s.get("calls", []))
        for name, part in s.get("parts", {}).items():
            if name in out["parts"] and part.get("status") != "ok":
                continue  # a part that ran in an earlier call is not undone by a later skip
            out["parts"][name] = {**part, "call": part.get("call", 0) + offset}
        for row in s.get("measurements", []):
            out["measurements"].append({**row, "call": row.get("call", 0) + offset})
        for key, probe in s.get("probes", {}).items():
            out["probes"][key] = {**probe, "call": probe.get("call", 0) + offset}
        out["not_run"].update(s.get("not_run", {}))
    return out


def write(summary: dict[str, Any], out_dir: str | Path, stem: str = "gpu_check") -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    atomic_write_json(json_path, summary)
    atomic_write_text(md_path, render_markdown(summary))
    return json_path, md_path


def default_stem(summary: dict[str, Any]) -> str:
    """`<date>-<gpu>` from the first call's start and the device name, e.g. 2026-12-01-nvidia-h100-80gb-hbm3."""
    started = (summary.get("calls") or [{}])[0].get("started") or now_iso()
    slug = re.sub(r"[^a-z0-9]+", "-", (summary.get("device") or "unknown").lower()).strip("-")
    return f"{started[:10]}-{slug}"


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if 0 < abs(value) < 1:
            return f"{value:.3g}"
        return f"{value:.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _pct(value: Any) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def render_markdown(summary: dict[str, Any]) -> str:
    lines = [f"# GPU check: {summary.get('device') or 'unknown device'}", ""]
    if summary.get("dry_run"):
        lines += [
            "**Dry run on CPU (tiny shapes, fp32): these figures say the script works, nothing about a GPU.**",
            "",
        ]
    for i, call in enumerate(summary.get("calls", [])):
        env = call.get("env") or {}
        versions = ", ".join(
            f"{k} {env[k]}"
            for k in ("torch", "cuda", "nvcc", "deepspeed", "transformers", "driver")
            if env.get(k)
        )
        ceiling = env.get("matmul_tflops")
        lines.append(
            f"- call {i}: parts {', '.join(call.get('parts') or [])}; {call.get('started')} → {call.get('finished')}; "
            f"{versions or 'no env recorded'}"
            + (f"; {env.get('matmul_what', 'matmul')}: {_fmt(ceiling)} TFLOP/s" if ceiling else "")
            + (
                f"; `make install`'s op build {_fmt(env['install_ops_s'])} s"
                if "install_ops_s" in env
                else ""
            )
        )
    lines += ["", "## Throughput", ""]
    rows = []
    for m in summary.get("measurements", []):
        rows.append(
            [m.get("name", "?"), _fmt(m.get("preset")), _fmt(m.get("seq")), _fmt(m.get("precision")),
             _fmt(m.get("micro_batch")), _fmt(m.get("zero_stage")), _fmt(m.get("tokens_per_s")),
             _fmt(m.get("samples_per_s")), _fmt(m.get("tflops")), _pct(m.get("mfu_spec")),
             _pct(m.get("mfu_measured")), _fmt(m.get("peak_memory_gb")), m.get("status", "?")]
        )  # fmt: skip
    header = ["measurement", "preset", "seq", "precision", "micro batch", "ZeRO", "tokens/s", "samples/s",
              "TFLOP/s", "MFU (spec)", "MFU (measured matmul)", "peak GB", "status"]  # fmt: skip
    lines += _table(header, rows) if rows else ["(no measurement yet)"]
    lines += [
        "",
        "TFLOP/s: the project's FLOPs formula (training/flops.py) on the same batches for every row.",
    ]
    ratio = _ratio(summary)
    if ratio:
        lines += ["", ratio]
    lines += ["", "## Parts", ""]
    lines += _table(
        ["part", "status", "seconds", "call", "note"],
        [
            [name, p.get("status", "?"), _fmt(p.get("seconds")), _fmt(p.get("call")), _short(p.get("error"))]
            for name, p in summary.get("parts", {}).items()
        ],
    )
    for key, probe in summary.get("probes", {}).items():
        lines += ["", f"## Probe: {key}", "", *_render_probe(probe)]
    if summary.get("not_run"):
        lines += ["", "## Not run", ""] + [f"- {k}: {v}" for k, v in summary["not_run"].items()]
    return "\n".join(lines) + "\n"


def _ratio(summary: dict[str, Any]) -> str | None:
    by_name = {m.get("name"): m for m in summary.get("measurements", []) if m.get("status") == "ok"}
    stage, ref = by_name.get("pretrain_base_seq128"), by_name.get("hf_plain_loop_base_seq128")
    if not stage or not ref or not ref.get("samples_per_s"):
        return None
    return (
        f"Stage / transformers plain loop (samples/s, same batches): "
        f"**{stage['samples_per_s'] / ref['samples_per_s']:.2f}×**"
    )


def _short(text: Any, limit: int = 160) -> str:
    if not text:
        return ""
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _render_probe(probe: dict[str, Any]) -> list[str]:
    """A probe as a bullet list; list-of-dict values become tables."""
    out = []
    for key, value in probe.items():
        if key == "call":
            continue
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            cols = list(dict.fromkeys(k for v in value for k in v))
            out += [
                f"- {key}:",
                "",
                *_table(cols, [[_short(_fmt(v.get(c)), 80) for c in cols] for v in value]),
                "",
            ]
        elif isinstance(value, dict):
            out.append(f"- {key}:")
            out += [f"  - {k}: {_short(_fmt(v), 300)}" for k, v in value.items()]
        else:
            out.append(f"- {key}: {_short(_fmt(value), 400)}")
    return out
