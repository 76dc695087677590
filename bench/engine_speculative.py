"""Benchmark 2: speculative decoding on vs off, on copy-heavy work and on free-form chat.

``--library`` (issue 18) instead measures, side by side in one run on the same prompts and threads:
raw llama-cpp-python without a draft, raw llama-cpp-python with the library's own
``LlamaPromptLookupDecoding(num_pred_tokens=2)``, our engine plain and our engine with
``speculative = "prompt-lookup"``. Each is timed on the decode phase (its prompt already cached),
interleaved rep by rep so that the shared machine's load falls on all of them alike.

    .venv/bin/python bench/engine_speculative.py --library [--reps 3] [--max-tokens 200]

With ``--parallel N`` (issue 27: N = 4 is the served default) "ours" is the batched engine that a
worker with ``parallel = N`` runs (:class:`proxy.engine.batch.decode.BatchEngine`), plain and with
prompt lookup inside the batch, answering one request alone: what a lone request gets from the
default configuration.

Two copies of SmolLM2 in this process, one plain and one with ``speculative = "prompt-lookup"``
(adaptive, as served), answer the same greedy requests in turn, each from an empty context. The
answers must be token for token the same; the ratio is plain wall time / speculative wall time
for the whole request (prefill included, as a client sees it), in wall time and in CPU time
(the machine is shared: with one thread, CPU time is what an idle machine would take).

    .venv/bin/python bench/engine_speculative.py [--reps 3] [--threads 1] [--max-tokens 160]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from engine_common import engine_parser, machine, median, smollm2_path

TYPOS = (
    "Teh annual report was finaly publised last week. It shows that the compnay grew by "
    "twelve percent, mostly thanks to new custommers in the north. The board thanked the "
    "staff for there hard work and anounced a bonus for everyone who stayed the hole year."
)
MEMO = (
    "From: Dana Reyes, Operations. To: all staff. Date: 3 March. Subject: office move. "
    "The Leeds office moves to 14 Canal Street on 28 March. Movers arrive at 8 am; please pack "
    "your desks by 5 pm on 27 March. IT will reconnect computers on 29 March. Questions go to "
    "Sam Patel on extension 4471."
)
CSV = (
    "name,city,age\nAlice Martin,Paris,34\nBob Stone,Berlin,41\nCarol White,Madrid,29\n"
    "Dave Brown,Rome,52\nErin Black,Lisbon,38\nFrank Green,Vienna,45"
)
TASKS: dict[str, list[dict[str, Any]]] = {
    "copy: fix typos": [
        {
            "role": "user",
            "content": "Rewrite this paragraph with its spelling mistakes corrected. Change "
            f"nothing else.\n\n{TYPOS}",
        }
    ],
    "copy: extract": [
        {
            "role": "user",
            "content": "Copy the sentences of this memo that give a date or a time, word for "
            f"word:\n\n{MEMO}",
        }
    ],
    "copy: reformat": [
        {
            "role": "user",
            "content": "Rewrite this CSV as a Markdown table with the same rows:\n\n" + CSV,
        }
    ],
    "chat: poem": [{"role": "user", "content": "Write a short poem about autumn in the city."}],
    "chat: advice": [
        {"role": "user", "content": "How can I get better at waking up early? Give tips."}
    ],
    "chat: explain": [{"role": "user", "content": "Explain why the sky is blue to a child."}],
}


def run(
    model: Any, messages: list[dict[str, Any]], max_tokens: int
) -> tuple[float, float, float, Any]:
    """CPU seconds of one request from an empty context, then wall and CPU seconds of the same
    request again with its prompt in the KV cache: the decode phase alone."""
    request = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    model.forget()
    cpu = time.process_time()
    model.chat(request)
    cold_cpu = time.process_time() - cpu
    model.chat({**request, "max_tokens": 1})  # leaves exactly the prompt in the KV cache
    wall, cpu = time.perf_counter(), time.process_time()
    out = model.chat(request)
    return cold_cpu, time.perf_counter() - wall, time.process_time() - cpu, out


def _raw_decode(
    llm: Any, messages: list[dict[str, Any]], max_tokens: int
) -> tuple[float, float, Any]:
    """Raw llama-cpp-python: wall and CPU seconds of a greedy request whose prompt is cached."""
    kwargs: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    llm.create_chat_completion(**{**kwargs, "max_tokens": 1})
    wall, cpu = time.perf_counter(), time.process_time()
    out = llm.create_chat_completion(**kwargs)
    return time.perf_counter() - wall, time.process_time() - cpu, out


def _batch_decode(
    engine: Any, messages: list[dict[str, Any]], max_tokens: int
) -> tuple[float, float, Any]:
    """Our batched engine, one request alone: wall and CPU seconds of its decode phase (timed
    from its first token, once its prompt is read), and its completion."""
    request = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    engine.forget()
    seq = engine.add(request)
    assert seq is not None
    while not seq.generated and not seq.done:
        engine.step()
    before = len(seq.generated)
    wall, cpu = time.perf_counter(), time.process_time()
    engine.run_all()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    out = engine.completion(seq)
    share = (len(seq.generated) - before) / max(1, len(seq.generated))  # the timed tokens
    return wall / share, cpu / share, out


def _plain_and_lookup(args: argparse.Namespace, path: str, n_ctx: int) -> tuple[Any, Any]:
    """Our model loaded twice: plain (not calibrated), and with prompt lookup as ``args`` say."""
    from proxy.engine.generate import LocalModel

    plain = LocalModel.load(path, n_ctx=n_ctx, n_threads=args.threads, calibrate=False)
    lookup = LocalModel.load(
        path,
        n_ctx=n_ctx,
        n_threads=args.threads,
        speculative="prompt-lookup",
        draft_max_tokens=args.draft_max,
        lookup_ngram=args.ngram,
    )
    return plain, lookup


def _ours(args: argparse.Namespace, path: str) -> tuple[Any, Any, Any, Any]:
    """Our engine plain and with prompt lookup, as ``run`` callables, and what to close."""
    from proxy.engine.batch.decode import BatchEngine
    from proxy.engine.generate import LocalModel

    if args.parallel > 1:
        model = LocalModel.load(path, n_ctx=1024, n_threads=args.threads, calibrate=False)
        plain = BatchEngine(model, args.parallel)
        spec = BatchEngine(
            model,
            args.parallel,
            speculative=True,
            max_draft=args.draft_max,
            lookup_ngram=args.ngram,
        )

        def timed(engine: Any) -> Any:
            def go(messages: list[dict[str, Any]], n: int) -> tuple[float, float, Any]:
                return _batch_decode(engine, messages, n)

            return go

        return timed(plain), timed(spec), (plain, spec), model
    single, lookup = _plain_and_lookup(args, path, n_ctx=1024)

    def timed_single(model: Any) -> Any:
        def go(messages: list[dict[str, Any]], n: int) -> tuple[float, float, Any]:
            _, t, c, out = run(model, messages, n)
            return t, c, out

        return go

    return timed_single(single), timed_single(lookup), (single, lookup), None


def library(args: argparse.Namespace) -> None:
    """Raw library, raw library + LlamaPromptLookupDecoding(2), ours plain, ours speculative."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    path = smollm2_path()
    common: dict[str, Any] = {
        "model_path": path,
        "n_ctx": 1024,
        "n_threads": args.threads,
        "n_threads_batch": args.threads,
        "flash_attn": True,
        "verbose": False,
    }
    raw = Llama(**common)
    pld = Llama(**common, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=2))
    plain, spec, engines, shared = _ours(args, path)
    ours = "single" if args.parallel <= 1 else f"batched, parallel={args.parallel}, alone"
    print(
        f"SmolLM2-135M Q4_1, {args.threads} thread(s), flash attention, greedy, max_tokens "
        f"{args.max_tokens}, {args.reps} interleaved runs; ours: {ours}"
        "; decode tok/s (prompt cached), medians, "
        "by CPU time (one thread: what an idle machine would take; wall time on the last line)"
    )
    print(
        f"{'task':18} {'tokens':>6} {'raw':>6} {'raw+PLD':>7} {'ours':>6} {'ours+PL':>7} "
        f"{'lib x':>6} {'our x':>6} {'ours/lib':>8} {'acc/drafted':>11} {'same':>5} {'lib=':>4}"
    )
    ratios: dict[str, list[float]] = {"copy": [], "chat": []}
    ours_abs: dict[str, list[float]] = {"copy": [], "chat": []}
    wall_rows: list[tuple[str, dict[str, float]]] = []
    for name, messages in TASKS.items():
        lib_same = True
        speeds: dict[str, list[float]] = {"raw": [], "pld": [], "plain": [], "spec": []}
        walls: dict[str, list[float]] = {"raw": [], "pld": [], "plain": [], "spec": []}
        same = True
        info: dict[str, Any] = {}
        tokens = 0
        for _ in range(args.reps):
            t, c_s, a = _raw_decode(raw, messages, args.max_tokens)
            n = a["usage"]["completion_tokens"]
            speeds["raw"].append(n / c_s)
            walls["raw"].append(n / t)
            t, c_s, b = _raw_decode(pld, messages, args.max_tokens)
            speeds["pld"].append(b["usage"]["completion_tokens"] / c_s)
            walls["pld"].append(b["usage"]["completion_tokens"] / t)
            t, c_s, c = plain(messages, args.max_tokens)
            speeds["plain"].append(c["usage"]["completion_tokens"] / c_s)
            walls["plain"].append(c["usage"]["completion_tokens"] / t)
            t, c_s, d = spec(messages, args.max_tokens)
            speeds["spec"].append(d["usage"]["completion_tokens"] / c_s)
            walls["spec"].append(d["usage"]["completion_tokens"] / t)
            # Our guarantee: speculation changes no token. (The library's own answers can differ
            # from ours: its chat formatting and sampler chain are its own.)
            same = same and c["choices"][0]["message"] == d["choices"][0]["message"]
            lib_text = a["choices"][0]["message"]["content"]
            lib_same = lib_same and lib_text == b["choices"][0]["message"]["content"]
            info = d["frugal"]["speculative"] or {}
            tokens = n
        m = {key: median(values) for key, values in speeds.items()}
        wall_rows.append((name, {key: median(v) for key, v in walls.items()}))
        lib_x, our_x = m["pld"] / m["raw"], m["spec"] / m["plain"]
        ours_abs[name.split(":")[0]].append(m["spec"] / m["pld"])
        group = name.split(":")[0]
        ratios[group].append(our_x / lib_x if group == "copy" else our_x)
        acc = f"{info.get('accepted', 0)}/{info.get('drafted', 0)}"
        print(
            f"{name:18} {tokens:6d} {m['raw']:6.1f} {m['pld']:7.1f} {m['plain']:6.1f} "
            f"{m['spec']:7.1f} {lib_x:5.2f}x {our_x:5.2f}x {our_x / lib_x:8.2f} {acc:>11} "
            f"{'yes' if same else 'NO':>5} {'yes' if lib_same else 'no':>4}"
        )
    print(
        "same: ours+PL gave ours' tokens; lib=: raw+PLD gave raw's text. "
        "ours+PL / raw+PLD (absolute): "
        f"copy median {median(ours_abs['copy']):.2f} (min {min(ours_abs['copy']):.2f}), "
        f"chat median {median(ours_abs['chat']):.2f} (min {min(ours_abs['chat']):.2f})"
    )
    walled = ", ".join(
        f"{name.split(': ')[1]} {w['raw']:.0f}/{w['pld']:.0f}/{w['plain']:.0f}/{w['spec']:.0f}"
        for name, w in wall_rows
    )
    print(f"wall tok/s raw/raw+PLD/ours/ours+PL: {walled}")
    print(
        "lib x = raw+PLD / raw; our x = ours+PL / ours; ours/lib = our x / lib x. "
        f"copy: ours/lib median {median(ratios['copy']):.2f} (min {min(ratios['copy']):.2f}); "
        f"chat: our x median {median(ratios['chat']):.2f} (min {min(ratios['chat']):.2f})"
    )
    print(machine())
    for engine in (*engines, shared):
        if engine is not None:
            engine.close()
    raw.close()
    pld.close()


def main() -> None:
    parser = engine_parser(reps=3, max_tokens=160)
    parser.add_argument("--draft-max", type=int, default=8)
    parser.add_argument("--ngram", type=int, default=3)
    parser.add_argument("--library", action="store_true", help="side by side with the library")
    parser.add_argument(
        "--parallel", type=int, default=1, help="with --library: ours is the batched engine"
    )
    args = parser.parse_args()
    if args.library:
        library(args)
        return
    path = smollm2_path()
    plain, spec = _plain_and_lookup(args, path, n_ctx=2048)
    assert spec.calibration is not None
    print(f"calibration: {spec.calibration.as_dict()}")
    print(
        f"SmolLM2-135M Q4_1, {args.threads} thread(s), greedy, max_tokens {args.max_tokens}, "
        f"draft_max_tokens {args.draft_max}, lookup_ngram {args.ngram}, {args.reps} runs"
    )
    print(
        "speed-up = off / on. request: whole request from an empty context, CPU time. decode: "
        "the decode phase alone (prompt cached), wall and CPU time."
    )
    print(
        f"{'task':18} {'tokens':>6} {'off s':>6} {'on s':>6} {'request':>8} {'dec wall':>8} "
        f"{'dec cpu':>8} {'accepted/drafted':>17} {'same':>5}"
    )
    groups: dict[str, list[float]] = {"copy": [], "chat": []}
    cpu_groups: dict[str, list[float]] = {"copy": [], "chat": []}
    cold_groups: dict[str, list[float]] = {"copy": [], "chat": []}
    for name, messages in TASKS.items():
        ratios, off_t, on_t, cpu_ratios, cold_ratios = [], [], [], [], []
        same = True
        info: dict[str, Any] = {}
        tokens = 0
        for _ in range(args.reps):
            cold_off, t_off, c_off, a = run(plain, messages, args.max_tokens)
            cold_on, t_on, c_on, b = run(spec, messages, args.max_tokens)
            cold_ratios.append(cold_off / cold_on)
            same = same and a["choices"][0]["message"] == b["choices"][0]["message"]
            ratios.append(t_off / t_on)
            cpu_ratios.append(c_off / c_on)
            off_t.append(t_off)
            on_t.append(t_on)
            info = b["frugal"]["speculative"] or {}
            tokens = a["usage"]["completion_tokens"]
        ratio, cpu_ratio, cold = median(ratios), median(cpu_ratios), median(cold_ratios)
        group = name.split(":")[0]
        groups[group].append(ratio)
        cpu_groups[group].append(cpu_ratio)
        cold_groups[group].append(cold)
        acc = f"{info.get('accepted', 0)}/{info.get('drafted', 0)}"
        print(
            f"{name:18} {tokens:6d} {median(off_t):6.2f} {median(on_t):6.2f} {cold:7.2f}x "
            f"{ratio:7.2f}x {cpu_ratio:7.2f}x {acc:>17} {'yes' if same else 'NO':>5}"
        )
    for group, values in groups.items():
        cpu, cold = cpu_groups[group], cold_groups[group]
        print(
            f"{group}: median (min) speed-up: request {median(cold):.2f}x ({min(cold):.2f}x), "
            f"decode wall {median(values):.2f}x ({min(values):.2f}x), "
            f"decode CPU {median(cpu):.2f}x ({min(cpu):.2f}x)"
        )
    print(machine())
    plain.close()
    spec.close()


if __name__ == "__main__":
    main()
