"""The Function App: one blueprint per workflow in functions/ (Python v2 programming model).

Each workflow is one folder holding its trigger (``blueprint.py``) and its core (``core.py``,
plain Python with ports and no I/O of its own). Settings are validated here, at start: a bad
one stops the app with an error naming it. Which workflows run follows from the settings
(``functions.shared.settings.workflows``); one line at start says which are on and why any is
off.
Spans go to Application Insights when ``APPLICATIONINSIGHTS_CONNECTION_STRING`` is set
(functions.shared.tracing).
"""

import logging
import os

import azure.functions as func

from functions import custom_example
from functions.approval_gate.blueprint import bp as approval_gate
from functions.eventgrid_ingest.blueprint import bp as eventgrid_ingest
from functions.history.blueprint import bp as history
from functions.lb_pools.blueprint import bp as lb_pools
from functions.lb_pools.moments_blueprint import bp as drain_moments
from functions.shared import composition, tracing
from functions.shared.settings import workflows, workflows_line
from functions.teams.blueprint import bp as teams
from functions.webhooks.blueprint import bp as webhooks

settings = composition.settings()
# Spans to Application Insights when APPLICATIONINSIGHTS_CONNECTION_STRING is set (once).
tracing.configure(os.environ)

BLUEPRINTS = {
    "teams": teams,
    "lb_pools": lb_pools,
    "approval_gate": approval_gate,  # and the approve link (HTTP)
    "drain_moments": drain_moments,  # lb-pools' scheduled drains
    "webhooks": webhooks,
    "custom_example": custom_example.bp,
    "eventgrid_ingest": eventgrid_ingest,
    "history": history,
}

app = func.FunctionApp()
for workflow in workflows(settings):
    if workflow.on:
        app.register_functions(BLUEPRINTS[workflow.name])
logging.getLogger("sebridge.functions").info(workflows_line(settings))
