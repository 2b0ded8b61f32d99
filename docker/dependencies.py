"""Print the project's requirements from pyproject.toml, one per line, for ``pip install``.

    python docker/dependencies.py [--extra NAME]... [--without NAME]...

Why: the images install the dependencies in a layer of their own, before the
code is copied, so a change to the code rebuilds only the last layer; and the
conversion image leaves torch out (conversion and verification never import
it). The list comes from pyproject.toml itself, so it cannot drift from it.
Runs on the Python of the image (3.11: tomllib), with nothing installed.
"""

from __future__ import annotations

import argparse
import os
import re

import tomllib


def requirements(pyproject: str, *, extras: list[str], without: list[str]) -> list[str]:
    """The ``[project]`` dependencies plus the named extras, less the distributions named in ``without``."""
    with open(pyproject, "rb") as fh:
        project = tomllib.load(fh)["project"]
    reqs = list(project["dependencies"])
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"dependencies.py: {pyproject} has no extra {extra!r} (has {', '.join(optional)})")
        reqs += optional[extra]
    drop = {name.lower() for name in without}
    return [r for r in reqs if re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() not in drop]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--extra", action="append", default=[], help="add this optional-dependencies group")
    p.add_argument("--without", action="append", default=[], help="leave this distribution out")
    args = p.parse_args()
    pyproject = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "pyproject.toml")
    print("\n".join(requirements(pyproject, extras=args.extra, without=args.without)))


if __name__ == "__main__":
    main()
