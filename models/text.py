"""How the toolkit writes counts and numbers for people: `count(1, "shape")` is "1 shape" and
`count(2, "shape")` "2 shapes"; `number(x, ".2f")` never writes a negative zero ("-0.00")."""
from __future__ import annotations

IRREGULAR = {"was": "were", "is": "are", "has": "have"}


def plural(noun: str, n: int) -> str:
    """`noun` for n of them: itself for one, else its plural ("cell" -> "cells", "batch" -> "batches")."""
    if n == 1:
        return noun
    if noun in IRREGULAR:
        return IRREGULAR[noun]
    head, _, last = noun.rpartition(" ")  # "x value" -> "x values"
    ending = "es" if last.endswith(("s", "x", "ch", "sh")) else "s"
    return f"{head} {last}{ending}" if head else last + ending


def count(n: int, noun: str) -> str:
    """'1 cell', '2 cells', '0 cells'."""
    return f"{n} {plural(noun, n)}"


def number(x: float, fmt: str) -> str:
    """format(x, fmt) without the sign of a zero that rounding left ('-0.00' -> '0.00', '+0.00')."""
    text = format(x, fmt)
    mantissa = text.split("e")[0]
    if text[:1] == "-" and "0" in mantissa and not any(c in "123456789" for c in mantissa):
        return ("+" if "+" in fmt else "") + text[1:]
    return text
