"""The pinned constraints (scripts/pin.sh) still match pyproject.toml's requirements.

A requirement added or changed without running scripts/pin.sh would let a fresh clone install whatever is
newest upstream that day; these tests fail instead, naming the command to run."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIX = "run scripts/pin.sh after changing pyproject.toml's requirements"


def _digest() -> str:
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "pins_inputs.py"), "digest"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return out.stdout.strip()


def _pins(name: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (REPO / name).read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)", line)
        if m:
            pins[_canonical(m.group(1))] = m.group(2)
    return pins


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _header_digest(name: str) -> str:
    m = re.search(r"^# inputs: (\w+)$", (REPO / name).read_text(), re.MULTILINE)
    assert m, f"{name} has no '# inputs:' line: {FIX}"
    return m.group(1)


def test_the_pins_were_compiled_from_todays_requirements() -> None:
    digest = _digest()
    for name in ("constraints.txt", "constraints-determined.txt"):
        assert _header_digest(name) == digest, f"{name} is stale: {FIX}"


def test_every_requirement_of_every_extra_is_pinned() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for reqs in project["optional-dependencies"].values():
        wanted += reqs
    pins = _pins("constraints.txt")
    missing = sorted({_canonical(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in wanted} - set(pins))
    assert not missing, f"not pinned: {missing}: {FIX}"
    assert pins["pip"], "pip itself is pinned (bootstrap upgrades Debian's pip first)"


def test_torch_is_the_cpu_build_on_disk_and_determined_the_supported_client() -> None:
    torch = _pins("constraints.txt")["torch"]
    assert torch.split("+")[0] == "2.13.0", f"torch {torch}: the CPU build on the machines' disk is 2.13.0"
    assert _pins("constraints-determined.txt")["determined"] == "0.38.1"


def test_a_changed_requirement_changes_the_digest(tmp_path: Path) -> None:
    """The digest covers the requirements (not only the file's bytes elsewhere): a copy with one more
    requirement digests differently, and a copy with only a tool setting changed digests the same."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "pins_inputs.py").write_text((REPO / "scripts" / "pins_inputs.py").read_text())
    text = (REPO / "pyproject.toml").read_text()

    def digest_of(pyproject: str) -> str:
        (tmp_path / "pyproject.toml").write_text(pyproject)
        out = subprocess.run([sys.executable, str(scripts / "pins_inputs.py"), "digest"],
                             capture_output=True, text=True, check=True)  # fmt: skip
        return out.stdout.strip()

    base = digest_of(text)
    assert base == _digest()
    assert digest_of(text.replace('"numpy>=1.26",\n]', '"numpy>=1.26",\n    "rich>=13",\n]', 1)) != base
    assert digest_of(text.replace("line-length = 110", "line-length = 111")) == base
