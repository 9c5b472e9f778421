"""The Function App: one blueprint per workflow in functions/ (Python v2 programming model).

Each workflow is one folder holding its trigger (``blueprint.py``) and its core (``core.py``,
plain Python with ports and no I/O of its own). Settings are validated here, at start: a bad
one stops the app with an error naming it.
"""

import azure.functions as func

from functions import custom_example
from functions.approval_gate.blueprint import bp as approval_gate
from functions.eventgrid_ingest.blueprint import bp as eventgrid_ingest
from functions.history.blueprint import bp as history
from functions.lb_pools.blueprint import bp as lb_pools
from functions.shared import composition
from functions.teams.blueprint import bp as teams
from functions.webhooks.blueprint import bp as webhooks

settings = composition.settings()

app = func.FunctionApp()
app.register_functions(teams)
app.register_functions(lb_pools)
app.register_functions(approval_gate)
if settings.custom_subscriber_enabled:
    app.register_functions(custom_example.bp)
if settings.webhooks_subscription:
    app.register_functions(webhooks)
if settings.eventgrid_ingest_enabled:
    app.register_functions(eventgrid_ingest)
if settings.history_subscription:
    app.register_functions(history)
