"""The OpenAPI 3.1 description of the proxy, served at ``/openapi.json``.

It describes what the proxy accepts and answers, which is OpenAI's API for these endpoints plus
the ``x-frugal-*`` headers. Its paths are the routes' own entries, handed in by
:func:`proxy.server.routes.openapi_spec` (each route declares its path item beside its handler,
written with :mod:`proxy.server.openapi.parts`); this module adds the components. The request
schemas are generated from the parameter tables of :mod:`proxy.protocol.params`
(:mod:`proxy.protocol.request_schema`), the rows :mod:`proxy.protocol.validate` checks a body
against; each endpoint names its answer's schema (most are :mod:`proxy.protocol.answer_schemas`).
A schemathesis run over this document is part of the test suite (``tests/server/test_openapi.py``).
"""

from __future__ import annotations

from typing import Any

from proxy.protocol.answer_schemas import ERROR, INPUT_ITEMS, MODELS, RESPONSE_DELETED
from proxy.server import report
from proxy.server.batch import openapi as openapi_batches
from proxy.server.endpoints import ENDPOINTS


def openapi_document(paths: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI document whose paths are ``paths`` (each a path item)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "frugal-proxy",
            "version": "1",
            "description": "A local-first, OpenAI-compatible endpoint: each request is answered "
            "by a local model when its answer is good enough, by the API otherwise.",
        },
        "servers": [{"url": "/"}],
        "components": {
            "schemas": {
                **{name: schema for e in ENDPOINTS for name, schema in (e.request, e.response)},
                "ResponseDeleted": RESPONSE_DELETED,
                "ResponseInputItems": INPUT_ITEMS,
                **openapi_batches.SCHEMAS,
                "Models": MODELS,
                "Report": report.REPORT,
                "Error": ERROR,
            },
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"bearer": []}],
        "paths": paths,
    }
