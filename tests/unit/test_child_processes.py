"""emulators.processes.ChildProcess: the helper every process test starts its peers with."""

from __future__ import annotations

import pytest

from emulators.processes import server

pytestmark = pytest.mark.timeout(60)


def test_a_started_server_used_as_a_context_manager_is_not_started_twice() -> None:
    """`with host:` after server() started it once leaked a second functions host per test."""
    child, url = server("imds-sim")
    first = child.process
    assert first is not None and url.startswith("http://127.0.0.1:")
    with child:
        assert child.process is first  # the same process, not a second one
        assert child.alive
    assert first.poll() is not None  # and leaving the block stopped it
    child.start()  # a stopped child starts again (restart tests rely on it)
    try:
        assert child.process is not first and child.alive
    finally:
        child.close()
