"""Benchmark 1: decode and prefill tok/s through the proxy against raw llama-cpp-python.

Same model, same threads, same context, one process each, runs interleaved so that a busy
neighbour on a shared machine slows both alike. "Proxy" is the whole path: HTTP request into the
Starlette app (in-process ASGI), router, engine client, worker process, generation with per-token
logprobs, quality scoring, JSON response. "Raw" is ``Llama.create_chat_completion`` in this
process, once with llama-cpp-python's defaults (flash attention off) and once with flash attention
on, as the proxy runs it.

    prefill tok/s = prompt tokens / wall time of a max_tokens=1 request on a fresh prompt
    decode tok/s  = 64 / (wall(max_tokens=65) - wall(max_tokens=1)), prompt already cached

EOS is banned with logit_bias so that every answer has its full length. Each figure is given
in wall time and in CPU time (this process plus, for the proxy, its worker process): the machine
is shared, and with one thread CPU time is what an idle machine would take.

    .venv/bin/python bench/engine_overhead.py [--reps 5] [--threads 1]
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from engine_common import engine_parser, machine, median, smollm2_path

PARAGRAPH = (
    "The committee met on Tuesday to review the budget for the coming year. After a long "
    "discussion about maintenance of the old bridge, the members agreed to move part of the "
    "road fund to repairs, and to ask the county for a grant for the new library roof. "
)
BAN_EOS = {"0": -100.0, "2": -100.0}


def _prompt(tag: int, long: bool) -> list[dict[str, Any]]:
    body = PARAGRAPH * 9 if long else "Tell me about rivers."
    return [{"role": "user", "content": f"[{tag}] {body}"}]


def _worker_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Raw:
    pid: int | None = None

    def __init__(self, path: str, threads: int, flash_attn: bool) -> None:
        from llama_cpp import Llama

        self.llm = Llama(
            model_path=path,
            n_ctx=4096,
            n_threads=threads,
            n_threads_batch=threads,
            flash_attn=flash_attn,
            verbose=False,
        )

    async def ask(self, messages: list[dict[str, Any]], max_tokens: int) -> tuple[float, int]:
        started = time.perf_counter()
        out: Any = self.llm.create_chat_completion(
            messages=messages, max_tokens=max_tokens, temperature=0.0, logit_bias=BAN_EOS
        )
        return time.perf_counter() - started, int(out["usage"]["prompt_tokens"])


class Proxy:
    def __init__(self, client: Any, pid: int) -> None:
        self.client = client
        self.pid: int | None = pid

    async def ask(self, messages: list[dict[str, Any]], max_tokens: int) -> tuple[float, int]:
        body = {
            "model": "local",
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "logit_bias": BAN_EOS,
        }
        started = time.perf_counter()
        reply = await self.client.post("/v1/chat/completions", json=body)
        elapsed = time.perf_counter() - started
        reply.raise_for_status()
        return elapsed, int(reply.json()["usage"]["prompt_tokens"])


async def main() -> None:
    from proxy import config
    from tests.in_process import in_process

    parser = engine_parser(reps=5)
    args = parser.parse_args()
    path = smollm2_path()
    settings = config.from_dict(
        {
            "local": {"n_threads": args.threads, "n_ctx": 4096, "timeout_s": 600.0},
            "fallback": {"api_base": "", "api_key_env": ""},
            "ledger": {"path": "/tmp/frugal-bench-overhead.db"},
        }
    )
    systems: dict[str, Any] = {
        "raw (flash_attn off, library default)": Raw(path, args.threads, False),
        "raw (flash_attn on, as the proxy)": Raw(path, args.threads, True),
    }
    results: dict[str, dict[str, list[float]]] = {}
    async with in_process(settings, timeout_s=600) as c:
        pid = c.app.state.services.engine.health()["pid"]
        systems = {"proxy": Proxy(c, pid), **systems}
        tag = 0
        for system in systems.values():  # warm up each once
            await system.ask(_prompt(-1, False), 2)

        def cpu(system: Any) -> float:
            return time.process_time() + _worker_cpu(system.pid)

        for _ in range(args.reps):
            for name, system in systems.items():
                tag += 1
                r = results.setdefault(
                    name, {"prefill": [], "decode": [], "prefill_cpu": [], "decode_cpu": []}
                )
                c0 = cpu(system)
                wall, n_prompt = await system.ask(_prompt(tag, True), 1)
                r["prefill"].append(n_prompt / wall)
                r["prefill_cpu"].append(n_prompt / (cpu(system) - c0))
                short = _prompt(tag, False)
                await system.ask(short, 1)
                c0 = cpu(system)
                t1, _ = await system.ask(short, 1)
                c1 = cpu(system)
                t65, _ = await system.ask(short, 65)
                c65 = cpu(system)
                r["decode"].append(64 / (t65 - t1))
                r["decode_cpu"].append(64 / ((c65 - c1) - (c1 - c0)))
    proxy = results["proxy"]
    print(f"SmolLM2-135M Q4_1, n_ctx 4096, {args.threads} thread(s), {args.reps} runs, medians")
    print(f"{'tok/s':38} {'prefill':>8} {'decode':>7} {'prefill cpu':>12} {'decode cpu':>11}")
    for name, r in results.items():
        print(
            f"{name:38} {median(r['prefill']):8.1f} {median(r['decode']):7.1f} "
            f"{median(r['prefill_cpu']):12.1f} {median(r['decode_cpu']):11.1f}"
        )
    for name, r in results.items():
        if name == "proxy":
            continue
        ratios = {
            k: median(proxy[k]) / median(r[k])
            for k in ("prefill", "decode", "prefill_cpu", "decode_cpu")
        }
        print(
            f"proxy / {name}: prefill {ratios['prefill']:.2f} (cpu {ratios['prefill_cpu']:.2f}), "
            f"decode {ratios['decode']:.2f} (cpu {ratios['decode_cpu']:.2f})"
        )
    print(machine())


if __name__ == "__main__":
    asyncio.run(main())
