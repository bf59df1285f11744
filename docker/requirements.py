"""Print the requirements of counterfactory and the given extras, one a line, from pyproject.toml.

The image installs these first (``pip install -c docker/constraints.txt -r -``), from
pyproject.toml alone, so that layer is reused while only the code changes; the package itself
follows with ``--no-deps``. Standard library only (it runs in the bare base image)::

    python3 docker/requirements.py remote,review,hub
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    declared = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in declared]
    if unknown:
        raise SystemExit(f"unknown extra(s): {', '.join(unknown)}")
    out = list(project["dependencies"])
    for extra in extras:
        out += [r for r in declared[extra] if r not in out]
    return out


if __name__ == "__main__":
    wanted = [e.strip() for e in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if e.strip()]
    print("\n".join(requirements(Path("pyproject.toml"), wanted)))
