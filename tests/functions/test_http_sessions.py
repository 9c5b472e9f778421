"""The Function App's requests session reads the proxies of the environment once per host
(functions/adapters/sessions.py) and still honours them as requests does: over loopback, a
server and a second server standing in for the proxy (a proxied HTTP request names the whole
URL in its request line)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from functions.adapters import sessions
from functions.adapters.sessions import Session
from tests.support.http_peers import HttpPeer, Request

pytestmark = pytest.mark.timeout(60)

PROXY_VARIABLES = [f"{n}_proxy" for n in ("http", "https", "all", "no")]


def answer(request: Request) -> tuple[int, bytes]:
    return 200, request.target.encode()


@pytest.fixture
def peers(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[HttpPeer, HttpPeer]]:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    with HttpPeer(answer) as server, HttpPeer(answer) as proxy:
        yield server, proxy


def test_the_environments_proxy_carries_the_request(
    peers: tuple[HttpPeer, HttpPeer], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, proxy = peers
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    session = Session()
    for _ in range(3):
        assert session.get(f"{server.url}/a", timeout=5).status_code == 200
    assert [r.target for r in proxy.requests] == [f"{server.url}/a"] * 3
    assert server.requests == []


def test_no_proxy_sends_the_request_straight(
    peers: tuple[HttpPeer, HttpPeer], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, proxy = peers
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    response = Session().get(f"{server.url}/b", timeout=5)
    assert response.text == "/b"
    assert [r.target for r in server.requests] == ["/b"]
    assert proxy.requests == []


def test_a_proxy_given_to_the_call_wins_over_the_environment(
    peers: tuple[HttpPeer, HttpPeer], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, proxy = peers
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # discard: nothing listens
    response = Session().get(f"{server.url}/c", timeout=5, proxies={"http": proxy.url})
    assert response.status_code == 200
    assert [r.target for r in proxy.requests] == [f"{server.url}/c"]


def test_the_environment_is_read_once_per_host(
    peers: tuple[HttpPeer, HttpPeer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What saves the CPU: the second request to a host does not look at the environment."""
    server, _ = peers
    looked: list[str] = []
    real = sessions.get_environ_proxies

    def counting(url: str, no_proxy: str | None = None) -> dict[str, str]:
        looked.append(url)
        return real(url, no_proxy=no_proxy)

    monkeypatch.setattr(sessions, "get_environ_proxies", counting)
    session = Session()
    for path in ("/1", "/2", "/3"):
        session.get(f"{server.url}{path}", timeout=5)
    assert looked == [f"{server.url}/1"]
    assert [r.target for r in server.requests] == ["/1", "/2", "/3"]


def test_the_ca_bundle_of_the_environment_is_still_read_at_each_request(
    peers: tuple[HttpPeer, HttpPeer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """REQUESTS_CA_BUNDLE as requests reads it: a bundle that does not exist fails an HTTPS
    request before anything is sent (here to the loopback server, which speaks plain HTTP)."""
    server, _ = peers
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/nonexistent/bundle.pem")
    https = server.url.replace("http://", "https://")
    with pytest.raises(OSError, match="bundle"):
        Session().get(https, timeout=5)
    assert server.requests == []
