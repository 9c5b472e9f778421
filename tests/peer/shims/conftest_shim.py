"""Replaces the SDK's conftest.py (test-proxy sanitizers): see peer_harness.py."""

import peer_harness


def pytest_configure(config):
    peer_harness.configure(config)
