"""Issue 22 item 11: text from IMDS never drives the operator's terminal.

The real `sebridge forwarder` (text logs) reads events whose EventType and Description carry
ESC sequences (clear the screen, cursor home, then a fake ``HEALTHY``), a carriage return, bidi
overrides and a line break with a forged log record, and an error body carrying the same; then
the real `sebridge status` reads its state directory. Every line either prints has no raw
control, escape or bidi character, and the hostile text is still there, escaped. (Line breaks
inside a record: tests/unit/test_text.py.)
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from emulators.processes import forwarder
from tests.integration.test_forwarder_faults import reboot, wait_for_message
from tests.support.imds_stub import ImdsStub
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
CLEAR_AND_LIE = "\x1b[2J\x1b[H HEALTHY"
FORGED_RECORD = "\n2026-01-01T00:00:00.000+00:00 INFO    forwarder: all is well"
HOSTILE = f"{CLEAR_AND_LIE}\rHEALTHY \u202eYLHTLAEH\u202c \u2066x\u2069 \x07\x9b31m{FORGED_RECORD}"


def raw_controls(text: str) -> list[str]:
    """The characters of ``text`` that are not printable, line breaks aside."""
    return sorted({c for c in text if not c.isprintable() and c != "\n"})


@pytest.mark.timeout(90)
def test_hostile_imds_text_is_escaped_in_the_text_log_and_in_status(tmp_path: Path) -> None:
    state = tmp_path / "state"
    event = reboot(str(uuid.uuid4()), EventType=f"Reboot{CLEAR_AND_LIE}", Description=HOSTILE)
    with ImdsStub() as imds:
        imds.set_events([event])
        with forwarder(imds.url, state, "--log-format", "text") as fw:
            wait_for_message(fw, event["EventId"], 30, "Scheduled")
            imds.error_body = HOSTILE.encode()
            imds.mode = "500"
            assert fw.wait_for(lambda _: "poll failed" in fw.stderr_text(), 20)
            wait_until(
                lambda: "YLHTLAEH" in (state / "status.json").read_text(),
                30,
                "the error in status.json",
            )
            log = fw.stderr_text()
            proc = subprocess.run(
                [sys.executable, "-m", "sebridge.cli", "status", "--state-dir", str(state)],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=REPO,
                check=False,
            )
    out = proc.stdout
    assert raw_controls(out) == [], out
    assert raw_controls(log) == [], log[-3000:]
    # Still there to read, escaped: the event's type, and the error body in "last error".
    assert "Reboot\\x1b[2J\\x1b[H HEALTHY" in out
    assert "last error: IMDS answered 500" in out and "\\u202eYLHTLAEH\\u202c" in out, out
    assert "Reboot\\x1b[2J" in log and "\\u202eYLHTLAEH" in log
