"""The control plane's API reference (docs/reference/api.md), generated from its OpenAPI document.

:func:`api_reference` builds the application as ``scrape-fleet api`` does
(:func:`common.api.app.create_app` with the default settings and a Redis client that never
connects) and writes every path and method: the scope a token needs, the summary and
description, the parameters, the request body and the answers, then every schema the
bodies name, field by field. The scope is read from the route's dependencies
(:func:`common.api.deps.require`), since the OpenAPI document does not carry it: a route with
neither scope and not listed in :data:`ANONYMOUS` fails the generation, so a route that
forgot its token cannot reach the docs unnoticed. devtools/readme.py writes the page between
its ``api-reference`` markers; tests/test_docs.py checks that it is up to date.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

#: The only routes callable without a token: the probes' and the login (which makes one).
ANONYMOUS = {("GET", "/api/health"), ("POST", "/api/login")}
METHODS = ("get", "post", "put", "patch", "delete")


def build_app() -> Any:
    """The application with the default settings; its Redis client is never used here."""
    import redis

    from common.api.app import create_app
    from common.core.config import Settings

    return create_app(Settings(), client=redis.Redis(host="127.0.0.1", port=6379))


def route_scopes(app: Any) -> dict[tuple[str, str], str]:
    """(METHOD, path) -> the scope its token needs ("read", "admin"), or "none", for every
    route of the OpenAPI document (the UI's pages are not in it)."""
    from fastapi.routing import APIRoute, iter_route_contexts

    scopes: dict[tuple[str, str], str] = {}
    for route in iter_route_contexts(app.router.routes):
        if not isinstance(route.original_route, APIRoute) or not route.include_in_schema:
            continue
        scope = _scope(route.dependant)
        for method in route.methods or ():
            key = (method, route.path)
            if scope is None and key not in ANONYMOUS:
                raise ValueError(f"{method} {route.path} takes no token (Reader or Admin)")
            scopes[key] = scope or "none"
    return scopes


def _scope(dependant: Any) -> str | None:
    """The scope of the first :func:`require` dependency in the tree, if any."""
    for sub in dependant.dependencies:
        call = sub.call
        if getattr(call, "__qualname__", "") == "require.<locals>.dependency":
            return str(inspect.getclosurevars(call).nonlocals["scope"])
        found = _scope(sub)
        if found:
            return found
    return None


def api_reference() -> str:
    """The generated part of docs/reference/api.md."""
    app = build_app()
    document = app.openapi()
    scopes = route_scopes(app)
    schemas = document.get("components", {}).get("schemas", {})
    lines = [f"OpenAPI {document['openapi']}, {document['info']['title']} "
             f"{document['info']['version']}.", ""]
    lines += ["| Method | Path | Scope | Summary |", "|---|---|---|---|"]
    operations = [(path, method, op) for path, ops in document["paths"].items()
                  for method, op in ops.items() if method in METHODS]
    for path, method, op in operations:
        anchor = _op_anchor(method, path)
        lines.append(f"| {method.upper()} | [`{path}`](#{anchor}) | "
                     f"{scopes[(method.upper(), path)]} | {op.get('summary', '')} |")
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, method, op in operations:
        by_tag.setdefault((op.get("tags") or ["other"])[0], []).append((path, method, op))
    for tag, ops in by_tag.items():
        lines += ["", f"## {tag.capitalize()}"]
        for path, method, op in ops:
            lines += _operation(path, method, op, scopes[(method.upper(), path)])
    lines += ["", "## Schemas"]
    for name, schema in schemas.items():
        lines += _schema(name, schema)
    return "\n".join(lines)


def _operation(path: str, method: str, op: dict[str, Any], scope: str) -> list[str]:
    needs = "none (no token)" if scope == "none" else f"`{scope}`"
    lines = ["", f"### `{method.upper()} {path}` {{#{_op_anchor(method, path)}}}", "",
             f"**{op.get('summary', '')}**. Scope: {needs}."]
    if op.get("description"):
        lines += ["", _one_line(op["description"])]
    params = op.get("parameters", [])
    if params:
        lines += ["", "| Parameter | In | Type | Required | Default | Meaning |",
                  "|---|---|---|---|---|---|"]
        for param in params:
            schema = param.get("schema", {})
            default = f"`{json.dumps(schema['default'])}`" if "default" in schema else ""
            meaning = param.get("description") or schema.get("description", "")
            lines.append(f"| `{param['name']}` | {param['in']} | {_type(schema)} | "
                         f"{'yes' if param.get('required') else 'no'} | {default} | "
                         f"{_cell(meaning)} |")
    body = op.get("requestBody")
    if body:
        kinds = [f"{kind}: {_type(content.get('schema', {}))}"
                 for kind, content in body.get("content", {}).items()]
        lines += ["", f"Body ({'required' if body.get('required') else 'optional'}): "
                      f"{'; '.join(kinds)}."]
    lines += ["", "| Answer | Meaning |", "|---|---|"]
    for status, answer in op.get("responses", {}).items():
        kinds = [f"{kind}" + (f" {_type(c['schema'])}" if c.get("schema") else "")
                 for kind, c in answer.get("content", {}).items()]
        lines.append(f"| {status} | {_cell(answer.get('description', ''))}"
                     f"{' (' + ', '.join(kinds) + ')' if kinds else ''} |")
    return lines


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    lines = ["", f"### {name} {{#{_schema_anchor(name)}}}"]
    if schema.get("description"):
        lines += ["", _one_line(schema["description"])]
    properties = schema.get("properties", {})
    if not properties:
        return [*lines, "", f"Type: {_type(schema)}."]
    required = set(schema.get("required", []))
    lines += ["", "| Field | Type | Required | Default | Meaning |", "|---|---|---|---|---|"]
    for field, spec in properties.items():
        default = f"`{json.dumps(spec['default'])}`" if "default" in spec else ""
        lines.append(f"| `{field}` | {_type(spec)} | {'yes' if field in required else 'no'} | "
                     f"{default} | {_cell(spec.get('description', ''))} |")
    if schema.get("additionalProperties") is False:
        lines += ["", "Other fields are refused (422)."]
    return lines


def _type(schema: dict[str, Any]) -> str:
    """A schema as a short type: a link for a named schema, ``a or b`` for a union."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_schema_anchor(name)})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(dict.fromkeys(_type(s) for s in schema[key]))
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        items = schema.get("items") or {}
        return f"array of {_type(items)}" if items else "array"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {_type(schema['additionalProperties'])}"
    if kind is None:
        return "any"
    limits = [f"{word} {schema[key]:g}" if isinstance(schema[key], float) else
              f"{word} {schema[key]}" for key, word in (
                  ("minimum", "≥"), ("maximum", "≤"), ("minLength", "length ≥"),
                  ("maxLength", "length ≤")) if key in schema]
    return str(kind) + (f" ({', '.join(limits)})" if limits else "")


def _op_anchor(method: str, path: str) -> str:
    """An operation's heading id (attr_list), given explicitly: a path's ``{name}`` at the end
    of a heading would read as an attribute list."""
    return "-".join([method.lower(), *re.findall(r"[a-z0-9]+", path.lower())])


def _schema_anchor(name: str) -> str:
    return "schema-" + name.lower()


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _cell(text: str) -> str:
    return _one_line(text).replace("|", "\\|")
