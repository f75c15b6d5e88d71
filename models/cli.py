"""Command-line plumbing shared by every entry point: config fields with their help text
(`setting`) and overrides by name (`override`), flags generated from the frozen config
dataclasses, comma lists (one rule for every list flag: `list_items`), and bad input turned
into one line on stderr and exit code 2 (a ValueError from main, or a flag argparse refuses)."""
from __future__ import annotations

import argparse
import re
import sys
import types
import typing
from dataclasses import MISSING, field, fields, replace


def setting(default, help: str, **kw):
    """A config field with its --help text (and argparse `choices`, ...): one flag per field."""
    return field(default=default, metadata={"help": help, **kw})


def override(config, values: dict):
    """`config` with the given fields replaced; a name that is not one of its fields is refused."""
    unknown = sorted(set(values) - {f.name for f in fields(config)})
    if unknown:
        raise ValueError(f"{type(config).__name__} has no field {', '.join(map(repr, unknown))}.")
    return replace(config, **values)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose refusals are one line `error: ...` on stderr and exit code 2,
    like run_cli's (argparse's own prints the usage first). Its subparsers are Parsers too."""

    def __init__(self, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(**kwargs)
        # a value that starts with '-' and a digit (-1, -1,1,8, -1:0) is a value, so the flag's own
        # range check names the problem; argparse's own matcher takes -1 only, and -1,1,8 for a flag
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str):
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def parser(prog: str, description: str) -> Parser:
    """A command's parser: one-line refusals, the module docstring as its description."""
    return Parser(prog=prog, description=description)


def add_config_flags(parser: argparse.ArgumentParser, config_cls, title: str, *, exclude: tuple[str, ...] = (),
                     default_label: str = "preset default here", base=None) -> None:
    """One `--field-name` flag per dataclass field but those in `exclude`; default None means
    'keep the preset's' (see `given`). The help text is the field's `help` metadata and the
    value the command starts from: `base`'s (a config instance), else the class default."""
    group = parser.add_argument_group(title)
    hints = typing.get_type_hints(config_cls)
    for f in fields(config_cls):
        if f.name in exclude:
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = _without_none(hints[f.name])
        default = getattr(base, f.name) if base is not None else f.default if f.default is not MISSING else None
        shown = (",".join(map(str, default)) or "none") if isinstance(default, tuple) else default
        shown = "" if shown is None else f"({default_label}: {shown})"
        help_text = " ".join(filter(None, [f.metadata.get("help"), shown]))
        if kind is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif typing.get_origin(kind) is tuple:
            item = typing.get_args(kind)[0]
            group.add_argument(flag, type=comma_list(item, distinct=not f.metadata.get("repeats", False)),
                               default=None, metavar="A,B,...", help=help_text)
        else:
            group.add_argument(flag, type=kind, default=None, choices=f.metadata.get("choices"), help=help_text)


def _without_none(kind):
    """`X | None` -> X (a flag left out keeps the default, None included)."""
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return kind


def given(args: argparse.Namespace, config_cls) -> dict:
    """The fields of `config_cls` that were set on the command line."""
    return {f.name: getattr(args, f.name) for f in fields(config_cls) if getattr(args, f.name, None) is not None}


def whole_number(what: str):
    """An argparse type: an integer >= 0, refused as 'a WHAT is an integer >= 0, got -1'."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < 0:
            shown = repr(text) if value is None else value
            raise argparse.ArgumentTypeError(f"a {what} is an integer >= 0, got {shown}")
        return value
    parse.__name__ = what
    return parse


seed = whole_number("seed")  # --seed: torch and the counter sampler take seeds >= 0


def list_items(text: str, parse=str, distinct: bool = True, what: str = "value") -> tuple:
    """The one rule of every list flag: 'A,B,...' -> (parse(A), parse(B), ...), at least one
    item, no empty item ('', 'A,,B', 'A,'), and (`distinct`) no value twice ('0,0', '1e-2,0.01'):
    a value given twice would train, count or vote twice. ValueError, one line, otherwise
    (`parse` may raise its own; `what` names an item in the messages)."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise ValueError(f"expected at least one {what}, got {text!r}")
    if "" in items:
        raise ValueError(f"an empty {what} in {text!r} (two commas, or one at an end)")
    values = tuple(parse(item) for item in items)
    if distinct:
        for i, value in enumerate(values):
            if value in values[:i]:
                first = items[values.index(value)]
                same = f"{first} given twice" if first == items[i] else f"{first} and {items[i]} are the same {what}"
                raise ValueError(f"{same} in {text!r}: list each {what} once")
    return values


def comma_list(item_type, distinct: bool = True):
    """An argparse type: 'A,B,...' -> a tuple of `item_type` by `list_items`' rule (at least
    one value, none empty, none twice unless not `distinct`)."""
    def item(text: str):
        try:
            return item_type(text)
        except ValueError:
            raise ValueError(f"expected a comma-separated list of {item_type.__name__}, got the item {text!r}") \
                from None

    def parse(text: str) -> tuple:
        try:
            return list_items(text, item, distinct)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = f"{item_type.__name__} list"
    return parse


def run_cli(main) -> None:
    """Run main(); bad input (ValueError, an unreadable or unwritable path) becomes one
    line `error: ...` on stderr and exit code 2; Ctrl-C exits 130 with `interrupted`, or with
    the line main gave its KeyboardInterrupt (what was saved, how to resume)."""
    try:
        code = main()
    except KeyboardInterrupt as e:
        print(str(e) or "interrupted", file=sys.stderr)
        sys.exit(130)
    except (ValueError, OSError) as e:  # bad input, or a path that cannot be read or written
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code or 0)
