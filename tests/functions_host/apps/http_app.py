"""HTTP triggered test functions: echo, failures, plain strings, optional parameters."""

from __future__ import annotations

import json

import azure.functions as func

app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)
bp = func.Blueprint()


@bp.route(route="echo/{name}/{id:int?}", methods=["GET", "POST"])
def echo(req: func.HttpRequest) -> func.HttpResponse:
    document = {
        "method": req.method,
        "url": req.url,
        "params": dict(req.params),
        "route_params": dict(req.route_params),
        "header": req.headers.get("x-test-header"),
        "body": req.get_body().decode(),
    }
    return func.HttpResponse(
        json.dumps(document),
        status_code=201,
        mimetype="application/json",
        headers={"x-echo": "yes"},
    )


@bp.route(route="boom")
def boom(req: func.HttpRequest) -> func.HttpResponse:
    raise ValueError("boom on purpose")


@bp.route(route="plain", methods=["GET"])
def plain(req: func.HttpRequest) -> str:
    return "just text"


@bp.route(route="files/{*path}", methods=["GET"])
def files(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(req.route_params.get("path", ""))


app.register_blueprint(bp)
