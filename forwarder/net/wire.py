"""HTTP/1.1 on the wire for the forwarder's one HTTP client (:mod:`.client`): the bytes of a
request, and an answer (its head, then its body) read from the connection.

Why not all of it through http.client: an idle poll is one small request and one small answer a
second. http.client validates and formats the same request again each time, parses every
answer's header fields with the ``email`` package (a feed parser, policy objects and a dozen
regular expressions for five lines), and wraps the socket in a new buffered file and response
object for each answer. At 1 Hz, with every cache cold, that was 0.42 ms of CPU a request
against 0.29 ms this way (benchmarks/forwarder_poll.py measures the whole forwarder). Here:

- a request is formatted by http.client itself (its validation of the method, the target and
  every header, its ``Host`` and ``Accept-Encoding``), captured instead of sent, and a request
  without a body is kept, so the next identical one costs a dictionary look-up;
- a connection's bytes are read through one :class:`Reader` for its whole life, which also
  tells what arrived beyond an answer (a connection with such bytes is never used again: its
  next answer could be this one's);
- an answer's head is read within http.client's own limits (a line of at most 65,536 bytes, at
  most 100 header fields) and framed as http.client frames it: chunked, sized or up to the
  close; whether the connection closes after the answer. Unlike http.client, every interim
  answer (1xx) before the final one is skipped, not only a ``100 Continue`` (RFC 9110, 15.2); a
  ``101 Switching Protocols`` ends the connection; and a 204, a 304 or the answer to a HEAD has
  no body even when it says it is chunked (RFC 9112, 6.3: http.client would read chunks);
- the body is read up to the caller's cap and no further; a head that ends before its empty
  line, or a sized or chunked body that ends short, is an error, never an answer;
- whatever the peer sends, reading it costs a bounded amount of work: every byte is copied a
  bounded number of times however the peer splits it, a body has at most 65,536 chunks, and a
  Content-Length of any number of digits is read (more than 18 count as 10**18, above any cap).

Where the head is not as RFC 9112 wants it, it is read as a tolerant client reads it, never
given up on as a whole:

- a field line continued on the next (obsolete line folding: the next line starts with a space
  or a tab) gets the continuation appended after one space (RFC 9112, 5.2);
- a line that is not a field (no colon, an empty name, whitespace in the name) is skipped and
  the fields after it are still read (through the ``email`` parser, http.client ends the head at
  such a line and ignores every field after it, its ``Content-Length`` among them);
- a ``Content-Length`` that is not digits alone is no length at all, as http.client treats one
  that ``int()`` refuses: the body is read up to the close (never past the caller's cap), where
  http.client would have taken ``+12`` or ``1_2`` as a length;
- a chunk size must be hexadecimal digits (any number of leading zeros; an extension after
  ``;`` is ignored), and the line after a chunk's data must be empty; anything else ends the
  answer as not HTTP (http.client takes ``0x1f`` or `` +1f`` as sizes and never looks at the
  line after the data). A chunked body whose last chunk came is whole, even if the stream ends
  before the empty line after its trailer.
"""

from __future__ import annotations

import http.client
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

MAX_LINE = 65536  # bytes in the status line or one field line (http.client's _MAXLINE)
MAX_FIELDS = 100  # field lines in a head (http.client's _MAXHEADERS)
_CACHED_REQUESTS = 32  # distinct bodiless requests kept formatted per client
_BLANK = " \t"  # the whitespace around a field's value (RFC 9110, 5.5: OWS)
READ_SIZE = 64 * 1024  # bytes asked of the socket at a time
MAX_CHUNKS = 65536  # chunks in a chunked body: 1-byte chunks cost a loop turn each
LONGEST = 10**18  # what a Content-Length of more digits counts as
_HEX = frozenset(b"0123456789abcdefABCDEF")


class BodyTooLarge(Exception):
    """The answer's body is larger than the cap."""


class Unsendable(ValueError):
    """http.client would not send this request: a target with a space, a control character or
    a character outside ASCII, an illegal header name or value (the message says which)."""


@dataclass(frozen=True)
class Head:
    """What the status line and the header fields of an answer say."""

    version: int  # 10 (HTTP/1.0 or 0.9) or 11 (HTTP/1.x), as http.client counts
    status: int
    reason: str
    fields: tuple[tuple[str, str], ...]  # in order, names as sent
    chunked: bool
    length: int | None  # the body's size, None: up to the close or chunked
    will_close: bool  # the connection closes after this answer


# -- requests -----------------------------------------------------------------------------------


class _Capture(http.client.HTTPConnection):
    """http.client formatting a request into ``sent`` instead of a socket."""

    def __init__(self, host: str, port: int, default_port: int) -> None:
        super().__init__(host, port)
        self.default_port = default_port  # Host: without the port when it is the default
        self.sent = bytearray()

    def connect(self) -> None:  # never: nothing is sent from here
        raise http.client.HTTPException("a captured request never connects")

    def send(self, data: Any) -> None:
        self.sent += data


class RequestBytes:
    """Requests to one ``host``:``port`` formatted as http.client formats them; those without
    a body are kept (up to 32 distinct ones), so a poll's request is formatted once."""

    def __init__(self, host: str, port: int, default_port: int) -> None:
        self.host = host
        self.port = port
        self.default_port = default_port
        self._kept: dict[tuple[str, str, tuple[tuple[str, str], ...]], bytes] = {}

    def format(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None
    ) -> bytes:
        """The request's bytes. Raises :class:`Unsendable` where http.client's checks refuse
        it (they raise InvalidURL, ValueError or UnicodeEncodeError)."""
        key = (method, target, tuple(headers.items()))
        if body is None and (kept := self._kept.get(key)) is not None:
            return kept
        capture = _Capture(self.host, self.port, self.default_port)
        try:
            capture.request(method, target, body=body, headers=dict(headers))
        except (http.client.InvalidURL, ValueError) as exc:  # UnicodeEncodeError among them
            raise Unsendable(f"{type(exc).__name__}: {exc}") from exc
        data = bytes(capture.sent)
        if body is None and len(self._kept) < _CACHED_REQUESTS:
            self._kept[key] = data
        return data


# -- answers ------------------------------------------------------------------------------------


class Lines(Protocol):
    def readline(self, limit: int, /) -> bytes: ...


class Receiver(Protocol):
    def recv(self, size: int, /) -> bytes: ...


class Reader:
    """A connection's incoming bytes, read as lines and sized pieces through one buffer for the
    connection's whole life (``socket.makefile`` would need a file per answer to be sure of
    what belongs to which). ``pending`` is what arrived but was not read, ``received`` how many
    bytes arrived in all. Every byte is copied a bounded number of times, however the peer
    splits what it sends."""

    def __init__(self, sock: Receiver) -> None:
        self.sock = sock
        self.received = 0
        self._buffer = bytearray()
        self._at = 0  # where the unread bytes start in _buffer

    @property
    def pending(self) -> int:
        return len(self._buffer) - self._at

    def _fill(self) -> bool:
        """Receive once (blocking, within the socket's timeout); False at the end of stream."""
        if self._at and self._at >= len(self._buffer) // 2:  # drop what was read, at most
            del self._buffer[: self._at]  # as many bytes as were read since the last time
            self._at = 0
        chunk = self.sock.recv(READ_SIZE)
        self.received += len(chunk)
        self._buffer += chunk
        return bool(chunk)

    def readline(self, limit: int, /) -> bytes:
        """The next line with its end, or ``limit`` bytes of a longer one, or what is left
        before the end of stream (b"": nothing was)."""
        searched = 0  # of the unread bytes, those already looked at for an end of line
        while True:
            end = self._buffer.find(b"\n", self._at + searched, self._at + limit)
            if end >= 0:
                return self._take(end + 1 - self._at)
            if self.pending >= limit:
                return self._take(limit)
            searched = self.pending
            if not self._fill():
                return self._take(self.pending)

    def read(self, most: int) -> bytes:
        """At least one byte and at most ``most`` (b"": end of stream)."""
        if not self.pending and not self._fill():
            return b""
        return self._take(min(most, self.pending))

    def _take(self, count: int) -> bytes:
        data = bytes(self._buffer[self._at : self._at + count])
        self._at += count
        if self._at == len(self._buffer):
            self._buffer.clear()
            self._at = 0
        return data


def _line(fp: Lines, what: str) -> bytes:
    line = fp.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise http.client.LineTooLong(what)
    return line


def _status_line(fp: Lines) -> tuple[str, int, str]:
    """The version, status and reason, as http.client's ``_read_status`` reads them."""
    raw = _line(fp, "status line")
    if not raw:
        raise http.client.RemoteDisconnected("Remote end closed connection without response")
    line = raw.decode("iso-8859-1")
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise http.client.BadStatusLine(line)
    version, code = parts[0], parts[1]
    if not (len(code) == 3 and code.isascii() and code.isdigit()) or int(code) < 100:
        raise http.client.BadStatusLine(line)
    return version, int(code), parts[2].strip() if len(parts) == 3 else ""


def _field_lines(fp: Lines) -> list[tuple[str, str]]:
    """The header fields up to the empty line (an end of stream before it is IncompleteRead),
    see the module's docstring for what is skipped and how a folded line is read."""
    fields: list[tuple[str, str]] = []
    for _ in range(MAX_FIELDS + 1):
        raw = _line(fp, "header line")
        if raw in (b"\r\n", b"\n"):
            return fields
        if not raw:  # the peer closed before the empty line: what is missing is unknown
            raise http.client.IncompleteRead(b"", None)
        line = raw.decode("iso-8859-1").rstrip("\r\n")
        if not line:
            continue  # a stray carriage return: not a field line
        if line[0] in _BLANK:  # obsolete line folding: the previous field goes on
            if fields:
                name, value = fields[-1]
                more = line.strip(_BLANK)
                fields[-1] = (name, f"{value} {more}" if value and more else value or more)
            continue
        name, colon, value = line.partition(":")
        if not colon or not name or any(c in name for c in _BLANK):
            continue  # not a field line
        fields.append((name, value.strip(_BLANK)))
    raise http.client.HTTPException(f"got more than {MAX_FIELDS} headers")


def _first(fields: list[tuple[str, str]], name: str) -> str | None:
    """The first value of the field ``name`` (lower case), as http.client looks one up."""
    return next((v for k, v in fields if k.lower() == name), None)


def _content_length(value: str | None) -> int | None:
    """The length a Content-Length gives: None unless it is digits alone; a length of more
    than 18 digits (above any cap) counts as 10**18 (``int`` refuses over 4,300 digits)."""
    if value is None or not (value.isascii() and value.isdigit()):
        return None
    digits = value.lstrip("0")
    return int(digits or "0") if len(digits) <= 18 else LONGEST


def _closes(version: int, fields: list[tuple[str, str]]) -> bool:
    """Whether the peer closes the connection after this answer (http.client's
    ``_check_close``: HTTP/1.1 unless it says close, HTTP/1.0 unless it says keep-alive)."""
    connection = (_first(fields, "connection") or "").lower()
    if version == 11:
        return "close" in connection
    if _first(fields, "keep-alive") or "keep-alive" in connection:
        return False
    return "keep-alive" not in (_first(fields, "proxy-connection") or "").lower()


def read_head(fp: Lines, method: str) -> Head:
    """The head of the final answer to a ``method`` request, read from ``fp`` up to its body;
    interim answers (1xx but 101) before it are skipped, at most MAX_FIELDS of them. Raises
    http.client.HTTPException (a status line that is not HTTP, an unknown HTTP version, a line
    or a head over http.client's limits, a peer that closed before answering) or OSError."""
    for _ in range(MAX_FIELDS + 1):
        version_text, status, reason = _status_line(fp)
        if not 100 <= status < 200 or status == http.client.SWITCHING_PROTOCOLS:
            break
        _field_lines(fp)  # an interim answer's own fields
    else:
        raise http.client.HTTPException(f"more than {MAX_FIELDS} interim answers")
    if version_text in ("HTTP/1.0", "HTTP/0.9"):
        version = 10
    elif version_text.startswith("HTTP/1."):
        version = 11
    else:
        raise http.client.UnknownProtocol(version_text)
    fields = _field_lines(fp)
    encoding = _first(fields, "transfer-encoding")
    chunked = encoding is not None and encoding.lower() == "chunked"
    length = None if chunked else _content_length(_first(fields, "content-length"))
    if status in (204, 304) or 100 <= status < 200 or method == "HEAD":
        chunked, length = False, 0
    will_close = _closes(version, fields)
    if status == http.client.SWITCHING_PROTOCOLS or (not chunked and length is None):
        will_close = True  # the body ends with the close; after a 101 it is not HTTP
    return Head(version, status, reason, tuple(fields), chunked, length, will_close)


def _chunk_size(line: bytes) -> int:
    size = line.split(b";", 1)[0].strip(b" \t\r\n")
    if not size or not _HEX.issuperset(size) or len(size.lstrip(b"0")) > 16:
        raise http.client.HTTPException(f"not a chunk size: {line[:40]!r}")
    return int(size, 16)


def read_body(reader: Reader, head: Head, cap: int) -> bytes:
    """The body ``head`` frames, at most ``cap`` bytes. Raises BodyTooLarge,
    http.client.IncompleteRead (a sized or chunked body that ended short),
    http.client.HTTPException (chunking that is not HTTP) or OSError."""
    parts: list[bytes] = []
    if head.length is not None:
        if head.length > cap:
            raise BodyTooLarge(f"Content-Length {head.length} > {cap} bytes")
        _exactly(reader, head.length, parts)
        return b"".join(parts)
    if not head.chunked:
        return _up_to_the_close(reader, cap)
    size = 0
    for _ in range(MAX_CHUNKS):
        chunk = _chunk_size(_chunk_line(reader, "chunk size", parts))
        if not chunk:
            break
        size += chunk
        if size > cap:
            raise BodyTooLarge(f"body larger than {cap} bytes")
        _exactly(reader, chunk, parts)
        if _chunk_line(reader, "chunk end", parts) not in (b"\r\n", b"\n"):
            raise http.client.HTTPException("a chunk's data runs past its size")
    else:
        raise http.client.HTTPException(f"more than {MAX_CHUNKS} chunks")
    # The trailer fields, ignored; the body is whole (its last chunk came) even if the
    # stream ends before the empty line.
    for _ in range(MAX_FIELDS + 1):
        if _line(reader, "trailer line") in (b"\r\n", b"\n", b""):
            return b"".join(parts)
    raise http.client.HTTPException(f"got more than {MAX_FIELDS} trailer lines")


def _chunk_line(reader: Reader, what: str, parts: list[bytes]) -> bytes:
    line = _line(reader, what)
    if not line.endswith(b"\n"):  # the end of stream before the last chunk, or inside a line
        raise http.client.IncompleteRead(b"".join(parts))
    return line


def _exactly(reader: Reader, count: int, parts: list[bytes]) -> None:
    """Append the next ``count`` bytes to ``parts``."""
    left = count
    while left:
        data = reader.read(min(left, READ_SIZE))
        if not data:
            raise http.client.IncompleteRead(b"".join(parts), left)
        parts.append(data)
        left -= len(data)


def _up_to_the_close(reader: Reader, cap: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while data := reader.read(READ_SIZE):
        size += len(data)
        if size > cap:
            raise BodyTooLarge(f"body larger than {cap} bytes")
        parts.append(data)
    return b"".join(parts)
