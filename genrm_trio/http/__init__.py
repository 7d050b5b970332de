"""The HTTP layer: one ASGI layer for every route, the Quart app, the request schema, reply rows
and the OpenAPI document (docs/http-api.md)."""
