"""How a prompt is cut for prefill so that a reused prefix never changes an answer.

llama.cpp's CPU flash attention takes one of two paths for the rows a step adds to a sequence's
KV stream: a tiled one when the step has at least ``TILE_ROWS`` of them (``GGML_FA_TILE_Q``), a
row-by-row one below that. Each path gives the same numbers for a row whatever else is in the
step, but the two differ from each other (logprobs up to 0.7 apart here, enough to flip a greedy
choice). A prompt prefilled from an empty cache in ``chunk``-token steps (the single path's
``n_batch`` cut) has every position in a tiled step except those of a last chunk shorter than
``TILE_ROWS``; the last prompt token and the answer come from one-row decode steps. So the KV of
a token sequence is fixed by one number, :func:`tiled_until`: positions below it were evaluated
in tiled steps, the rest row by row.

Two consequences, which :class:`~proxy.engine.batch.decode.BatchEngine` follows:

* held KV cells serve another prompt only as far as both were evaluated the same way
  (:func:`reusable`): the common prefix, cut at the smaller ``tiled_until`` when they differ;
* the rest is prefilled in steps that evaluate each position as a cold prefill would
  (:func:`plan`): the tiled part in steps of at least ``TILE_ROWS`` rows (backing off into the
  reused prefix when fewer are left), the short tail in one step of its own.

Measured on the bundled SmolLM2: a 151-token prefix reused and the rest prefilled in one step
gives logits identical to a cold prefill when that step has 64 rows or more, and up to 0.73
apart with 63 or fewer (``tests/engine/test_prefill_plan.py``).

The short tail, evaluated row by row, gives the same logits however it is cut into steps (the
same test file). So a deferred prompt's tail (all of a short prompt) is cut into steps of
``DEFERRED_ROWS`` (:func:`cut_tail`): an interactive request that arrives waits for the step
under way, which llama.cpp cannot stop, and a short batch line's whole prompt in one step was
most of that wait (``bench/README.md``, "Bulk work"); a 16-row step costs a little more a token.
"""

from __future__ import annotations

__all__ = ["DEFERRED_ROWS", "TILE_ROWS", "cut_tail", "plan", "reusable", "tiled_until"]

TILE_ROWS = 64
DEFERRED_ROWS = 16  # rows a step of a deferred prompt's untiled tail (module docstring)


def tiled_until(n_prompt: int, chunk: int) -> int:
    """The positions below which a cold prefill of ``n_prompt`` tokens in ``chunk``-token
    steps evaluates in tiled steps (all but the last prompt token are prefilled)."""
    n = n_prompt - 1
    if n <= 0:
        return 0
    short = n % chunk
    return n - short if short < TILE_ROWS else n


def reusable(common: int, held_tiled: int, wanted_tiled: int) -> int:
    """How many held cells (sharing ``common`` leading tokens with the prompt) a prompt can keep:
    all of the common prefix where both were cut alike, else up to where they first differ."""
    if held_tiled == wanted_tiled:
        return common
    return min(common, held_tiled, wanted_tiled)


def plan(start: int, n_prompt: int, chunk: int) -> tuple[int, list[int]]:
    """The prefill of a prompt whose first ``start`` positions are already held: the position
    it really starts from (``start`` or less) and the size of each step, so that every position
    is evaluated as a cold prefill would evaluate it."""
    end = n_prompt - 1
    start = max(0, min(start, end))
    tiled = tiled_until(n_prompt, chunk)
    steps: list[int] = []
    if start < tiled:
        if tiled - start < TILE_ROWS:
            start = max(0, tiled - TILE_ROWS)
        todo = tiled - start
        steps = [chunk] * (todo // chunk) + ([todo % chunk] if todo % chunk else [])
        if steps[-1] < TILE_ROWS:  # only after a reuse: a cold plan has no short tiled step
            steps[-2] -= TILE_ROWS - steps[-1]
            steps[-1] = TILE_ROWS
    if end > max(start, tiled):
        steps.append(end - max(start, tiled))
    return start, steps


def cut_tail(steps: list[int], start: int, n_prompt: int, chunk: int, rows: int) -> list[int]:
    """A :func:`plan`'s ``steps`` (from ``start``) with the untiled tail in steps of at most
    ``rows``: its positions are evaluated row by row however it is cut."""
    tail = n_prompt - 1 - max(start, tiled_until(n_prompt, chunk))
    if tail <= rows:
        return steps
    return steps[:-1] + [rows] * (tail // rows) + ([tail % rows] if tail % rows else [])
