"""Continuous batching: several chat completions decoded together in one llama.cpp context.

    decode     ``BatchEngine``: the batch's context, its steps (prefill or decode), its answers
    sequence   one sequence of the batch (its state, each token it takes, its answer), and the
               batch's counts
    samplers   the batch's grammar samplers, one per constrained sequence
    streams    each sequence id's KV stream, and how a joining prompt reuses what it holds
    turns      whose turn the next step is: a joining prompt's chunk or the running answers
    forecast   when a request would finish on the batch, for routing (runs in the proxy)

Everything here but ``forecast`` runs in the worker process. May import the rest of
``proxy.engine`` (generation, sampling, speculation, prefix plans, rates); nothing outside the
engine room.
"""
