"""Command-line plumbing shared by every entry point: flags generated from the frozen
config dataclasses, and bad input turned into one line on stderr and exit code 2."""
from __future__ import annotations

import argparse
import shutil
import sys
import typing
from dataclasses import MISSING, fields
from pathlib import Path


def add_config_flags(parser: argparse.ArgumentParser, config_cls, title: str) -> None:
    """One `--field-name` flag per dataclass field; default None means 'keep the preset's'."""
    group = parser.add_argument_group(title)
    hints = typing.get_type_hints(config_cls)
    for f in fields(config_cls):
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        default = f.default if f.default is not MISSING else None
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        help_text = f"{f.metadata.get('help', '')} (preset default here: {shown})"
        if kind is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif typing.get_origin(kind) is tuple:
            item = typing.get_args(kind)[0]
            group.add_argument(flag, type=_comma_list(item), default=None, metavar="A,B,...", help=help_text)
        else:
            group.add_argument(flag, type=kind, default=None, choices=f.metadata.get("choices"), help=help_text)


def given(args: argparse.Namespace, config_cls) -> dict:
    """The fields of `config_cls` that were set on the command line."""
    return {f.name: getattr(args, f.name) for f in fields(config_cls) if getattr(args, f.name, None) is not None}


def _comma_list(item_type):
    def parse(text: str) -> tuple:
        try:
            values = tuple(item_type(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {item_type.__name__}, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError("expected at least one value")
        return values
    parse.__name__ = f"{item_type.__name__} list"
    return parse


def run_cli(main) -> None:
    """Run main(); bad input (ValueError, an unreadable or unwritable path) becomes one
    line `error: ...` on stderr and exit code 2."""
    try:
        code = main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except (ValueError, OSError) as e:  # bad input, or a path that cannot be read or written
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code or 0)


def prepare_out(out: Path, force: bool) -> Path:
    """An empty directory to write into: refuse one that holds files unless `force`, which
    clears it (the user asked to replace it)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory.")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ValueError(f"--out {out} already holds files; pass --force to replace it, or choose another --out.")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    return out
