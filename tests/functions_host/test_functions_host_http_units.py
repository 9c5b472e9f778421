"""Route templates and the HTTP request/response conversion through azure.functions (no I/O)."""

from __future__ import annotations

import json
from pathlib import Path

import azure.functions as func
import pytest
from apps import http_app

from emulators.functions_host import loader
from emulators.functions_host.bindings import discover
from emulators.functions_host.http_server import (
    HttpFunction,
    RouteError,
    build_request,
    build_response,
    compile_route,
    match_route,
)
from emulators.functions_host.invoke import FunctionInvoker


@pytest.mark.parametrize(
    ("prefix", "template", "path", "expected"),
    [
        ("api", "echo/{name}", "/api/echo/bob", {"name": "bob"}),
        ("api", "echo/{name}", "/API/Echo/bob/", {"name": "bob"}),
        ("api", "echo/{name}", "/api/echo", None),
        ("api", "echo/{name}/{id:int?}", "/api/echo/a/7", {"name": "a", "id": "7"}),
        ("api", "echo/{name}/{id:int?}", "/api/echo/a", {"name": "a"}),
        ("api", "echo/{name}/{id:int?}", "/api/echo/a/x", None),
        (
            "",
            "items/{id:guid}",
            "/items/0f8fad5b-d9cb-469f-a165-70867728950e",
            {"id": "0f8fad5b-d9cb-469f-a165-70867728950e"},
        ),
        ("api", "files/{*path}", "/api/files/a/b/c.txt", {"path": "a/b/c.txt"}),
        ("api", "v{version:int}/x", "/api/v2/x", {"version": "2"}),
        ("api", "a%20b/{x}", "/api/a%20b/y", {"x": "y"}),
    ],
)
def test_route_templates(
    prefix: str, template: str, path: str, expected: dict[str, str] | None
) -> None:
    route = compile_route(prefix, template)
    found = route.pattern.match(path)
    if expected is None:
        assert found is None
        return
    assert found is not None
    params = {n: found.group(f"p{i}") for i, n in enumerate(route.names) if found.group(f"p{i}")}
    assert params == expected


def test_duplicate_route_parameter_is_refused() -> None:
    with pytest.raises(RouteError):
        compile_route("api", "{a}/{a}")


def _http_functions() -> list[HttpFunction]:
    indexed = loader.index(loader.find_app(http_app), Path("."))
    by_name = {f.metadata.name: f for f in indexed}
    result = []
    for spec in discover([f.metadata for f in indexed], {}):
        invoker = FunctionInvoker(spec, by_name[spec.name].user_function, Path("."))
        route = compile_route("api", spec.trigger.route)  # type: ignore[union-attr]
        result.append(HttpFunction(spec, spec.trigger, invoker, route))  # type: ignore[arg-type]
    return result


def test_method_filter_and_route_params_decode() -> None:
    functions = _http_functions()
    found = match_route(functions, "POST", "/api/echo/J%C3%BCrgen/3")
    assert found is not None
    function, params = found
    assert function.spec.name == "echo" and params == {"name": "Jürgen", "id": "3"}
    assert match_route(functions, "DELETE", "/api/echo/x") is None
    assert match_route(functions, "POST", "/api/plain") is None


def test_request_is_built_by_the_azure_functions_converter() -> None:
    request = build_request(
        "post",
        "http://127.0.0.1:1/api/echo/a?x=1&x=2&y=",
        {"X-Test-Header": "v", "Content-Type": "application/json"},
        {"name": "a"},
        b'{"k": 1}',
    )
    assert isinstance(request, func.HttpRequest)
    assert request.method == "POST"
    assert request.params == {"x": "1,2", "y": ""}
    assert request.route_params == {"name": "a"}
    assert request.headers["x-test-header"] == "v"
    assert request.get_json() == {"k": 1}


def test_responses_from_each_kind_of_return_value() -> None:
    response = build_response(
        func.HttpResponse(
            json.dumps({"a": 1}), status_code=202, headers={"X-A": "b"}, mimetype="application/json"
        )
    )
    headers = {k.lower(): v for k, v in response.headers}
    assert response.status == 202
    assert headers["x-a"] == "b" and headers["content-type"] == "application/json"
    assert json.loads(response.body) == {"a": 1}

    text = build_response("hello")
    assert (text.status, text.body) == (200, b"hello")
    assert build_response(None).status == 204
    with pytest.raises(NotImplementedError):
        build_response(42)
