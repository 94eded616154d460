"""docs/design.md's module map names every file of the package, and only files that exist: a
module added, moved or removed without its line in the map fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "daskmeans"
DESIGN = ROOT / "docs" / "design.md"
SUFFIXES = (".py", ".cu", ".cuh", ".yaml")
ROW = re.compile(r"^\| `([^`]+)` \|")


def package_files(package: Path = PACKAGE) -> set[str]:
    """Every source file under ``package`` (``SUFFIXES``), relative to it, with ``/``."""
    return {p.relative_to(package).as_posix() for p in package.rglob("*")
            if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts}


def map_files(text: str) -> list[str]:
    """The files the ``## Module map`` section of ``text`` names, one per table row, in order."""
    m = re.search(r"^## Module map\n(.*?)(?=^## )", text, re.S | re.M)
    if m is None:
        raise AssertionError("docs/design.md has no '## Module map' section")
    return [r.group(1) for line in m.group(1).splitlines() if (r := ROW.match(line))]


def test_the_map_names_every_file_of_the_package_once():
    named = map_files(DESIGN.read_text())
    files = package_files()
    assert sorted(f for f in set(named) if named.count(f) > 1) == [], "named twice in the module map"
    assert sorted(files - set(named)) == [], "files under daskmeans/ missing from docs/design.md's module map"
    assert sorted(set(named) - files) == [], "docs/design.md's module map names files that do not exist"


def test_the_check_sees_a_missing_and_an_extra_file(tmp_path):
    """The helpers on a toy package and map, so the test above cannot pass vacuously."""
    pkg = tmp_path / "pkg"
    (pkg / "sub" / "__pycache__").mkdir(parents=True)
    for name in ("a.py", "sub/b.cu", "sub/c.cuh", "d.yaml", "notes.txt", "sub/__pycache__/a.cpython-312.pyc"):
        (pkg / name).write_text("")
    assert package_files(pkg) == {"a.py", "sub/b.cu", "sub/c.cuh", "d.yaml"}
    text = "## Module map\n\n| file | concern |\n| --- | --- |\n| `a.py` | x |\n| `gone.py` | y |\n\n## Next\n| `z.py` | no |\n"
    assert map_files(text) == ["a.py", "gone.py"]
    with pytest.raises(AssertionError, match="no '## Module map' section"):
        map_files("## Modules\n")
