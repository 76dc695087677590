"""Serving: what the proxy does with a request once it is read, kept apart from HTTP: what one
request did (the exchange) and the ledger row made from it, what an API call costs, the
quotas of a client key, the shadow audits, the services a running app shares, and the frozen
bundle of them the server hands to its handlers; and the cascade with the services of the
endpoints on it. No Starlette here: a service takes a call (its id, its key, the ``x-frugal``
headers, its body to read, the caller's rights) and returns an answer or a stream of events,
never a route or an app to look itself up in.

    call         ``Call``, what a service is handed; ``Answer`` and ``Events``, what it returns
    cascade      the cascade every endpoint composes (none subclasses another): plan, local
                 attempt, gate, fallback, answer, exactly one ledger row
    chat         ``POST /v1/chat/completions``' service: JSON, or a stream (``verify`` or
                 ``live``)
    completions  the services of ``POST /v1/completions`` and ``POST /v1/embeddings``
    responses    ``POST /v1/responses``' service: translated to chat (``proxy.protocol``),
                 answered by the cascade, sent as a Responses object or its typed events; a
                 background response's events once it has ended
    responses_upstream  its fallback to the upstream's own ``/v1/responses``: the answer, or
                 its typed events relayed, under our id
    responses_live  ``stream_mode = "live"`` on ``/v1/responses``: local tokens as typed events
    events       the chunks of chat and legacy streams, a finished answer replayed as them,
                 and an error as a stream's last event
    exchange     what one request did, for the headers, the log and the ledger row, set
                 through its named steps only
    live         ``stream_mode = "live"``: a local generation's tokens as they come
    responses_checks  a ``/v1/responses`` body's checks: its shape, its references, and what
                 the chat cascade it is translated to must accept
    record       the row, the metrics and the log line made from an exchange, once
    charges      what an API call costs when its answer never reached the client
    quotas       what a client key may do on the request path: models, rpm, budget, cache
    shadow       a local attempt offered to the shadow audits (a batch line's too); a drawn
                 audit started
    clients      the client keys a running server accepts (``Authenticator``), and what a
                 caller may read (``sees_everything``, ``own_key``)
    in_flight    the count of requests being handled now
    metrics      the app's Prometheus counters, and what is read when they are scraped
    batch_gauges the deferred work's gauges: open batch lines and batches, read from the
                 ledger database at most every few seconds
    responses_state  stored Responses: ``store``, ``previous_response_id``, ``item_reference``,
                 who may read which
    batches_state  files and batches: the ledger's stores, their expiry swept, who may read
                 which
    body_check   a large body parsed and checked in a worker thread, off the event loop,
                 within a time bound
    background   a service's background task (the key store's refresh, the quotas' sweep)
                 cancelled and awaited when the service stops
    batch_runner  ``BatchRunner``: a long-lived task that claims batch lines from the ledger,
                 runs each local first (the batch's window as its deadline), finishes the
                 accepted ones, and sends the rejects to the upstream's Batch API together;
                 resumes an upstream batch after a restart; ``RunnerGauges``
    batch_attempt  ``BatchAttempt``: a batch line's local attempt, the endpoint's checks, plan,
                 engine and gate with the batch's window as its deadline, in the engine's
                 ``deferred`` class; the line's answer as its endpoint would send it
    batch_lines  what the runner asks of the cascade (``LocalAttempt``: ``Accepted``,
                 ``Rejected``, ``CannotServe``), a line's ledger rows at the batch tier, and the
                 budget's ``Purse`` (``LedgerPurse``)
    holders      who holds a lease in the ledger (``host:pid``), and whether a holder of
                 this host is gone
    background_responses  ``background: true`` on ``/v1/responses``: the queued response
                 stored, run afterwards as deferred work, its status moved in the store,
                 cancelled, and those a stopped proxy left open failed at start
    services     the frozen bundle of the services above and below, built by the lifespan

May import ``proxy.routing``, ``proxy.upstream``, ``proxy.audit``, ``proxy.engine``,
``proxy.ledger``, ``proxy.protocol``, ``quality``, and the shared ``proxy.config`` and
``proxy.errors``. It is imported by ``proxy.server`` alone, and never imports ``proxy.server``,
``proxy.models`` or ``proxy.cli`` (import-linter's layers), nor starlette or uvicorn (its
forbidden contract).
"""
