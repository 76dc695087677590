"""Serving: what the proxy does with a request once it is read, kept apart from HTTP: what one
request did (the exchange) and the ledger row made from it, what an API call costs, the
quotas of a client key, the shadow audits, and the typed bundle of services the server hands
to its handlers.

    exchange     what one request did, for the headers, the log and the ledger row
    record       the row, the metrics and the log line made from an exchange, once
    charges      what an API call costs when its answer never reached the client
    quotas       what a client key may do on the request path: models, rpm, budget, cache
    shadow       a local attempt offered to the shadow audits; a drawn audit started
    background   a service's background task (the key store's refresh, the quotas' sweep)
                 cancelled and awaited when the service stops
    services     the typed bundle of services the handlers and middleware receive

May import ``proxy.routing``, ``proxy.upstream``, ``proxy.audit``, ``proxy.engine``,
``proxy.ledger``, ``proxy.protocol``, ``quality``, and the shared ``proxy.config`` and
``proxy.errors``; for now its bundle names the types of ``proxy.server``'s services.
It is imported by ``proxy.server`` alone.
"""
