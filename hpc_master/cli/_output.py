"""Output: aligned plain-text tables, JSON and CSV (no extra dependencies)."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Sequence
from typing import Any

Row = Sequence[Any]


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, separators=(", ", ": "))
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Row]) -> str:
    text_rows = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in text_rows:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))
    lines = [
        " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
        "-+-".join("-" * w for w in widths),
    ]
    lines += [" | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in text_rows]
    return "\n".join(lines)


def print_table(headers: Sequence[str], rows: Sequence[Row]) -> None:
    print(table(headers, rows))


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


def print_document(value: Any, output: str = "yaml") -> None:
    """A configuration-like document as YAML (keys in their order) or, with ``output="json"``, JSON."""
    if output == "json":
        print_json(value)
        return
    import yaml  # only for the commands that print YAML

    print(yaml.safe_dump(value, sort_keys=False, default_flow_style=False), end="")


def print_csv(headers: Sequence[str], rows: Sequence[Row]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(headers)
    for row in rows:
        writer.writerow([cell(v) for v in row])


def emit(args: Any, headers: Sequence[str], rows: Sequence[Row], raw: Any) -> None:
    """``--json`` prints `raw`; ``--csv`` and the default table print `rows`."""
    if getattr(args, "json", False):
        print_json(raw)
    elif getattr(args, "csv", False):
        print_csv(headers, rows)
    else:
        print_table(headers, rows)


def key_values(pairs: Sequence[tuple[str, Any]]) -> str:
    width = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{(k + ':').ljust(width + 1)} {cell(v)}" for k, v in pairs)


def state(value: Any) -> str:
    """``STATE_COMPLETED`` → ``COMPLETED``."""
    return str(value or "").removeprefix("STATE_")


def add_format_flags(parser: Any, *, csv: bool = True) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true", help="print JSON")
    if csv:
        group.add_argument("--csv", action="store_true", help="print CSV")
