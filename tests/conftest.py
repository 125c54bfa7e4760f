"""Shared pytest configuration: fixture plugins for the real test servers."""

pytest_plugins = [
    "tests.fixtures.ferretdb",
    "tests.fixtures.llm_server",
    "tests.fixtures.llama_server",
    "tests.fixtures.cluster",
]
