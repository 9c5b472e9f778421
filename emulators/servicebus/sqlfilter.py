"""The SQL filter subset of Service Bus subscription rules: tokenizer, recursive-descent parser,
three-valued evaluator. Pure: no I/O.

Supported: ``= <> != < > <= >=``, ``[NOT] IN (...)``, ``[NOT] LIKE 'p%_' [ESCAPE 'c']``,
``IS [NOT] NULL``, ``AND OR NOT``, parentheses, string/number/boolean/NULL literals, ``TRUE``,
``FALSE``, ``1=1``; identifiers ``name``, ``user.name``, ``[name]`` and ``sys.<Property>``.
Anything else (arithmetic, EXISTS, functions) raises FilterSyntaxError when the rule is loaded,
so a config is never honoured half-way. Like Service Bus, a comparison with a missing property is
unknown (NULL) and only a TRUE result selects the message.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# sys.* names a filter may use, mapped to the key the broker fills in MessageFacts.system.
SYSTEM_PROPERTIES = {
    "label": "subject",
    "subject": "subject",
    "messageid": "message_id",
    "sessionid": "session_id",
    "correlationid": "correlation_id",
    "to": "to",
    "replyto": "reply_to",
    "replytosessionid": "reply_to_session_id",
    "contenttype": "content_type",
}


class FilterSyntaxError(ValueError):
    """A SQL filter expression this emulator cannot honour."""


@dataclass(frozen=True)
class MessageFacts:
    """What a filter can see of a message: application properties and system properties."""

    application: Mapping[str, Any] = field(default_factory=dict)
    system: Mapping[str, Any] = field(default_factory=dict)


Evaluator = Callable[[MessageFacts], Any]  # returns a value, or True/False/None for predicates

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<string>'(?:[^']|'')*')
    | (?P<number>-?\d+\.\d*(?:[eE][+-]?\d+)?|-?\.\d+(?:[eE][+-]?\d+)?|-?\d+(?:[eE][+-]?\d+)?)
    | (?P<op><>|!=|<=|>=|=|<|>|\(|\)|,)
    | (?P<bracket>\[[^\]]+\])
    | (?P<word>[A-Za-z_@$][A-Za-z0-9_@$]*(?:\.[A-Za-z_@$][A-Za-z0-9_@$]*)?)
    )""",
    re.VERBOSE,
)
_KEYWORDS = {"AND", "OR", "NOT", "IN", "LIKE", "ESCAPE", "IS", "NULL", "TRUE", "FALSE"}
_UNSUPPORTED_KEYWORDS = {"EXISTS", "BETWEEN", "SET", "REMOVE", "CASE", "WHEN", "SELECT"}


@dataclass(frozen=True)
class _Token:
    kind: str  # string, number, op, ident, kw, end
    text: str
    pos: int


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if not match or match.end() == pos:
            snippet = text[pos:].strip()[:20]
            raise FilterSyntaxError(f"unsupported syntax at position {pos}: {snippet!r}")
        kind = match.lastgroup or ""
        raw = match.group(kind)
        start = match.start(kind)
        if kind == "word":
            upper = raw.upper()
            if upper in _UNSUPPORTED_KEYWORDS:
                raise FilterSyntaxError(f"{upper} is not supported (position {start})")
            if upper in _KEYWORDS:
                tokens.append(_Token("kw", upper, start))
            else:
                tokens.append(_Token("ident", raw, start))
        elif kind == "bracket":
            tokens.append(_Token("ident", raw, start))
        else:
            tokens.append(_Token(kind, raw, start))
        pos = match.end()
    tokens.append(_Token("end", "", len(text)))
    return tokens


def _three_and(a: Any, b: Any) -> bool | None:
    if a is False or b is False:
        return False
    if a is True and b is True:
        return True
    return None


def _three_or(a: Any, b: Any) -> bool | None:
    if a is True or b is True:
        return True
    if a is False and b is False:
        return False
    return None


def _comparable(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return False
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool)
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers):
        return True
    if isinstance(a, str) and isinstance(b, str):  # str, or an AMQP symbol (a str subclass)
        return True
    return type(a) is type(b)


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda a, b: bool(a == b),
    "<>": lambda a, b: bool(a != b),
    "!=": lambda a, b: bool(a != b),
    "<": lambda a, b: bool(a < b),
    ">": lambda a, b: bool(a > b),
    "<=": lambda a, b: bool(a <= b),
    ">=": lambda a, b: bool(a >= b),
}


def _like_regex(pattern: str, escape: str | None) -> re.Pattern[str]:
    out: list[str] = []
    chars = iter(pattern)
    for ch in chars:
        if escape is not None and ch == escape:
            nxt = next(chars, None)
            if nxt is None:
                raise FilterSyntaxError(f"LIKE pattern {pattern!r} ends with its escape character")
            out.append(re.escape(nxt))
        elif ch == "%":
            out.append(".*")
        elif ch == "_":
            out.append(".")
        else:
            out.append(re.escape(ch))
    return re.compile("".join(out), re.DOTALL)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0

    def peek(self, offset: int = 0) -> _Token:
        return self.tokens[min(self.i + offset, len(self.tokens) - 1)]

    def take(self) -> _Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def accept(self, kind: str, text: str | None = None) -> bool:
        tok = self.peek()
        if tok.kind == kind and (text is None or tok.text == text):
            self.i += 1
            return True
        return False

    def expect(self, kind: str, text: str | None = None) -> _Token:
        tok = self.peek()
        if tok.kind != kind or (text is not None and tok.text != text):
            want = text or kind
            got = tok.text or "end of expression"
            raise FilterSyntaxError(f"expected {want} at position {tok.pos}, got {got!r}")
        return self.take()

    def parse(self) -> Evaluator:
        if self.peek().kind == "end":
            raise FilterSyntaxError("empty expression")
        expr = self.or_expr()
        tok = self.peek()
        if tok.kind != "end":
            raise FilterSyntaxError(f"unexpected {tok.text!r} at position {tok.pos}")
        return expr

    def or_expr(self) -> Evaluator:
        left = self.and_expr()
        while self.accept("kw", "OR"):
            right = self.and_expr()
            left = (lambda a, b: lambda m: _three_or(a(m), b(m)))(left, right)
        return left

    def and_expr(self) -> Evaluator:
        left = self.not_expr()
        while self.accept("kw", "AND"):
            right = self.not_expr()
            left = (lambda a, b: lambda m: _three_and(a(m), b(m)))(left, right)
        return left

    def not_expr(self) -> Evaluator:
        if self.accept("kw", "NOT"):
            inner = self.not_expr()

            def negate(m: MessageFacts) -> bool | None:
                value = inner(m)
                return None if value is None else not value

            return negate
        return self.predicate()

    def predicate(self) -> Evaluator:
        tok = self.peek()
        if tok.kind == "op" and tok.text == "(":
            self.take()
            inner = self.or_expr()
            self.expect("op", ")")
            return inner
        if tok.kind == "kw" and tok.text in {"TRUE", "FALSE"} and not self._is_comparison_next(1):
            self.take()
            value = tok.text == "TRUE"
            return lambda m: value
        left = self.operand()
        nxt = self.peek()
        if nxt.kind == "op" and nxt.text in _COMPARE:
            self.take()
            right = self.operand()
            compare = _COMPARE[nxt.text]

            def comparison(m: MessageFacts) -> bool | None:
                a, b = left(m), right(m)
                if not _comparable(a, b):
                    return None
                return compare(a, b)

            return comparison
        negated = False
        if nxt.kind == "kw" and nxt.text == "NOT" and self.peek(1).text in {"IN", "LIKE"}:
            self.take()
            negated = True
            nxt = self.peek()
        if self.accept("kw", "IN"):
            return self._in(left, negated)
        if self.accept("kw", "LIKE"):
            return self._like(left, negated)
        if self.accept("kw", "IS"):
            is_not = self.accept("kw", "NOT")
            self.expect("kw", "NULL")
            if is_not:
                return lambda m: left(m) is not None
            return lambda m: left(m) is None
        raise FilterSyntaxError(
            f"expected a comparison, IN, LIKE or IS after operand at position {nxt.pos}, "
            f"got {nxt.text or 'end of expression'!r}"
        )

    def _is_comparison_next(self, offset: int) -> bool:
        tok = self.peek(offset)
        return (tok.kind == "op" and tok.text in _COMPARE) or (
            tok.kind == "kw" and tok.text in {"IN", "LIKE", "IS", "NOT"} and offset == 1
        )

    def _in(self, left: Evaluator, negated: bool) -> Evaluator:
        self.expect("op", "(")
        values = [self.literal()]
        while self.accept("op", ","):
            values.append(self.literal())
        self.expect("op", ")")

        def membership(m: MessageFacts) -> bool | None:
            value = left(m)
            if value is None:
                return None
            found = any(_comparable(value, v) and value == v for v in values)
            return not found if negated else found

        return membership

    def _like(self, left: Evaluator, negated: bool) -> Evaluator:
        pattern_tok = self.expect("string")
        escape: str | None = None
        if self.accept("kw", "ESCAPE"):
            escape = _unquote(self.expect("string").text)
            if len(escape) != 1:
                raise FilterSyntaxError(f"ESCAPE takes one character, got {escape!r}")
        regex = _like_regex(_unquote(pattern_tok.text), escape)

        def like(m: MessageFacts) -> bool | None:
            value = left(m)
            if not isinstance(value, str):
                return None
            found = regex.fullmatch(value) is not None
            return not found if negated else found

        return like

    def literal(self) -> Any:
        tok = self.take()
        if tok.kind == "string":
            return _unquote(tok.text)
        if tok.kind == "number":
            return _number(tok.text)
        if tok.kind == "kw" and tok.text in {"TRUE", "FALSE"}:
            return tok.text == "TRUE"
        raise FilterSyntaxError(f"expected a literal at position {tok.pos}, got {tok.text!r}")

    def operand(self) -> Evaluator:
        tok = self.peek()
        if tok.kind == "ident":
            self.take()
            return _identifier(tok)
        if tok.kind == "kw" and tok.text == "NULL":
            self.take()
            return lambda m: None
        value = self.literal()
        return lambda m: value


def _unquote(text: str) -> str:
    return text[1:-1].replace("''", "'")


def _number(text: str) -> int | float:
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return float(text)


def _identifier(tok: _Token) -> Evaluator:
    name = tok.text
    if name.startswith("["):
        key = name[1:-1]
        return lambda m: m.application.get(key)
    scope, _, rest = name.partition(".")
    if rest:
        if scope.lower() == "sys":
            canonical = SYSTEM_PROPERTIES.get(rest.lower())
            if canonical is None:
                raise FilterSyntaxError(
                    f"unsupported system property sys.{rest} at position {tok.pos} "
                    f"(supported: {', '.join(sorted(SYSTEM_PROPERTIES))})"
                )
            return lambda m: m.system.get(canonical)
        if scope.lower() == "user":
            return lambda m: m.application.get(rest)
        raise FilterSyntaxError(f"unknown property scope {scope!r} at position {tok.pos}")
    return lambda m: m.application.get(name)


@dataclass(frozen=True)
class SqlFilter:
    """A compiled SQL filter; ``matches`` is True only when the expression is TRUE."""

    expression: str
    _evaluate: Evaluator = field(repr=False, compare=False)

    def matches(self, facts: MessageFacts) -> bool:
        return self._evaluate(facts) is True


def compile_sql_filter(expression: str) -> SqlFilter:
    """Parse ``expression``; raise FilterSyntaxError naming the problem if unsupported."""
    if not isinstance(expression, str):
        raise FilterSyntaxError(f"SqlExpression must be a string, got {expression!r}")
    return SqlFilter(expression, _Parser(expression).parse())


@dataclass(frozen=True)
class CorrelationFilter:
    """Equality on the given system properties and application properties (all must match)."""

    system: Mapping[str, Any]
    application: Mapping[str, Any]

    def matches(self, facts: MessageFacts) -> bool:
        for key, want in self.system.items():
            if facts.system.get(key) != want:
                return False
        for key, want in self.application.items():
            got = facts.application.get(key)
            if got != want or not _comparable(got, want):
                return False
        return True


class TrueFilter:
    def matches(self, facts: MessageFacts) -> bool:
        return True


class FalseFilter:
    def matches(self, facts: MessageFacts) -> bool:
        return False
