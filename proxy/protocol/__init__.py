"""Protocol: OpenAI's wire shapes, with no HTTP in them: what a request may hold, how it is
checked, and how a Responses request and answer are translated to and from chat.

    params          the table of every OpenAI request parameter (type, bounds, how each is
                    handled): validation, the OpenAPI request schemas, the upstream allow-list
                    and what the engine can serve are all read from it
    responses_params  the table of ``/v1/responses``' parameters, and OpenAI's not served yet
    forwarding      the tables as allow-lists: a key outside them refused with a 400 naming
                    it, the body sent upstream built from them
    shapes          the JSON Schema fragment of each nested shape the table names
    validate        the checks of a request body read from the table, errors naming ``param``;
                    the nested values checked by shape_checks (and tool_checks for tools and
                    their calls)
    shape_checks    the hand-written checks of nested values (messages, content parts, ...)
    tool_checks     the checks of tools, tool choices and tool calls
    check_progress  the field a long check was on, for the error of a check that ran out of time
    request_schema  the OpenAPI request schema of an endpoint, generated from its table
    responses_shapes  the nested shapes of a Responses request and their checks
    responses_translate  a Responses request as the chat request the cascade answers
    responses_answer  chat's answer back as a ``response`` object or its typed events
    responses_usage the usage of either API as the same figures, a Responses usage as chat's
    answers         the engine's completion as OpenAI sends it (``public_answer``), its usage
                    in OpenAI's keys
    answer_schemas  the JSON Schemas of the answers (a completion, a ``response``, the error)

May import the shared ``proxy.errors`` and ``proxy.logs``, and ``quality`` (pure: the JSON Schema
check of tool arguments); it is imported by every room that reads the table (``proxy.ledger``,
``proxy.upstream``, ``proxy.routing``) and by the serving and server rooms. It never imports
``proxy.server``, ``proxy.serving``, ``proxy.routing``, ``proxy.upstream``, ``proxy.engine``,
``proxy.ledger`` or starlette: a wire shape knows nothing of who sends it or how.
"""
