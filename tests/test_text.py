"""Counts and numbers as the toolkit writes them for people (models.text)."""
import pytest

from models.text import count, number, plural


@pytest.mark.parametrize("n, noun, text", [(1, "shape", "1 shape"), (2, "shape", "2 shapes"), (0, "cell", "0 cells"),
                                           (1, "new cell", "1 new cell"), (3, "new cell", "3 new cells"),
                                           (2, "batch", "2 batches"), (2, "x value", "2 x values"),
                                           (2, "CUDA device", "2 CUDA devices")])
def test_counts_are_pluralised(n, noun, text):
    assert count(n, noun) == text


def test_irregular_words():
    assert (plural("was", 1), plural("was", 2), plural("has", 3)) == ("was", "were", "have")


@pytest.mark.parametrize("x, fmt, text", [(-0.001, ".2f", "0.00"), (-0.001, "+.2f", "+0.00"), (-0.004, ".3f", "-0.004"),
                                          (-1e-9, ".2e", "-1.00e-09"), (float("-inf"), ".2f", "-inf"),
                                          (-0.0, ".1f", "0.0"), (-12.0, ".0f", "-12"), (0.5, "+.1f", "+0.5")])
def test_numbers_never_show_a_negative_zero(x, fmt, text):
    assert number(x, fmt) == text
