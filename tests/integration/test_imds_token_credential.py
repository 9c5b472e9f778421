"""The forwarder's managed-identity credential (sebridge.forwarder.imds.token) against real
peers on 127.0.0.1: the project's identity fake and recording HTTP servers that answer in every
way IMDS's token endpoint may, and in the ways it should not (issue 21).

Nothing here sends anything to 169.254.169.254: every credential is given its authority (a
loopback URL) or an environment naming one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulators.fakes.identity import SYSTEM_ASSIGNED_CLIENT_ID, FakeIdentity, jwt_claims
from sebridge.forwarder.config import ConfigError, parse_config
from sebridge.forwarder.imds.token import (
    AUTHORITY_SETTING,
    LONGEST_LIFETIME,
    MAX_BODY_BYTES,
    ImdsTokenCredential,
    TokenError,
    parse_token,
)
from sebridge.retry import Backoff
from tests.support.budget import examples
from tests.support.http_peers import HttpPeer, Request, Style

pytestmark = pytest.mark.timeout(120)

SCOPE = "https://servicebus.azure.net//.default"  # what the Service Bus SDK asks for
RESOURCE = "https://servicebus.azure.net/"
CLIENT_ID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
TOKEN = "eyJ0eXAiOiJKV1QifQ.eyJhdWQiOiJzYiJ9.c2lnbmF0dXJl"
SLACK = 2.0  # seconds past a bound within which a request must have ended


def fast_backoff() -> Backoff:
    return Backoff(0.01, 0.05, floor=0.0)


def token_body(expires_on: int, **extra: object) -> bytes:
    content = {
        "access_token": TOKEN,
        "expires_on": str(expires_on),
        "expires_in": str(expires_on - int(time.time())),
        "resource": RESOURCE,
        "token_type": "Bearer",
        **extra,
    }
    return json.dumps(content).encode()


def query(request: Request) -> dict[str, list[str]]:
    return parse_qs(urlsplit(request.target).query, keep_blank_values=True)


class Clock:
    """A wall clock the test moves."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake() -> Iterator[FakeIdentity]:
    with FakeIdentity() as identity:
        yield identity


def credential(peer: HttpPeer, **options: object) -> ImdsTokenCredential:
    options.setdefault("backoff", fast_backoff())
    return ImdsTokenCredential(authority=peer.url, **options)  # type: ignore[arg-type]


# -- the request --------------------------------------------------------------------------------


def test_the_request_is_imds_s_with_the_resource_and_the_metadata_header() -> None:
    with HttpPeer(lambda r: (200, token_body(int(time.time()) + 3600))) as peer:
        with credential(peer, client_id=CLIENT_ID) as cred:
            token = cred.get_token(SCOPE)
        (request,) = peer.requests
    assert token.token == TOKEN
    assert request.method == "GET"
    assert urlsplit(request.target).path == "/metadata/identity/oauth2/token"
    assert query(request) == {
        "api-version": ["2018-02-01"],
        "resource": [RESOURCE],  # the scope without /.default
        "client_id": [CLIENT_ID],
    }
    assert request.headers["metadata"] == "true"


def test_the_system_assigned_identity_names_no_client_id() -> None:
    with HttpPeer(lambda r: (200, token_body(int(time.time()) + 3600))) as peer:
        with credential(peer) as cred:
            cred.get_token(SCOPE)
        (request,) = peer.requests
    assert "client_id" not in query(request)


def test_the_identity_fake_is_found_through_the_pod_identity_setting(fake: FakeIdentity) -> None:
    """As azure-identity reads AZURE_POD_IDENTITY_AUTHORITY_HOST (the benchmark's way)."""
    environ = fake.vm_environ()
    assert set(environ) == {AUTHORITY_SETTING}
    with ImdsTokenCredential(CLIENT_ID, environ=environ) as cred:
        assert cred.authority == fake.url
        token = cred.get_token(SCOPE)
        info = cred.get_token_info(SCOPE)
    claims = jwt_claims(token.token)
    assert claims["aud"] == RESOURCE
    assert claims["appid"] == CLIENT_ID
    assert claims["oid"] == FakeIdentity.object_id(CLIENT_ID)
    assert token.expires_on == claims["exp"]
    assert (info.token, info.expires_on, info.token_type) == (
        token.token,
        token.expires_on,
        "Bearer",
    )
    with ImdsTokenCredential(environ=environ) as cred:
        assert jwt_claims(cred.get_token(SCOPE).token)["appid"] == SYSTEM_ASSIGNED_CLIENT_ID


def test_without_the_setting_the_authority_is_imds_itself() -> None:
    # Only built, never asked: no traffic to 169.254.169.254 from a test.
    assert ImdsTokenCredential(environ={}).authority == "http://169.254.169.254"


def test_an_authority_that_is_no_http_url_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=AUTHORITY_SETTING):
        ImdsTokenCredential(environ={AUTHORITY_SETTING: "ftp://127.0.0.1"})
    env = {**os.environ, AUTHORITY_SETTING: "127.0.0.1:80"}  # no scheme: not a URL
    args = ["--namespace", "ns.example", "--imds-endpoint", "http://127.0.0.1:9"]
    proc = subprocess.run(
        [sys.executable, "-m", "sebridge.cli", "forwarder", *args, "--state-dir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"sebridge forwarder: {AUTHORITY_SETTING}: not an http(s) URL" in proc.stderr


@pytest.mark.parametrize(
    "client_id",
    ["not-a-guid", f"{CLIENT_ID}&resource=https://evil", f"{CLIENT_ID}\n", " " + CLIENT_ID],
)
def test_a_client_id_that_is_not_a_guid_never_reaches_a_url(client_id: str) -> None:
    with pytest.raises(ValueError, match="GUID"):
        ImdsTokenCredential(client_id, authority="http://127.0.0.1:9")
    with pytest.raises(ConfigError, match="--client-id"):
        parse_config(["--namespace", "ns.example", "--client-id", client_id], env={})


# -- the cache ----------------------------------------------------------------------------------


def test_the_token_is_cached_until_five_minutes_before_it_expires() -> None:
    clock = Clock()
    expires_on = int(clock.now) + 3600
    with HttpPeer(lambda r: (200, token_body(expires_on))) as peer:
        with credential(peer, clock=clock) as cred:
            first = cred.get_token(SCOPE)
            clock.now += 3600 - 301  # 301 s left
            assert cred.get_token(SCOPE) == first
            assert len(peer.requests) == 1
            clock.now += 2  # 299 s left: refreshed
            cred.get_token(SCOPE)
            assert len(peer.requests) == 2


def test_refresh_in_is_honoured_and_a_long_token_is_refreshed_at_half_life() -> None:
    clock = Clock()
    now = int(clock.now)
    answers = [token_body(now + 3600, refresh_in="600"), token_body(now + 86_400)]
    with HttpPeer(lambda r: (200, answers[min(len(peer.requests), 2) - 1])) as peer:
        with credential(peer, clock=clock) as cred:
            cred.get_token(SCOPE)
            clock.now = now + 599
            cred.get_token(SCOPE)
            assert len(peer.requests) == 1
            clock.now = now + 600  # refresh_in reached: a 24 h token now
            info = cred.get_token_info(SCOPE)
            assert len(peer.requests) == 2
            assert info.refresh_on == now + 600 + (86_400 - 600) // 2
            clock.now = info.refresh_on - 1
            cred.get_token(SCOPE)
            assert len(peer.requests) == 2


def test_a_failed_refresh_keeps_the_valid_token_and_waits_30_s_before_the_next() -> None:
    clock = Clock()
    now = int(clock.now)
    status = [200]
    with HttpPeer(lambda r: (status[0], token_body(now + 3600))) as peer:
        with credential(peer, clock=clock, retry_seconds=0.5) as cred:
            first = cred.get_token(SCOPE)
            status[0] = 500
            clock.now = now + 3400  # inside the refresh window, still valid
            assert cred.get_token(SCOPE) == first
            tried = len(peer.requests)
            assert tried >= 2
            clock.now = now + 3420  # 20 s later: not asked again
            assert cred.get_token(SCOPE) == first
            assert len(peer.requests) == tried
            clock.now = now + 3600  # expired: the failure is the caller's
            with pytest.raises(TokenError, match="500"):
                cred.get_token(SCOPE)


def test_claims_skip_the_cache() -> None:
    with HttpPeer(lambda r: (200, token_body(int(time.time()) + 3600))) as peer:
        with credential(peer) as cred:
            cred.get_token(SCOPE)
            cred.get_token(SCOPE, claims='{"access_token": {}}')
            assert len(peer.requests) == 2


def test_concurrent_callers_make_one_request() -> None:
    def slow(request: Request) -> tuple[int, bytes]:
        time.sleep(0.3)
        return 200, token_body(int(time.time()) + 3600)

    with HttpPeer(slow) as peer:
        with credential(peer) as cred:
            start = threading.Barrier(8)
            got: list[str] = []

            def call() -> None:
                start.wait()
                got.append(cred.get_token(SCOPE).token)

            threads = [threading.Thread(target=call) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(10)
        assert got == [TOKEN] * 8
        assert len(peer.requests) == 1


def together(calls: int, call: Callable[[], object]) -> list[tuple[float, object]]:
    """``call`` on ``calls`` threads at once: each one's seconds and result (or exception)."""
    start = threading.Barrier(calls)
    out: list[tuple[float, object]] = []

    def run() -> None:
        start.wait()
        began = time.monotonic()
        try:
            result: object = call()
        except Exception as exc:
            result = exc
        out.append((time.monotonic() - began, result))

    threads = [threading.Thread(target=run) for _ in range(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(out) == calls
    return out


def test_a_valid_token_is_never_waited_for_while_imds_stalls() -> None:
    """Review 21's B1: a refresh against a stalled IMDS held every caller (the SDK's sender and
    the approvals receiver) for the whole retry budget, the second for two, although the
    cached token had minutes left. Now the refresh is one attempt, and nobody waits for it."""
    clock = Clock()
    now = int(clock.now)
    stalled, released = threading.Event(), threading.Event()

    def respond(request: Request) -> tuple[int, bytes]:
        if stalled.is_set():
            released.wait(30)  # never answers in time
        return 200, token_body(now + 3600)

    with HttpPeer(respond) as peer:
        with credential(peer, clock=clock, request_timeout=1.0, retry_seconds=20) as cred:
            first = cred.get_token(SCOPE)
            clock.now = now + 3350  # 250 s left: the refresh is due
            stalled.set()
            results = together(2, lambda: cred.get_token(SCOPE))
            assert [r for _, r in results] == [first, first]
            assert max(seconds for seconds, _ in results) < 1.0 + SLACK
            assert len(peer.requests) == 2  # the first token, one refresh attempt
            clock.now = now + 3370  # 20 s after: no new attempt yet, no wait
            began = time.monotonic()
            assert cred.get_token(SCOPE) == first
            assert time.monotonic() - began < 0.5
            assert len(peer.requests) == 2
            released.set()


def test_callers_without_a_token_share_one_budget_and_its_failure() -> None:
    """Review 21's B2: with IMDS answering 410, four callers failed after 2.1, 3.2, 4.5 and
    6.8 s of a 3 s budget, each waiting for the lock then starting a budget of its own."""
    gone = json.dumps({"error": "gone", "error_description": "updating"}).encode()
    with HttpPeer(lambda r: (410, gone)) as peer:
        with credential(peer, retry_seconds=3.0) as cred:
            results = together(4, lambda: cred.get_token(SCOPE))
    assert all(isinstance(r, TokenError) and "410" in str(r) for _, r in results), results
    assert max(seconds for seconds, _ in results) < 3.0 + SLACK
    assert len({id(r) for _, r in results}) == 1  # one answer, shared


def test_a_budget_that_ends_during_an_attempt_still_says_what_imds_last_answered() -> None:
    """CI under load: the last attempt began with the budget's last milliseconds and was cut, so
    the error said only "did not answer", not the 410 an operator can act on."""
    gone = json.dumps({"error": "gone", "error_description": "updating"}).encode()
    asked = [0]

    def respond(request: Request) -> tuple[int, bytes]:
        asked[0] += 1
        if asked[0] > 1:
            time.sleep(3)  # later attempts outlast the 1 s budget
        return 410, gone

    with HttpPeer(respond) as peer:
        with credential(peer, retry_seconds=1.0) as cred:
            with pytest.raises(TokenError) as caught:
                cred.get_token(SCOPE)
    assert "did not answer" in str(caught.value), caught.value
    assert "410" in str(caught.value) and caught.value.status == 410, caught.value


@pytest.mark.parametrize(
    "authority", ["http://127.0.0.1:1/a\r\nX-Injected: 1", "http://127.0.0.1:1/a b"]
)
def test_an_authority_with_spaces_or_control_characters_is_refused(authority: str) -> None:
    with pytest.raises(ValueError, match=AUTHORITY_SETTING):
        ImdsTokenCredential(authority=authority)


# -- transient and permanent answers ------------------------------------------------------------


def failing_first(times: int, status: int) -> Callable[[Request], tuple[int, bytes]]:
    count = [0]

    def respond(request: Request) -> tuple[int, bytes]:
        count[0] += 1
        if count[0] <= times:
            return status, json.dumps({"error": "busy", "error_description": "later"}).encode()
        return 200, token_body(int(time.time()) + 3600)

    return respond


@pytest.mark.parametrize("status", [404, 410, 429, 500, 503])
def test_transient_answers_are_retried_then_the_token_comes(status: int) -> None:
    with HttpPeer(failing_first(3, status)) as peer:
        with credential(peer) as cred:
            assert cred.get_token(SCOPE).token == TOKEN
        assert len(peer.requests) == 4


def test_a_connection_refused_is_retried_within_the_bound() -> None:
    with HttpPeer(lambda r: (200, b"")) as peer:
        url = peer.url  # then closed: nothing listens there any more
    cred = ImdsTokenCredential(authority=url, retry_seconds=1.0, backoff=fast_backoff())
    started = time.monotonic()
    with pytest.raises(TokenError) as caught:
        cred.get_token(SCOPE)
    assert time.monotonic() - started < 1.0 + SLACK
    assert caught.value.transient
    assert "IMDS did not answer" in str(caught.value)
    assert cred.requests >= 2  # retried, not given up at once


def test_a_peer_that_always_fails_is_not_retried_forever() -> None:
    body = json.dumps({"error": "unavailable", "error_description": "IMDS is being updated"})
    with HttpPeer(lambda r: (500, body.encode())) as peer:
        with credential(peer, retry_seconds=1.5) as cred:
            started = time.monotonic()
            with pytest.raises(TokenError) as caught:
                cred.get_token(SCOPE)
            took = time.monotonic() - started
        assert took < 1.5 + SLACK
        assert len(peer.requests) >= 3
    message = str(caught.value)
    assert "500" in message and "IMDS is being updated" in message
    assert caught.value.status == 500 and caught.value.transient


@pytest.mark.parametrize(
    ("status", "description"),
    [
        (400, "Identity not found"),
        (401, "Unauthorized"),
        (403, "A socket operation was attempted to an unreachable network"),
    ],
)
def test_a_permanent_refusal_is_one_request_and_a_clear_error(
    status: int, description: str
) -> None:
    body = json.dumps({"error": "invalid_request", "error_description": description}).encode()
    with HttpPeer(lambda r: (status, body)) as peer:
        with credential(peer, client_id=CLIENT_ID) as cred:
            with pytest.raises(TokenError) as caught:
                cred.get_token(SCOPE)
        assert len(peer.requests) == 1
    message = str(caught.value)
    assert f"IMDS answered {status}" in message and description in message
    assert caught.value.status == status and not caught.value.transient
    if status == 400:
        assert CLIENT_ID in message  # which identity is missing


@pytest.mark.parametrize(
    "body",
    [
        b"<html>proxy error</html>",
        b"[]",
        json.dumps({"access_token": 7, "expires_on": "1"}).encode(),
        json.dumps({"expires_on": "1795000000"}).encode(),  # no token
        json.dumps({"access_token": TOKEN, "expires_on": "soon"}).encode(),
        json.dumps({"access_token": TOKEN, "expires_on": "1"}).encode(),
        json.dumps({"access_token": TOKEN}).encode(),
    ],
)
def test_an_odd_answer_is_one_request_and_never_shows_the_token(body: bytes) -> None:
    with HttpPeer(lambda r: (200, body)) as peer:
        with credential(peer) as cred:
            with pytest.raises(TokenError) as caught:
                cred.get_token(SCOPE)
        assert len(peer.requests) == 1
    assert "IMDS answered 200" in str(caught.value)
    assert TOKEN not in str(caught.value)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
NOW = 1_795_000_000


@settings(max_examples=examples(300), deadline=None)
@given(
    token=st.one_of(
        st.just(TOKEN),
        st.none(),
        st.integers(),
        st.floats(),
        st.just(""),
        st.lists(st.text()),
        st.text(),
    ),
    expires_on=st.one_of(
        st.none(),
        st.booleans(),
        st.floats(allow_nan=True),
        st.integers(),
        st.text(max_size=30),
        st.integers().map(str),
        _JSON,
    ),
)
def test_odd_tokens_and_expiries_are_refused_or_sane(token: object, expires_on: object) -> None:
    """Whatever IMDS sends, parse_token gives a token that is a non-empty string expiring
    within LONGEST_LIFETIME from now, or a TokenError that does not carry the token."""
    body = json.dumps({"access_token": token, "expires_on": expires_on}).encode()
    try:
        parsed = parse_token(body, NOW)
    except TokenError as exc:
        assert TOKEN not in str(exc)
        return
    assert isinstance(parsed.token, str) and parsed.token == token and token
    assert NOW < parsed.expires_on <= NOW + LONGEST_LIFETIME
    assert isinstance(parsed.expires_on, int) and not isinstance(parsed.expires_on, bool)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=_JSON)
def test_any_json_is_a_token_or_a_clear_error(content: object) -> None:
    try:
        parsed = parse_token(json.dumps(content).encode(), NOW)
    except TokenError as exc:
        assert exc.status == 200 and not exc.transient
        return
    assert isinstance(content, dict) and content["access_token"] == parsed.token


# -- stalled, trickling and oversized peers -----------------------------------------------------


@pytest.mark.parametrize(
    "style",
    [Style(answer=False), Style(trickle_headers=0.3), Style(trickle_body=0.3)],
    ids=str,
)
def test_a_peer_that_stalls_or_trickles_ends_by_the_deadline(style: Style) -> None:
    with HttpPeer(lambda r: (200, token_body(int(time.time()) + 3600)), style) as peer:
        with credential(peer, request_timeout=1.0, retry_seconds=2.5) as cred:
            started = time.monotonic()
            with pytest.raises(TokenError, match="no managed identity token within") as caught:
                cred.get_token(SCOPE)
            took = time.monotonic() - started
    assert took < 2.5 + SLACK
    assert "DeadlineExceeded" in str(caught.value)


def test_an_oversized_body_is_refused_unread() -> None:
    huge = b'{"access_token": "' + b"a" * (MAX_BODY_BYTES * 4) + b'"}'
    with HttpPeer(lambda r: (200, huge), Style(framing="chunked")) as peer:
        with credential(peer) as cred:
            with pytest.raises(TokenError, match="larger than"):
                cred.get_token(SCOPE)
        assert len(peer.requests) == 1


def test_stopping_ends_a_retrying_request_at_once() -> None:
    stop = threading.Event()
    with HttpPeer(lambda r: (503, b"{}")) as peer:
        cred = ImdsTokenCredential(
            authority=peer.url, cancel=stop, backoff=Backoff(5.0, 5.0, floor=5.0)
        )
        threading.Timer(0.5, stop.set).start()
        started = time.monotonic()
        with pytest.raises(TokenError, match="stopping"):
            cred.get_token(SCOPE)
        assert time.monotonic() - started < 0.5 + SLACK


# -- choosing it ----------------------------------------------------------------------------------


def test_the_vm_s_identity_is_the_default_and_azure_identity_s_chain_a_setting() -> None:
    from sebridge.forwarder import signin

    assert parse_config(["--namespace", "ns.example"], env={}).credential == "managed-identity"
    chosen = parse_config(["--namespace", "ns.example"], env={"SEBRIDGE_CREDENTIAL": "default"})
    assert chosen.credential == "default"
    assert chosen.describe()["credential"] == "default"
    with pytest.raises(ConfigError, match="--credential"):
        parse_config(["--namespace", "ns.example"], env={"SEBRIDGE_CREDENTIAL": "az"})
    own = signin.credential("managed-identity", CLIENT_ID)
    assert isinstance(own, ImdsTokenCredential) and own.client_id == CLIENT_ID
    chain = signin.credential("default", CLIENT_ID)
    assert type(chain).__name__ == "DefaultAzureCredential"
