"""The fleet maintenance workbook: it parses, main.bicep deploys it behind a parameter, and
every field its queries read is one the history's summary line carries."""

from __future__ import annotations

import json
import re
from datetime import timedelta

from infra_helpers import INFRA, module, parse, resources_of_type, unwrap

from functions.history.core import SUMMARY_PREFIX, entry_for, summarize, summary_line
from tests.functions.history_support import T0, Lifecycle, verified

WORKBOOK = INFRA / "modules" / "workbook.json"


def _queries() -> dict[str, str]:
    document = json.loads(WORKBOOK.read_text())
    assert document["version"] == "Notebook/1.0"
    return {
        item["content"]["title"]: item["content"]["query"]
        for item in document["items"]
        if item["type"] == 3
    }


def _logged_fields() -> set[str]:
    life = Lifecycle()
    life.transition("Scheduled")
    life.held()
    life.prepared()
    life.approved()
    life.transition("Started")
    life.transition("Completed", impact={"measuredSeconds": 3, "method": "reboot-gap"})
    entries = [e for m in life.messages if (e := entry_for(verified(m), T0))]
    summary = summarize(entries)
    assert summary is not None
    return set(summary_line(summary))


def test_the_workbook_shows_what_the_issue_asks_for() -> None:
    assert set(_queries()) == {
        "Events by type and state",
        "Notice given",
        "Announced against measured impact",
        "Announced against measured impact, per event",
        "Held events",
        "Time from notice to approval",
    }


def test_every_query_reads_the_summary_lines_and_only_fields_they_carry() -> None:
    logged = _logged_fields()
    prefix = SUMMARY_PREFIX
    for title, query in _queries().items():
        assert f'startswith "{prefix}"' in query and f'strlen("{prefix}")' in query, title
        used = set(re.findall(r"\bline\.(\w+)", query))
        assert used, title
        assert used <= logged, f"{title}: {sorted(used - logged)} are never logged"


def test_main_deploys_the_workbook_behind_a_parameter_over_app_insights() -> None:
    main = parse(INFRA / "main.bicep")
    assert main["parameters"]["workbookEnabled"]["default"] is True
    text = (INFRA / "main.bicep").read_text()
    assert "module workbook 'modules/workbook.bicep' = if (workbookEnabled)" in text
    tree = module("workbook.bicep")
    (workbook,) = resources_of_type(tree, "Microsoft.Insights/workbooks").values()
    body = unwrap(workbook)
    assert body["kind"] == "shared"
    assert body["properties"]["category"] == "workbook"
    assert "loadTextContent('workbook.json')" in (INFRA / "modules" / "workbook.bicep").read_text()


def test_the_summary_line_is_logged_for_each_summary_written(caplog) -> None:  # type: ignore[no-untyped-def]
    from functions.history.core import History, PurgeSchedule
    from tests.functions.history_support import MemoryHistoryStore

    life = Lifecycle()
    life.transition("Scheduled")
    history = History(MemoryHistoryStore(), timedelta(days=90), PurgeSchedule())
    caplog.set_level("INFO", logger="sebridge.functions.history.summary")
    message = life.messages[0]
    history.record(verified(message), T0)
    history.record(verified(message), T0)  # no change
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(SUMMARY_PREFIX)]
    assert len(lines) == 1
    assert set(json.loads(lines[0].removeprefix(SUMMARY_PREFIX))) == _logged_fields()
