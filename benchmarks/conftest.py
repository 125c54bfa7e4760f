"""The benchmarks' plugin registration (as in tests/conftest.py): the catalog is filled once."""

from tests.fixtures.plugins import registered_plugins  # noqa: F401  (the autouse fixture)
