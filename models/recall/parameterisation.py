"""How a model is parameterised: the standard model (TransformerLens conventions), the authors'
(the official code's TF_one_layer), and every model in between.

The authors' model departs from the standard one in six places, each of which can be taken
alone, so that a study can tell which of them changes what the model learns:

    standard                  none of the departures
    authors                   all of them
    standard+qkv_init+o_init  the standard model with the departures named
    authors-residual          the authors' model without the departures named

The base (standard or authors) also fixes the order in which the initial weights are drawn,
so `standard` and `authors` are the same models, draw for draw, as before the departures
could be named one by one.
"""
from __future__ import annotations

BASES = ("standard", "authors")
DEPARTURES = {
    "residual": "the MLP and the unembedding read the attention output alone: b_O = -(e_EOS + p_EOS), frozen",
    "mlp_bias": "the MLP input bias b_in is trained (from zero)",
    "qkv_init": "Q, K, V entries N(0, 1/d_h) (standard: N(0, 1/d))",
    "o_init": "O entries N(0, 1/d) (standard: N(0, 1/(H d_h)))",
    "mlp_init": "the MLP layers drawn from flax's truncated LeCun normal (standard: N(0, 1/fan_in), the same variance)",
    "embedding": "embedding auto means N(0, 1/d) entries (standard: unit vectors)",
}
HELP = ("standard (TransformerLens conventions) | authors (the official code's TF_one_layer) | standard+NAME+... "
        "(the standard model with the authors' departures NAME) | authors-NAME-... (the authors' model without "
        f"them); NAME: {', '.join(DEPARTURES)}")


def base(parameterisation: str) -> str:
    """'standard' or 'authors': the model a parameterisation starts from."""
    return "authors" if parameterisation.startswith("authors") else "standard"


def departures(parameterisation: str) -> frozenset[str]:
    """The authors' departures from the standard model that `parameterisation` takes; a
    ValueError names what is wrong with it in one line."""
    if not isinstance(parameterisation, str):
        raise ValueError(f"parameterisation must be text, got {parameterisation!r}.")
    start = base(parameterisation)
    sign = "+" if start == "standard" else "-"
    head, *names = parameterisation.split(sign)
    unknown = [n for n in names if n not in DEPARTURES]
    if head != start or unknown or len(set(names)) < len(names):
        problem = ("unknown parameterisation" if head != start
                   else f"unknown departure {unknown[0]!r}" if unknown else "a departure named twice")
        raise ValueError(f"parameterisation {parameterisation!r}: {problem}; the forms are standard, authors, "
                         f"standard+NAME+... and authors-NAME-... with NAME among {', '.join(DEPARTURES)}.")
    return frozenset(names) if start == "standard" else frozenset(DEPARTURES) - set(names)


def variants() -> list[str]:
    """The models of the one-at-a-time study: standard, each departure added to it alone,
    the authors' model, and each departure taken out of it alone."""
    return (["standard"] + [f"standard+{n}" for n in DEPARTURES]
            + ["authors"] + [f"authors-{n}" for n in DEPARTURES])
