"""The Approve link's endpoint: check the signed token, then send the command (core).

GET only shows a confirmation page with a form; POST approves. Link-preview bots and mail
scanners fetch URLs with GET, so following a link never approves anything by itself.
"""

from __future__ import annotations

import html
import logging
from dataclasses import dataclass
from datetime import datetime

from functions.approval_gate import tokens
from functions.shared.ports import ArmClient, CommandSender
from sebridge.contract.commands import approve_command

log = logging.getLogger("sebridge.functions.approve")

REQUESTED_BY = "teams-approval-link"


@dataclass(frozen=True)
class Page:
    status: int
    html: str


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta name='robots' content='noindex'>"
        f"<title>{html.escape(title)}</title></head><body><h1>{html.escape(title)}</h1>"
        f"{body}</body></html>"
    )


def _check(key: bytes, token: str, event_id: str | None, now: datetime) -> tokens.ApprovalClaims:
    return tokens.verify(key, token, now, expected_event_id=event_id or None)


def confirm_page(key: bytes, token: str, event_id: str | None, now: datetime) -> Page:
    try:
        claims = _check(key, token, event_id, now)
    except tokens.TokenError as exc:
        log.warning("approval link refused: %s", exc)
        return Page(403, _page("Link not valid", f"<p>{html.escape(str(exc))}.</p>"))
    form = (
        f"<p>Start maintenance event <code>{html.escape(claims.event_id)}</code> on the VMs "
        f"reported by <code>{html.escape(claims.vm_name)}</code> now, instead of at "
        f"{html.escape(claims.expires_at.isoformat())}?</p>"
        "<form method='post'>"
        f"<input type='hidden' name='token' value='{html.escape(token, quote=True)}'>"
        f"<input type='hidden' name='eventId' value='{html.escape(claims.event_id)}'>"
        "<button type='submit'>Approve</button></form>"
    )
    return Page(200, _page("Approve maintenance", form))


def approve(
    key: bytes,
    token: str,
    event_id: str | None,
    now: datetime,
    commands: CommandSender,
    arm: ArmClient | None = None,
) -> Page:
    try:
        claims = _check(key, token, event_id, now)
    except tokens.TokenError as exc:
        log.warning("approval refused: %s", exc)
        return Page(403, _page("Not approved", f"<p>{html.escape(str(exc))}.</p>"))
    if claims.acknowledge_on:
        # No forwarder takes a command for this VM (agentless): ARM's acknowledge API, on the
        # id the app signed into the token (never one from the request).
        if arm is None:
            raise RuntimeError("an ARM client is needed to approve through ARM")
        arm.acknowledge_event(claims.acknowledge_on, claims.event_id)
        log.info(
            "approved from Teams through ARM",
            extra={"eventId": claims.event_id, "vm": claims.vm_name},
        )
        return Page(200, _page("Approved", "<p>Azure has the approval.</p>"))
    command = approve_command(
        claims.event_id, REQUESTED_BY, "approved from the Teams card", claims.expires_at
    )
    commands.send(command, claims.vm_name)  # message_id approve:<id>: a second click is a no-op
    log.info("approved from Teams", extra={"eventId": claims.event_id, "vm": claims.vm_name})
    return Page(200, _page("Approved", "<p>The approval is on its way to the VM.</p>"))
