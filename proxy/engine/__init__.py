"""The local model: a worker process that owns llama.cpp, and the proxy's async client of it.

    local_engine    ``LocalEngine``: queue, deadlines, cancellation, restart after a crash
    fair_queue      the order waiting jobs take the engine's slots in: in turn by client key
    priority        interactive jobs first: deferred work (batch lines, background, flex) fills
                    the slots they leave, pauses when they come, and waits in its own queue
    worker_link     the worker process as the proxy holds it, and the jobs running in it
    engine_stats    what the engine has done: counts, rates, the batch's state
    worker          the child process: loads the model, answers jobs over a pipe
    gate            the quality gate's scorer (relevance model and weights), one for the
                    worker's answers and, in the proxy's process, the remote backends'
    model_files     where the GGUF comes from (the bundled SmolLM2), how llama.cpp opens it
    weights         the quality combiner the worker scores with (shipped or calibrated)
    worker_env      the child's environment, cleared of secrets
    generate        one completion, token by token, with logprobs, stop strings and deadlines
    sampling        a request's sampling parameters; bias, penalties, picking and logprobs on
                    one row of logits
    messages        a chat request's messages as chat templates take them
    reasoning       a thinking model's format: its thinking told apart from its answer,
                    counted, budgeted, and turned off for ``reasoning_effort`` none
    answer          the ``chat.completion`` either decoding path returns
    batch/          several sequences in one llama.cpp context (continuous batching): its
                    sub-room (see ``proxy/engine/batch/__init__.py``)
    speculative     prompt-lookup and draft-model drafts, verified in one batch of rows
    draft_policy    how long each draft should be, from the acceptance and the measured step costs
    prefix_cache    KV states of earlier prompts, reused for a shared prefix
    prefill_plan    how a prompt is cut for prefill, so that a reused prefix never changes an answer
    grammar         GBNF grammars from JSON schemas and tools, built in the worker
    grammar_size    the bound on a grammar's size, checked (linearly) before it is built
    tasks, tools, legacy   what a job asks for: chat, tool calls, legacy text completions
    rates, measure         measured prefill and decode rates (the estimator's inputs)
    memory, gguf           the memory guard and the model file's header
    quantize               ``frugal quantize``

May import ``quality`` (the worker scores its answers) and the shared ``proxy.config``,
``proxy.errors`` and ``proxy.logs``; never ``proxy.server``, ``proxy.serving``, ``proxy.routing`` or
``proxy.upstream``. llama.cpp is imported only in the worker process, offline tools, and the
proxy's copy of the gate's relevance model (loaded and run in threads), never on the proxy's
event loop.
"""
