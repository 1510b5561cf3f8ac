"""Pure edits of /etc/hosts: our entries live between two marker lines, so `down` removes exactly them."""

from __future__ import annotations

BEGIN = "# BEGIN hpc-det local cluster"
END = "# END hpc-det local cluster"


def remove_block(text: str) -> str:
    out: list[str] = []
    inside = False
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if stripped == BEGIN:
            inside = True
            continue
        if stripped == END:
            inside = False
            continue
        if not inside:
            out.append(line)
    return "".join(out)


def add_block(text: str, entries: list[str]) -> str:
    base = remove_block(text)
    if base and not base.endswith("\n"):
        base += "\n"
    return base + "\n".join([BEGIN, *entries, END]) + "\n"


def has_block(text: str) -> bool:
    return any(line.strip() == BEGIN for line in text.splitlines())
