"""OpenAI's Files and Batch APIs over HTTP, each key its own files and batches (kept in the
ledger database by ``proxy.ledger.batches``, run by ``proxy.serving``'s batch runner).

    files        ``/v1/files``: upload within the key's quota, list, read, content, delete
    uploads      an upload's ``multipart/form-data`` body read within bounds, split into fields
    batches      ``/v1/batches``: create, read, list, cancel
    openapi      their OpenAPI paths and their objects' schemas, merged into ``/openapi.json``

Imports what the server room does: ``proxy.serving`` (the batches' state, the client's key),
``proxy.ledger`` (the stores' limits and objects), ``proxy.protocol`` (schema helpers) and
``proxy.errors``.
"""
