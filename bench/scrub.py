"""What clearing relayed bodies of the proxy's secrets costs (``proxy/config/secrets.py``).

    .venv/bin/python bench/scrub.py

Every upstream answer and stream event passes through ``Secrets.scrub``, and almost none holds a
secret, so the figure that matters is the cost of finding none: on a stream chunk (186 bytes)
and a 2 KB answer, with one secret (a proxy with only its upstream key) and with 13 (an upstream
key, 8 client keys, a litellm provider's key, a base64 key with ``+/=``, a database password).
Beside it, in the same run, the first version's way: every form of every secret searched with
``in``.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import secrets
import timeit
from collections.abc import Callable

from proxy.config import Settings
from proxy.config.secrets import MARK, Secrets

CHUNK = (
    b'data: {"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1,'
    b'"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":" Paris"},'
    b'"logprobs":null,"finish_reason":null}]}\n\n'
)
ANSWER = json.dumps({"id": "x", "choices": [{"message": {"content": "word " * 400}}]}).encode()


def every_form(known: Secrets, data: bytes) -> bytes:
    """The first version: each form of each secret searched for, one ``in`` at a time."""
    for needle in known.needles:
        if needle in data:
            data = data.replace(needle, MARK.encode())
    return data


def _per_call(call: Callable[[], object], n: int) -> float:
    """Seconds per call, the best of 7 rounds of ``n``."""
    return min(timeit.repeat(call, number=n, repeat=7)) / n


def main() -> None:
    env = {
        "OPENAI_API_KEY": "sk-proj-" + secrets.token_urlsafe(48),
        "FRUGAL_API_KEYS": ",".join(f"team{i}:{secrets.token_urlsafe(32)}" for i in range(8)),
        "ANTHROPIC_API_KEY": "sk-ant-" + secrets.token_urlsafe(40),
        "AZURE_API_KEY": base64.b64encode(os.urandom(30)).decode() + "+/=",
        "PGPASSWORD": "p@ss/w+rd=" + secrets.token_hex(8),
    }
    cases = (
        ("13 secrets", Secrets.known(Settings(), env)),
        ("1 secret", Secrets.of([env["OPENAI_API_KEY"]])),
    )
    n = 20000
    for label, known in cases:
        for name, data in ((f"chunk {len(CHUNK)} B", CHUNK), (f"answer {len(ANSWER)} B", ANSWER)):
            assert known.scrub(data) is data
            new = _per_call(functools.partial(known.scrub, data), n)
            old = _per_call(functools.partial(every_form, known, data), n)
            print(
                f"{label} ({len(known.needles)} forms), {name}: scrub {new * 1e6:.2f} us "
                f"(every form by `in`: {old * 1e6:.2f} us)"
            )


if __name__ == "__main__":
    main()
