"""The cells of the pages' tables: numbers as the pages show them (four decimals for scores, significant digits
for figures that span orders of magnitude, learning rates in scientific notation), identifiers that wrap only after
a separator, and the HTML table itself. Shared by the report, the cost table and `videogrpo compare`'s page.

May import: the core modules.
"""

from __future__ import annotations

import html
import math
import re
from typing import Any


def number(value: Any) -> Any:
    """CSV cells as numbers where they are numbers."""
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            try:
                return float(value)
            except ValueError:
                return value
    return value


def fixed(value: float, digits: int = 4) -> str:
    """`value` to `digits` decimals; a value that rounds to zero is 0, never -0 (a sign with no digit behind it
    reads as a result)."""
    text = f"{value:.{digits}f}"
    return text.lstrip("-") if float(text) == 0 else text


def significant(value: Any, digits: int = 4) -> str:
    """A number to `digits` significant digits, as the CLI prints its figures: 0.0003125, 2.517, 20,692,776 (no digit
    made up, none dropped before the decimal point), and 1.23e-09 where decimals would be mostly zeros."""
    value = number(value)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return html.escape(str(value))
    if value != value:
        return "–"
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    if magnitude < -4:
        return f"{value:.{digits - 1}e}"
    return f"{value:,.{max(0, digits - 1 - magnitude)}f}"


def learning_rate_text(value: Any) -> str:
    """A learning rate to three significant digits (1.00e-04, 8.54e-05): the schedule's warm-up and decay
    differ in the digits that fixed decimals drop."""
    value = number(value)
    return f"{value:.2e}" if isinstance(value, (int, float)) else html.escape(str(value))


def breakable(text: Any) -> str:
    """`text` as HTML that a browser may wrap after a separator (/ : . _ -) and nowhere else: an identifier such as
    `generate_cell:trained:flowcps-0.7.videos` or a path never breaks inside a word."""
    return re.sub(r"([/:._-])", r"\1<wbr>", html.escape(str(text)))


def cell(value: Any) -> str:
    value = number(value)
    if isinstance(value, float):
        return "–" if value != value else fixed(value)  # NaN: not defined (an interval of a single sample)
    return html.escape(str(value))


def table(rows: list[dict], columns: list[str], formats: dict[str, Any] | None = None, css: str = "") -> str:
    """An HTML table; `formats`: per column, the function from a cell's value to its HTML (default: numbers to
    four decimals, text as it is)."""
    formats = formats or {}
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{formats.get(c, cell)(row.get(c, ''))}</td>" for c in columns) + "</tr>" for row in rows
    )
    opening = f"<table class='{css}'>" if css else "<table>"
    return f"{opening}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def csv_float(text: str) -> float:
    """A CSV cell as a number; empty (an interval of one sample) is NaN."""
    return float(text) if text != "" else float("nan")
