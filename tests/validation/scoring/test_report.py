"""``score``'s tables as Markdown (``validation/scoring/report.py``): the columns of every row in
the order first seen, four significant digits, intervals as ``[low, high]``, a missing value
blank, a pipe in a value not breaking the table."""

from __future__ import annotations

from counterfactory.validation.scoring.report import markdown


def test_a_table_in_markdown():
    rows = [
        {"group": "Black", "rate": 0.123456, "ci": [0.05, 0.2512]},
        {"group": "White|Other", "rate": None, "n": 12},
    ]
    assert markdown(rows) == (
        "| group | rate | ci | n |\n"
        "|---|---|---|---|\n"
        "| Black | 0.1235 | [0.05, 0.251] |  |\n"
        "| White/Other |  |  | 12 |\n"
    )
    assert markdown([]) == ""


def test_a_bound_that_is_float_noise_reads_zero():
    # a bootstrap bound of -1e-17 is a zero that floating point left; it must not print as -1e-17
    assert "| [0, 0.5] |" in markdown([{"ci": [-1e-17, 0.5]}])
