"""A FunctionApp with Service Bus triggers (blueprint) and one HTTP trigger of its own."""

from __future__ import annotations

import azure.functions as func

from apps.sb_blueprint import bp

app = func.FunctionApp(http_auth_level=func.AuthLevel.ANONYMOUS)
app.register_blueprint(bp)


@app.route(route="ping", methods=["GET"])
def ping(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse("pong")
