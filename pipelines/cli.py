"""`bertflow`: one console script, a subcommand per stage plus the model tools and the flow.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `main(args) -> int`;
modules are imported only when their command runs (DeepSpeed, Beam and Prefect are slow to import).
A UserError is printed as one paragraph, exit code 2, no traceback; a TransientError (a lost node or
rank) the same way, exit code 1.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import sys

from common.errors import Terminated, TransientError, UserError

# name -> (module, one-line help), in the order `bertflow --help` lists them: the flow, its stages
# in pipeline order, then the tools around them.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("pipelines.flow_command", "run the whole Prefect flow from a YAML config (start here)"),
    "tokenizer": ("pipelines.stage_tokenizer", "stage 1: train a WordPiece vocabulary (or load vocab.txt)"),
    "preprocess": ("pipelines.stage_preprocess", "stage 2: Beam job, corpus -> sharded MLM/NSP examples"),
    "pretrain": ("pipelines.stage_pretrain", "stage 3: DeepSpeed pretraining on the shards"),
    "finetune": ("pipelines.stage_finetune", "stage 4: fine-tune and evaluate a checkpoint on tasks"),
    "report": (
        "pipelines.stage_report",
        "stage 5: the report (headline, scorecard, curves) of a run directory",
    ),
    "runs": ("pipelines.runs_command", "list past flow runs, show one, delete outputs safely"),
    "evaluate": (
        "pipelines.evaluate_command",
        "held-out masked-LM / NSP accuracy of any checkpoint on shards",
    ),
    "model-info": (
        "pipelines.model_commands_info",
        "print a preset's or a model folder's shape, parameter count and heads",
    ),
    "import-hf": ("pipelines.model_commands_import", "convert a Hugging Face BERT directory into ours"),
    "export-hf": ("pipelines.model_commands_export", "write a checkpoint as a Hugging Face model directory"),
}

# OSErrors that mean "this path cannot be used" rather than a bug
_PATH_ERRNOS = {
    errno.EACCES,
    errno.EPERM,
    errno.ENOTDIR,
    errno.EEXIST,
    errno.EROFS,
    errno.ENOSPC,
    errno.EDQUOT,
}


def _load(name: str):
    module_name, _ = COMMANDS[name]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None
        raise


def version_text() -> str:
    """`bertflow --version`: ours and the versions of the components that decide the results."""
    from common.version import package_version

    parts = ", ".join(
        f"{n} {package_version(n)}" for n in ("torch", "deepspeed", "apache-beam", "prefect", "wandb")
    )
    return f"bertflow {package_version()} (python {sys.version.split()[0]}; {parts})"


class _CommandListFormatter(argparse.HelpFormatter):
    """argparse sizes the name column without the extra indent of sub-commands, so long names
    wrap onto a line of their own; give the column those two characters."""

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction):
            self._action_max_length += 2


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertflow",
        description="BERT pretraining pipeline. Start with `bertflow run configs/default.yaml`; "
        "`bertflow COMMAND --help` explains each command.",
        formatter_class=_CommandListFormatter,
    )
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if command == name:  # only the chosen command's module is imported
            module = _load(name)
            if module is not None:
                module.add_arguments(p)
    return parser


def _unknown_command(word: str) -> str | None:
    """The error for a first word that is no command (with the closest command), else None."""
    if word in COMMANDS:
        return None
    import difflib

    close = difflib.get_close_matches(word, list(COMMANDS), n=1, cutoff=0.5)
    hint = f" Did you mean `bertflow {close[0]}`?" if close else ""
    return f"bertflow: unknown command {word!r}.{hint} Commands: {', '.join(COMMANDS)}."


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is not None and (message := _unknown_command(command)):
        print(message, file=sys.stderr)
        return 2
    from pipelines.beam_console import drop_import_chatter, no_default_root_handler

    drop_import_chatter()  # before any command's module imports Beam (its parser does)
    # Beam's import warns through `logging.warning`, which would give the root logger Python's
    # default handler and make a command's own `command_logging` a no-op (its INFO lines unshown)
    with no_default_root_handler():
        parser = build_parser(command)
        args, extra = parser.parse_known_args(argv)
        module = _load(args.command) if args.command else None
    if extra and not getattr(module, "PASSES_UNKNOWN_ARGS", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra_args = extra  # e.g. Beam pipeline options for `preprocess`
    if args.command is None:
        parser.print_help()
        return 0
    module = _load(args.command)
    if module is None:
        print(f"bertflow {args.command}: not implemented yet.", file=sys.stderr)
        return 0 if args.command == "run" else 1
    try:
        return int(module.main(args) or 0)
    except (UserError, TransientError) as exc:
        print(f"bertflow {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `bertflow runs | head`: the reader left; the rest goes nowhere
        from common.child_process import to_devnull

        to_devnull(sys.stdout)
        return 141  # what a shell reports for a command ended by SIGPIPE
    except OSError as exc:
        if exc.errno not in _PATH_ERRNOS:
            raise
        # e.g. an output path below a regular file, a read-only or full disk: the user's to fix
        where = exc.filename if exc.filename is not None else "a path"
        print(
            f"bertflow {args.command}: error: cannot write or read {where}: {exc.strerror}. "
            "Fix: choose an output path whose parent is a writable directory (and check free space).",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM where the command turns it into Terminated
        stopped = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        print(f"bertflow {args.command}: {stopped}.", file=sys.stderr)
        return getattr(exc, "exit_code", 130)


if __name__ == "__main__":
    sys.exit(main())
