"""The forwarder's own reading of an answer and its kept request bytes
(sebridge.forwarder.net.wire), against http.client itself: for every answer http.client and RFC
9112 read alike, the same status, fields, framing and body, however the bytes arrive; where the
module says it reads differently (a line that is not a field, a folded line, a length that is
not digits, interim answers, chunking that is not HTTP), what it says. The exchange over a real
socket is tests/integration/test_http_client.py's.
"""

from __future__ import annotations

import http.client
import io
import itertools
import socket
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sebridge.forwarder.net import wire
from tests.support.budget import examples

TOKEN = st.text(string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~", min_size=1, max_size=12)
# A value as servers send them: visible characters and inner spaces, no surrounding blanks.
VALUE = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E) | st.just(" "), max_size=30
).map(lambda v: v.strip(" "))
FRAMING = st.sampled_from(
    [
        [],
        [("Content-Length", "0")],
        [("Content-Length", "17")],
        [("content-length", "123456")],
        [("Transfer-Encoding", "chunked")],
        [("Transfer-Encoding", "CHUNKED"), ("Content-Length", "5")],
        [("Transfer-Encoding", "gzip, chunked")],
        [("Connection", "close"), ("Content-Length", "3")],
        [("Connection", "keep-alive")],
        [("Keep-Alive", "timeout=5")],
        [("Proxy-Connection", "keep-alive"), ("Content-Length", "9")],
        [("Content-Length", "4"), ("Content-Length", "8")],
    ]
)
STATUS = st.sampled_from([200, 201, 204, 206, 304, 400, 404, 410, 429, 500, 503, 999])
VERSION = st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/0.9", "HTTP/1.2"])
METHOD = st.sampled_from(["GET", "POST", "HEAD"])


class _Socket:
    """What http.client.HTTPResponse needs of a socket: a file to read."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self.data))


class Pieces:
    """A peer's bytes as recv() returns them: in the pieces given, then the end of stream."""

    def __init__(self, data: bytes, sizes: list[int] | None = None) -> None:
        self.data = data
        self.sizes = list(sizes or [])

    def recv(self, size: int, /) -> bytes:
        piece = self.sizes.pop(0) if self.sizes else len(self.data)
        data, self.data = self.data[: min(size, piece)], self.data[min(size, piece) :]
        return data


def http_client_head(data: bytes, method: str) -> http.client.HTTPResponse:
    response = http.client.HTTPResponse(_Socket(data), method=method)  # type: ignore[arg-type]
    response.begin()
    return response


def head_of(data: bytes, method: str = "GET", sizes: list[int] | None = None) -> wire.Head:
    return wire.read_head(wire.Reader(Pieces(data, sizes)), method)


def answer_of(
    data: bytes, method: str = "GET", sizes: list[int] | None = None, cap: int = 1 << 20
) -> tuple[wire.Head, bytes, int]:
    """The head, the body and how many bytes were left unread."""
    reader = wire.Reader(Pieces(data, sizes))
    head = wire.read_head(reader, method)
    body = wire.read_body(reader, head, cap)
    return head, body, reader.pending + len(reader.sock.data)  # type: ignore[attr-defined]


def raw(status_line: str, fields: list[tuple[str, str]], body: bytes = b"") -> bytes:
    lines = [status_line, *(f"{name}: {value}" for name, value in fields)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("iso-8859-1") + body


@settings(max_examples=examples(400), deadline=None)
@given(
    version=VERSION,
    status=STATUS,
    reason=st.sampled_from(["OK", "", "Not Found", "Too Many Requests"]),
    names=st.lists(TOKEN, max_size=8),
    values=st.lists(VALUE, min_size=8, max_size=8),
    framing=FRAMING,
    method=METHOD,
    continued=st.booleans(),
    sizes=st.lists(st.integers(1, 40), max_size=20),
)
def test_a_well_formed_head_is_read_as_http_client_reads_it(
    version: str,
    status: int,
    reason: str,
    names: list[str],
    values: list[str],
    framing: list[tuple[str, str]],
    method: str,
    continued: bool,
    sizes: list[int],
) -> None:
    fields = [*zip(names, values, strict=False), *framing]
    status_line = f"{version} {status} {reason}".rstrip(" ") if reason else f"{version} {status}"
    data = raw(status_line, fields)
    if continued:  # a 100 Continue first, which both skip
        data = b"HTTP/1.1 100 Continue\r\nX-Skipped: yes\r\n\r\n" + data
    expected = http_client_head(data, method)
    head = head_of(data, method, sizes)
    no_body = status in (204, 304) or method == "HEAD"  # never chunked (RFC 9112, 6.3)
    assert (head.version, head.status, head.reason) == (
        expected.version,
        expected.status,
        expected.reason,
    )
    assert list(head.fields) == expected.getheaders() == fields
    assert (head.chunked, head.length, head.will_close) == (
        expected.chunked and not no_body,
        expected.length,
        expected.will_close,
    )


def test_a_line_that_is_not_a_field_is_skipped_and_the_fields_after_it_are_read() -> None:
    data = raw(
        "HTTP/1.1 200 OK",
        [("Server", "x")],
    ).replace(b"\r\n\r\n", b"\r\nthis is not a field\r\nBad Name: 1\r\n: empty name\r\n")
    data += b"Content-Length: 2\r\n\r\nok"
    head = head_of(data)
    assert head.fields == (("Server", "x"), ("Content-Length", "2"))
    assert (head.length, head.will_close) == (2, False)
    # http.client (through the email parser) ends the head at the first such line, so it
    # never sees the length and reads the body up to the close.
    assert http_client_head(data, "GET").length is None


def test_a_folded_line_continues_the_field_before_it_after_one_space() -> None:
    data = b"HTTP/1.1 200 OK\r\n  leading fold\r\nX-Long: one\r\n two\r\n\tthree \r\n\r\n"
    assert head_of(data).fields == (("X-Long", "one two three"),)


@pytest.mark.parametrize("value", ["+12", "1_2", " 12x", "-1", "0x10", "1\u00b2", ""])
def test_a_length_that_is_not_digits_is_no_length(value: str) -> None:
    head = head_of(raw("HTTP/1.1 200 OK", [("Content-Length", value)]))
    assert (head.length, head.will_close) == (None, True)  # read up to the close


def test_the_first_length_counts_as_in_http_client() -> None:
    head = head_of(raw("HTTP/1.1 200 OK", [("Content-Length", "4"), ("Content-Length", "9")]))
    assert head.length == 4


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", http.client.RemoteDisconnected),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", http.client.BadStatusLine),
        (b"HTTP/1.1\r\n\r\n", http.client.BadStatusLine),
        (b"HTTP/1.1 2000 OK\r\n\r\n", http.client.BadStatusLine),
        (b"HTTP/1.1 099 Low\r\n\r\n", http.client.BadStatusLine),
        (b"HTTP/1.1 +20 Sign\r\n\r\n", http.client.BadStatusLine),
        (b"HTTP/2.0 200 OK\r\n\r\n", http.client.UnknownProtocol),
        (b"HTTP/1.1 200 " + b"x" * wire.MAX_LINE + b"\r\n\r\n", http.client.LineTooLong),
        (b"HTTP/1.1 200 OK\r\nX: " + b"y" * wire.MAX_LINE + b"\r\n\r\n", http.client.LineTooLong),
    ],
    ids=[
        "empty",
        "not-http",
        "no-status",
        "4-digits",
        "below-100",
        "sign",
        "http2",
        "long",
        "field",
    ],
)
def test_a_head_that_is_not_http_is_refused_as_http_client_refuses_it(
    data: bytes, error: type[Exception]
) -> None:
    with pytest.raises(error):
        http_client_head(data, "GET")
    with pytest.raises(error):
        head_of(data)


@pytest.mark.parametrize("count", [wire.MAX_FIELDS, wire.MAX_FIELDS + 1])
def test_at_most_100_field_lines(count: int) -> None:
    data = raw("HTTP/1.1 204 No Content", [(f"X-{i}", "v") for i in range(count)])
    if count > wire.MAX_FIELDS:
        with pytest.raises(http.client.HTTPException, match="more than 100"):
            head_of(data)
    else:
        assert len(head_of(data).fields) == count


def test_a_stray_carriage_return_line_is_skipped() -> None:
    data = b"HTTP/1.1 200 OK\r\n\r\r\nContent-Length: 0\r\n\r\n"
    assert head_of(data).fields == (("Content-Length", "0"),)


@pytest.mark.parametrize(
    "data",
    [b"HTTP/1.0 200 OK\r\nServer: x", b"HTTP/1.1 200 OK\r\nContent-Le", b"HTTP/1.1 200 OK\r\n"],
    ids=["inside-a-line", "inside-a-name", "before-the-empty-line"],
)
def test_a_head_cut_before_its_empty_line_is_an_error(data: bytes) -> None:
    """http.client takes such a head as whole (an empty body follows, up to the close)."""
    with pytest.raises(http.client.IncompleteRead):
        head_of(data)


@pytest.mark.parametrize(
    ("value", "length"),
    [("1" * 4400, wire.LONGEST), ("0" * 30 + "5", 5), ("9" * 19, wire.LONGEST), ("0", 0)],
    ids=["4400-digits", "leading-zeros", "19-digits", "zero"],
)
def test_a_length_of_any_number_of_digits_is_read(value: str, length: int) -> None:
    """int() refuses more than 4,300 digits: such a length once escaped as a ValueError."""
    assert head_of(raw("HTTP/1.1 200 OK", [("Content-Length", value)])).length == length
    if length > 100:
        with pytest.raises(wire.BodyTooLarge):
            answer_of(raw("HTTP/1.1 200 OK", [("Content-Length", value)], b"{}"), cap=100)


# -- the reader ---------------------------------------------------------------------------------


@settings(max_examples=examples(300), deadline=None)
@given(
    data=st.binary(max_size=400).map(lambda b: b.replace(b"\x00", b"\n")),
    sizes=st.lists(st.integers(1, 50), max_size=40),
    operations=st.lists(
        st.tuples(st.sampled_from(["line", "read"]), st.integers(1, 80)), max_size=40
    ),
)
def test_the_reader_gives_every_byte_once_in_order_however_it_arrives(
    data: bytes, sizes: list[int], operations: list[tuple[str, int]]
) -> None:
    """Lines as a buffered file's readline(limit) gives them; reads of 1 to n bytes (none
    only at the end); what is pending is what is left."""
    reader = wire.Reader(Pieces(data, sizes))
    model = io.BytesIO(data)
    got = b""
    for operation, size in operations:
        if operation == "line":
            line = reader.readline(size)
            assert line == model.readline(size)
        else:
            line = reader.read(size)
            assert 1 <= len(line) <= size or model.tell() == len(data)
            assert line == model.read(len(line))
        got += line
    assert got == data[: len(got)]
    assert reader.pending + len(reader.sock.data) == len(data) - len(got)  # type: ignore[attr-defined]


# -- the body ----------------------------------------------------------------------------------


def chunked(body: bytes, cuts: list[int], extension: bool, trailer: bool) -> bytes:
    """``body`` chunked at ``cuts``, as a server may write it."""
    edges = sorted({0, len(body), *(c % (len(body) + 1) for c in cuts)})
    out = b""
    for start, end in itertools.pairwise(edges):
        ext = b";name=value" if extension else b""
        out += b"%x%s\r\n%s\r\n" % (end - start, ext, body[start:end])
    return out + b"0\r\n" + (b"X-Trailer: 1\r\n" if trailer else b"") + b"\r\n"


@settings(max_examples=examples(400), deadline=None)
@given(
    body=st.binary(max_size=300),
    framing=st.sampled_from(["sized", "chunked", "close"]),
    cuts=st.lists(st.integers(0, 300), max_size=6),
    extension=st.booleans(),
    trailer=st.booleans(),
    sizes=st.lists(st.integers(1, 64), max_size=30),
    after=st.sampled_from([b"", b"HTTP/1.1 200 OK\r\n\r\n"]),
)
def test_a_body_is_read_as_http_client_reads_it_however_it_arrives(
    body: bytes,
    framing: str,
    cuts: list[int],
    extension: bool,
    trailer: bool,
    sizes: list[int],
    after: bytes,
) -> None:
    if framing == "sized":
        data = raw("HTTP/1.1 200 OK", [("Content-Length", str(len(body)))], body) + after
    elif framing == "chunked":
        head = raw("HTTP/1.1 200 OK", [("Transfer-Encoding", "chunked")])
        data = head + chunked(body, cuts, extension, trailer) + after
    else:
        data, after = raw("HTTP/1.0 200 OK", [], body), b""  # nothing can follow the close
    expected = http_client_head(data, "GET").read()
    answer, read, left = answer_of(data, sizes=sizes)
    assert read == expected == body
    assert left == len(after)  # what came after the answer is left, and seen
    assert answer.will_close == (framing == "close")


@pytest.mark.parametrize("framing", ["sized", "chunked", "close"])
@pytest.mark.parametrize("size", [99, 100, 101])
def test_a_body_is_read_up_to_the_cap_and_no_further(framing: str, size: int) -> None:
    body = b"x" * size
    if framing == "sized":
        data = raw("HTTP/1.1 200 OK", [("Content-Length", str(size))], body)
    elif framing == "chunked":
        data = raw("HTTP/1.1 200 OK", [("Transfer-Encoding", "chunked")]) + chunked(
            body, [30], False, False
        )
    else:
        data = raw("HTTP/1.0 200 OK", [], body)
    if size > 100:
        with pytest.raises(wire.BodyTooLarge):
            answer_of(data, cap=100)
    else:
        assert answer_of(data, cap=100)[1] == body


def test_a_sized_body_above_the_cap_is_refused_before_it_is_read() -> None:
    reader = wire.Reader(Pieces(raw("HTTP/1.1 200 OK", [("Content-Length", "10")], b"x" * 10)))
    head = wire.read_head(reader, "GET")
    with pytest.raises(wire.BodyTooLarge, match="Content-Length 10 > 9"):
        wire.read_body(reader, head, 9)
    assert reader.pending + len(reader.sock.data) == 10  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "data",
    [
        raw("HTTP/1.1 200 OK", [("Content-Length", "10")], b"short"),
        raw("HTTP/1.1 200 OK", [("Transfer-Encoding", "chunked")], b"a\r\nshort"),
        raw("HTTP/1.1 200 OK", [("Transfer-Encoding", "chunked")], b"5\r\nshort\r\n"),
        raw("HTTP/1.1 200 OK", [("Transfer-Encoding", "chunked")], b"5\r\nshort\r\n0"),
    ],
    ids=["sized", "in-a-chunk", "no-last-chunk", "last-chunk-cut"],
)
def test_a_body_that_ends_short_is_an_error_not_an_answer(data: bytes) -> None:
    with pytest.raises(http.client.IncompleteRead):
        answer_of(data)


@pytest.mark.parametrize(
    "chunks",
    [
        b"0x5\r\nhello\r\n0\r\n\r\n",
        b"+5\r\nhello\r\n0\r\n\r\n",
        b"zz\r\n",
        b"\r\n",
        b"1" * 17 + b"\r\n",
        b"5\r\nhello!\r\n0\r\n\r\n",
    ],
    ids=["0x", "sign", "not-hex", "empty", "17-digits", "data-past-its-size"],
)
def test_chunking_that_is_not_http_is_refused(chunks: bytes) -> None:
    data = raw("HTTP/1.1 200 OK", [("Transfer-Encoding", "chunked")]) + chunks
    with pytest.raises(http.client.HTTPException):
        answer_of(data)


def test_a_chunk_size_may_have_any_number_of_leading_zeros() -> None:
    data = raw("HTTP/1.1 200 OK", [("Transfer-Encoding", "chunked")])
    assert answer_of(data + b"0" * 40 + b"5\r\nhello\r\n0\r\n\r\n")[1] == b"hello"


@pytest.mark.parametrize("count", [wire.MAX_CHUNKS - 1, wire.MAX_CHUNKS])
def test_at_most_65536_chunks_the_last_one_included(count: int) -> None:
    """One-byte chunks cost a turn of the loop each: their number is bounded, as the fields'
    is (the body's own cap bounds its bytes, not the turns)."""
    data = raw("HTTP/1.1 200 OK", [("Transfer-Encoding", "chunked")])
    data += b"1\r\nx\r\n" * count + b"0\r\n\r\n"
    if count < wire.MAX_CHUNKS:
        assert answer_of(data, sizes=[7] * 1000)[1] == b"x" * count
    else:
        with pytest.raises(http.client.HTTPException, match="more than 65536 chunks"):
            answer_of(data)


@pytest.mark.parametrize("status", [204, 304])
def test_a_bodiless_status_has_no_body_even_said_to_be_chunked(status: int) -> None:
    data = raw(f"HTTP/1.1 {status} X", [("Transfer-Encoding", "chunked")]) + b"HTTP/1.1 200"
    head, body, left = answer_of(data)
    assert (head.chunked, head.length, body, left) == (False, 0, b"", len(b"HTTP/1.1 200"))


def test_interim_answers_are_skipped_and_101_ends_the_connection() -> None:
    early = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n"
    head, body, _ = answer_of(early + raw("HTTP/1.1 200 OK", [("Content-Length", "2")], b"ok"))
    assert (head.status, body) == (200, b"ok")
    switched = answer_of(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\nnot http")
    assert (switched[0].status, switched[0].will_close, switched[1]) == (101, True, b"")
    with pytest.raises(http.client.HTTPException, match="interim"):
        head_of(b"HTTP/1.1 103 Early Hints\r\n\r\n" * (wire.MAX_FIELDS + 1))


# -- the request bytes --------------------------------------------------------------------------


def sent_by_http_client(
    host: str, port: int, method: str, target: str, headers: dict[str, str], body: bytes | None
) -> bytes:
    """What http.client itself writes to a socket for this request."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        connection = http.client.HTTPConnection(host, port)
        connection.sock = ours
        connection.request(method, target, body=body, headers=headers)
        ours.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := theirs.recv(65536):
            received += chunk
        return received


@settings(max_examples=examples(200), deadline=None)
@given(
    method=METHOD,
    target=st.text(string.ascii_letters + string.digits + "/?=&-._~%", max_size=40).map(
        lambda t: "/" + t
    ),
    headers=st.dictionaries(TOKEN, VALUE, max_size=5),
    body=st.none() | st.binary(max_size=64),
    host=st.sampled_from([("127.0.0.1", 80), ("127.0.0.1", 8080), ("::1", 5000)]),
)
def test_a_request_is_the_bytes_http_client_would_send(
    method: str,
    target: str,
    headers: dict[str, str],
    body: bytes | None,
    host: tuple[str, int],
) -> None:
    requests = wire.RequestBytes(host[0], host[1], 80)
    expected = sent_by_http_client(host[0], host[1], method, target, headers, body)
    assert requests.format(method, target, headers, body) == expected
    assert requests.format(method, target, headers, body) == expected  # kept, or made again


def test_a_bodiless_request_is_formatted_once_and_at_most_32_are_kept() -> None:
    requests = wire.RequestBytes("169.254.169.254", 80, 80)
    first = requests.format("GET", "/metadata/scheduledevents", {"Metadata": "true"}, None)
    assert b"Host: 169.254.169.254\r\n" in first  # the default port is not written
    assert requests.format("GET", "/metadata/scheduledevents", {"Metadata": "true"}, None) is first
    posted = requests.format("POST", "/metadata/scheduledevents", {}, b"{}")
    assert requests.format("POST", "/metadata/scheduledevents", {}, b"{}") is not posted
    for i in range(40):  # beyond the bound: each still right, the oldest kept
        assert requests.format("GET", f"/{i}", {}, None).startswith(f"GET /{i} HTTP/1.1".encode())
    assert requests.format("GET", "/metadata/scheduledevents", {"Metadata": "true"}, None) is first
    assert len(requests._kept) == 32  # the bound is what is tested


@pytest.mark.parametrize(
    ("target", "headers", "error"),
    [
        ("/a b", {}, "InvalidURL"),
        ("/a\r\nX-Injected: 1", {}, "InvalidURL"),
        ("/sant\u00e9", {}, "UnicodeEncodeError"),
        ("/", {"X-Split": "a\r\nX-Injected: 1"}, "ValueError"),
        ("/", {"Bad:Name": "1"}, "ValueError"),
        ("/", {"X-Name": "\u0100"}, "UnicodeEncodeError"),
    ],
    ids=["space", "crlf-target", "non-ascii-target", "crlf-value", "colon-name", "non-latin1"],
)
def test_a_request_http_client_would_not_send_is_refused(
    target: str, headers: dict[str, str], error: str
) -> None:
    """Each of http.client's refusals is one error, saying which it was."""
    with pytest.raises(wire.Unsendable, match=f"^{error}: "):
        wire.RequestBytes("127.0.0.1", 80, 80).format("GET", target, headers, None)
