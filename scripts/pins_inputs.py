"""The inputs that the pinned constraints are compiled from, and their digest.

`scripts/pin.sh` writes the digest into the header of `constraints.txt` and `constraints-determined.txt`;
`tests/unit/test_pins.py` recomputes it, so a change to `pyproject.toml`'s requirements that was not followed
by `scripts/pin.sh` fails the fast lane. Only what the resolution depends on counts (the requirements, the
Python version, the torch build taken from the machine's disk, Determined's client version), so editing
pyproject.toml's tool settings needs no new pins.
    python3 scripts/pins_inputs.py digest        # the digest
    python3 scripts/pins_inputs.py extras        # the extras pin.sh compiles, comma-separated
"""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The CPU build of torch that lies on the machines' disk (scripts/bootstrap.sh installs it by exact version).
TORCH = "torch==2.13.0"
# Determined's official client, in its own venv (scripts/determined_client.sh).
DETERMINED = "determined==0.38.1"
# Installed into the venvs before anything else (bootstrap upgrades Debian's pip 23.0 first).
TOOLS = "pip"
PYTHON = "3.11"  # Debian 12's /usr/bin/python3, which both venvs are built from


def project() -> dict[str, object]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return dict(data["project"])


def extras() -> list[str]:
    optional = project().get("optional-dependencies") or {}
    assert isinstance(optional, dict)
    return sorted(optional)


def digest() -> str:
    p = project()
    inputs = {
        "requires-python": p.get("requires-python"),
        "dependencies": p.get("dependencies"),
        "optional-dependencies": p.get("optional-dependencies"),
        "torch": TORCH,
        "determined": DETERMINED,
        "tools": TOOLS,
        "python": PYTHON,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "digest"
    if what == "digest":
        print(digest())
    elif what == "extras":
        print(",".join(extras()))
    elif what == "torch":
        print(TORCH)
    elif what == "tools":
        print(TOOLS)
    elif what == "determined":
        print(DETERMINED)
    else:
        sys.exit(f"usage: {sys.argv[0]} digest|extras|torch|tools|determined")
