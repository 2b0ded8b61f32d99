"""The backends a test runs over, in one place: a backend plugged in for the tests (tests/tarbackend, through
``$VIDEOCLIPS_EXTRA_BACKENDS`` set in conftest.py) joins the suites that test the backend contract here, with
one line per suite.

- ``SPECIFIED``: the package's own backends, those FORMAT.md specifies: the tests of the on-disk format (which
  read with readers written from FORMAT.md alone) run over these only.
- ``TEST_BACKENDS``: the backends plugged in for the tests, no part of FORMAT.md.
- ``ALL``: both; ``with_test_backends(...)``: the backends a test ran over before, and the test backends. A few
  representative tests per area take the test backends, not every parametrised test (the suite stays fast).
"""

from __future__ import annotations

from convert.format.backends import BACKENDS, BUILT_IN

SPECIFIED = tuple(BUILT_IN)
TEST_BACKENDS = tuple(BACKENDS.plugged_in())
ALL = (*SPECIFIED, *TEST_BACKENDS)


def with_test_backends(*names: str) -> list[str]:
    """``names`` (built-in backends a test already ran over), then every test backend."""
    return [*names, *TEST_BACKENDS]


__all__ = ["ALL", "SPECIFIED", "TEST_BACKENDS", "with_test_backends"]
