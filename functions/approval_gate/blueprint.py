"""approval-gate: the policy on the approval-gate subscription, and the Approve link."""

from __future__ import annotations

from urllib.parse import parse_qs

import azure.functions as func

from functions.approval_gate import link as approval_link
from functions.shared import composition
from functions.shared.triggers import service_bus_function
from functions.shared.verified import VerifiedMessage
from functions.teams.core import APPROVE_ROUTE

bp = func.Blueprint()  # type: ignore[no-untyped-call]
MAX_FORM_BYTES = 4096


@service_bus_function(bp, "approval_gate", "%ApprovalGateSubscriptionName%")
def approval_gate(message: VerifiedMessage) -> None:
    deps = composition.dependencies()
    deps.gate.decide(message, deps.clock())


def _html(page: approval_link.Page) -> func.HttpResponse:
    return func.HttpResponse(
        page.html,
        status_code=page.status,
        mimetype="text/html",
        charset="utf-8",
        headers={
            "Cache-Control": "no-store",
            "Referrer-Policy": "no-referrer",
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'none'; form-action 'self'",
        },
    )


# Anonymous on purpose: the signed token is the credential (a function key in a Teams card
# would be a long-lived secret for every function of the app).
@bp.function_name("approve")
@bp.route(route=APPROVE_ROUTE, methods=["GET", "POST"], auth_level=func.AuthLevel.ANONYMOUS)
def approve(req: func.HttpRequest) -> func.HttpResponse:
    deps = composition.dependencies()
    key, now = deps.settings.approval_signing_key, deps.clock()
    params = dict(req.params)
    if req.method.upper() == "POST":
        raw = req.get_body()[: MAX_FORM_BYTES + 1]
        if len(raw) > MAX_FORM_BYTES:
            return _html(approval_link.Page(413, "form too large"))
        form = parse_qs(raw.decode("utf-8", "replace"))
        params.update({k: v[0] for k, v in form.items() if v})
    token, event_id = params.get("token", ""), params.get("eventId")
    if req.method.upper() == "POST":
        return _html(
            approval_link.approve(
                key, token, event_id, now, deps.commands, deps.arm, deps.capacity_guard
            )
        )
    return _html(approval_link.confirm_page(key, token, event_id, now))
