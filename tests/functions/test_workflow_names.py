"""Azure's name rules: one module (functions/shared/names.py), asked by every place that checks a
name, and each rule at its limits (issue 23, finding 5: the ingestion and the scope check each had
their own copy, and an 80-character availability set passed one and failed the other)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from functions.shared import names

ROOT = Path(__file__).resolve().parents[2]

# What a copy of a name rule looks like in a regular expression: the characters Azure allows in
# names (letters, digits, `_`, `.`, `-`, parentheses), or the lengths of its rules.
LOOKS_LIKE_A_NAME_RULE = re.compile(r"_\.|\\w\\-\.|-\\w\.|\\w\.\(|\{0,(?:62|63|78|79|89)\}")
# Regular expressions that only look like one, and why.
NOT_A_NAME_RULE = {
    # AGENTLESS_VM_PATTERNS: the syntax of a shell-style pattern (wildcards among the characters).
    ("functions/shared/settings.py", "_PATTERN"),
}
# Every module that checks a name from outside (a message, a notification, a setting, a URL).
CHECKERS = (
    "functions/shared/scope.py",
    "functions/shared/settings.py",
    "functions/adapters/arm.py",
    "functions/eventgrid_ingest/notification.py",
    "functions/approval_gate/tokens.py",
)


def _compiled_patterns(path: Path) -> list[tuple[str, str]]:
    """(variable, pattern) for every ``NAME = re.compile("...")`` in a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
            continue
        call = node.value
        if not (isinstance(call.func, ast.Attribute) and call.func.attr == "compile"):
            continue
        if not call.args or not isinstance(call.args[0], ast.Constant):
            continue
        target = node.targets[0]
        name = target.id if isinstance(target, ast.Name) else "?"
        found.append((name, str(call.args[0].value)))
    return found


def test_no_second_copy_of_a_name_rule() -> None:
    copies = []
    for path in sorted((ROOT / "functions").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative == "functions/shared/names.py":
            continue
        for variable, pattern in _compiled_patterns(path):
            if (relative, variable) in NOT_A_NAME_RULE:
                continue
            if LOOKS_LIKE_A_NAME_RULE.search(pattern):
                copies.append(f"{relative}: {variable} = {pattern!r}")
    assert not copies, "name rules belong in functions/shared/names.py:\n" + "\n".join(copies)
    # The heuristic finds the rules where they are (it would find a copy).
    own = [p for _, p in _compiled_patterns(ROOT / "functions/shared/names.py")]
    assert sum(bool(LOOKS_LIKE_A_NAME_RULE.search(p)) for p in own) >= 2


@pytest.mark.parametrize("module", CHECKERS)
def test_every_place_that_checks_a_name_asks_the_names_module(module: str) -> None:
    tree = ast.parse((ROOT / module).read_text())
    imported = {
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert ("functions.shared", "names") in imported, (
        f"{module} does not use functions.shared.names"
    )


A = "a"
RULES = [
    # (rule, longest valid, a valid name, invalid names)
    (names.VIRTUAL_MACHINE, 64, "web-1", ["-web", "web.", "web-", "a/b", "a b", "..", "é"]),
    (names.SCALE_SET, 64, "web_ss.1", ["-ss", "ss.", "a?b"]),
    (names.AVAILABILITY_SET, 80, "as-web_1", ["_as", "as.", "as-", "a/b"]),
    (names.NETWORK_INTERFACE, 80, "web-1-nic", [".nic", "nic-", "a%2fb"]),
    (names.LOAD_BALANCER, 80, "lb-web", ["-lb", "lb."]),
    (names.BACKEND_POOL, 80, "pool-a", ["-pool", "pool."]),
    (names.RESOURCE_GROUP, 90, "rg-(web).1", ["rg.", "rg/x", "rg?x", "rg x"]),
]


@pytest.mark.parametrize(("rule", "longest", "good", "bad"), RULES, ids=lambda v: str(v)[:20])
def test_each_rule_at_its_limits(rule: names.Rule, longest: int, good: str, bad: list[str]) -> None:
    assert rule.check(good, "f") == good
    assert rule.valid(good[0] + A * (longest - 2) + "1")
    with pytest.raises(names.InvalidName, match=f"longer than {longest} characters"):
        rule.check(good[0] + A * (longest - 1) + "1", "f")
    for name in ["", *bad]:
        assert not rule.valid(name), name


def test_a_uniform_instance_and_unicode_groups() -> None:
    assert names.VIRTUAL_MACHINE.valid("web_12")  # <scaleSet>_<instanceId>, as IMDS names it
    assert names.RESOURCE_GROUP.valid("rg-café")  # Azure allows Unicode letters in groups
    assert names.instance_id("12") == "12" and not names.INSTANCE_ID.valid("1a")
    assert names.is_subscription_id("00000000-0000-4000-8000-000000000001")
    assert not names.is_subscription_id("00000000000040008000000000000001")
