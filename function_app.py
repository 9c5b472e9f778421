"""The Function App: one blueprint per workflow in functions/ (Python v2 programming model).

Settings are validated here, at start: a bad one stops the app with an error naming it.
"""

import azure.functions as func

from functions import approval_gate, composition, custom_example, lb_pools, teams

settings = composition.settings()

app = func.FunctionApp()
app.register_functions(teams.bp)
app.register_functions(lb_pools.bp)
app.register_functions(approval_gate.bp)
if settings.custom_subscriber_enabled:
    app.register_functions(custom_example.bp)
