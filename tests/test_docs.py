"""The documentation keeps its promises: the README's test command is CI's, it stays a front page, links resolve."""

from __future__ import annotations

import os
import re

from .conftest import ROOT

README = os.path.join(ROOT, "README.md")
PAGES = [README, os.path.join(ROOT, "FORMAT.md")] + sorted(
    os.path.join(ROOT, "docs", name) for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md"))
# The packages whose README maps their files; their links are checked with the pages.
MAPPED = ("convert", "convert/format", "convert/store", "convert/worker", "convert/job", "loaders", "loaders/dali",
          "train", "train/models")
PAGES += [os.path.join(ROOT, folder, "README.md") for folder in MAPPED]


def _commands(path: str) -> list[str]:
    """The lines of the fenced ``bash`` blocks of a Markdown file."""
    text = open(path).read()
    return [line.strip() for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_ci_runs_exactly_the_readmes_test_command():
    tests = [c for c in _commands(README) if "pytest" in c]
    assert len(tests) == 1, tests
    ci = [line for line in open(os.path.join(ROOT, ".ci", "run")).read().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert ci == tests


def test_the_readme_is_a_front_page():
    assert len(open(README).read()) <= 15_000


def _anchors(path: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", open(path).read(), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_every_relative_link_of_the_docs_resolves():
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", open(page).read(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(full):
                broken.append(f"{os.path.relpath(page, ROOT)}: {target} (no such file)")
            elif anchor and full.endswith(".md") and anchor not in _anchors(full):
                broken.append(f"{os.path.relpath(page, ROOT)}: {target} (no such heading)")
    assert broken == []


def _modules(folder: str) -> list[str]:
    """The modules of a package folder but its ``__init__.py``."""
    return sorted(n for n in os.listdir(folder) if n.endswith(".py") and n != "__init__.py")


def test_each_mapped_package_readme_names_every_file_of_its_folder():
    """Every module of the folder is named; a subpackage is named whole (`lmdb/`, with its own README or not) or
    module by module (`cache/index.py`)."""
    missing = []
    for package in MAPPED:
        folder = os.path.join(ROOT, package)
        text = open(os.path.join(folder, "README.md")).read()
        missing += [f"{package}/{name}" for name in _modules(folder) if f"`{name}`" not in text]
        for sub in sorted(os.listdir(folder)):
            inner = os.path.join(folder, sub)
            if os.path.isdir(inner) and _modules(inner) and f"`{sub}/`" not in text:
                missing += [f"{package}/{sub}/{name}" for name in _modules(inner) if f"`{sub}/{name}`" not in text]
    assert missing == []


def test_every_file_a_package_readme_maps_exists():
    """The first column of a package README's tables names files and folders that are there."""
    gone = []
    for package in MAPPED:
        folder = os.path.join(ROOT, package)
        for cell in re.findall(r"^\| ([^|]+) \|", open(os.path.join(folder, "README.md")).read(), re.M):
            gone += [f"{package}/{name}" for name in re.findall(r"`([^`]+)`", cell)
                     if name.endswith((".py", "/")) and not os.path.exists(os.path.join(folder, name))]
    assert gone == []
