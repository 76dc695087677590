"""The audit loop on simulated traffic: ``python -m bench.audit_loop [--runs 20]``.

A user's traffic is the dev set's 576 prompts (``quality/dev/devset.py``), answered locally by the
bundled SmolLM2-135M. The local answers are the cached ones
(``tests/data/quality_answers_smollm2.jsonl``, ``quality/dev/answers.py``): the same engine, the
same greedy answers, so the bench needs no model run. The paid API is ``tests/fake_api.py`` with
its :class:`~tests.fake_api.DevSetOracle`: it answers each prompt with its right answer, and it
plays the judge of ``docs/audit.md`` with the dev set's checkers. Every audit goes the real way:
the reference from the stand-in API over HTTP, the exact check (``proxy.audit.verdict``), then
the judge protocol (``proxy.audit.judge``) when the check cannot decide; the audits are rows of
a real SQLite ledger (``migrations/0007_audits.sql``), and ``frugal calibrate``'s refit reads
them back. The API and the judge are asked once per prompt; the runs resample those verdicts.

Each run splits the prompts at random into two halves:

* first half: every answer is audited (rate 1) and the gate is refitted on those audits
  (``proxy.audit.calibrate``), with the threshold that ``target_precision = 0.9`` needs;
* second half (unseen): AUC of the shipped and the calibrated weights against the checkers'
  truth; the precision of the answers the calibrated gate accepts at that threshold; and a
  report as the proxy would give it, from audits drawn at ``--rate`` among the second half's
  answers: the audited precision with its 95% Wilson interval, against the true precision.

The gate scores without the relevance signal (as the audits store features), so "shipped" is
the shipped ``full_no_relevance`` model. The shipped weights were fitted on the dev set's train
split, so on the train prompts they are scored on answers they saw: the AUC on the second half's
held-out prompts alone is printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from proxy.audit import calibrate as cal
from proxy.audit.estimate import weighted_share
from proxy.audit.judge import ask_judge, judge_body
from proxy.audit.record import AuditRecord, insert, read
from proxy.audit.verdict import answer_text, exact_check
from proxy.ledger.migrate import open_database
from quality import signals
from quality.combiner import HARD_CAP, Combiner, default_combiner
from quality.dev.answers import grade, load_answers, request_for
from quality.dev.devset import load
from quality.fit import roc_auc
from tests.fake_api import DevSetOracle, FakeAPI

TARGET = 0.9


@dataclass(frozen=True)
class Case:
    id: str
    kind: str
    split: str
    features: dict[str, float]
    hard: bool
    truth: bool  # the dev checker on the local answer
    verdict: bool | None  # what the audit said (exact check or stand-in judge)
    method: str | None


async def audit_all(graded: Sequence[Any], api: FakeAPI) -> list[Case]:
    """Reference and verdict of every answer, through the stand-in API and judge, once."""
    cases = []
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:

        async def post(body: dict[str, Any]) -> dict[str, Any]:
            response = await client.post("/chat/completions", json=body)
            response.raise_for_status()
            out: dict[str, Any] = response.json()
            return out

        for g in graded:
            request = request_for(g.prompt)
            sigs = signals(request, g.completion)
            features = default_combiner().features(sigs)
            reference = answer_text(await post({**request, "model": "gpt-4o-mini"}))
            candidate = answer_text(g.completion)
            match = exact_check(
                reference, candidate, correctness="strict", request=request["messages"]
            )
            if match is not None:
                verdict, method = True, "exact"
            else:
                body = judge_body(
                    model="gpt-4o-mini",
                    messages=request["messages"],
                    reference=reference,
                    candidate=candidate,
                    correctness="strict",
                )
                outcome = await ask_judge(post, body)
                verdict, method = outcome.correct, "judge"
            cases.append(
                Case(
                    g.prompt.id,
                    g.prompt.kind,
                    g.prompt.split,
                    features,
                    any(s.hard for s in sigs),
                    g.correct,
                    verdict,
                    method,
                )
            )
    return cases


def score(combiner: Combiner, case: Case) -> float:
    model = combiner.full_no_relevance or combiner.full
    p = model.probability(case.features)
    return p * HARD_CAP if case.hard else p


def auc(combiner: Combiner, cases: Sequence[Case]) -> float:
    return roc_auc([score(combiner, c) for c in cases], [c.truth for c in cases])


@dataclass(frozen=True)
class Run:
    auc_shipped: float
    auc_calibrated: float
    auc_shipped_heldout: float
    auc_calibrated_heldout: float
    threshold: float
    accepts_nothing: bool
    accepted: int
    true_precision: float | None
    audited_precision: float | None
    low: float
    high: float
    covered: bool | None
    # The proxy without a target (the shipped gate at the configured 0.6), audited the same way:
    configured_accepted: int
    configured_true: float | None
    configured_audited: float | None
    configured_covered: bool | None


def one_run(cases: Sequence[Case], rng: random.Random, rate: float, db: Path) -> Run:
    order = list(cases)
    rng.shuffle(order)
    half = len(order) // 2
    first, second = order[:half], order[half:]
    shipped = default_combiner()
    if db.exists():
        db.unlink()
    open_database(str(db))
    conn = sqlite3.connect(db)
    records = [
        AuditRecord(
            request_id=c.id,
            ts=float(i),
            accepted=score(shipped, c) >= 0.6,
            verdict=c.verdict,
            method=c.method,
            weight=1.0,
            features=c.features,
            score=score(shipped, c),
            task_kind=c.kind,
            local_model="SmolLM2-135M-Instruct.Q4_1.gguf",
        )
        for i, c in enumerate(first)
    ]
    with conn:
        insert(conn, records, log_content=False)
    audits = read(conn, since=0, until=1e12)
    conn.close()
    result = cal.calibrate(
        audits,
        base=cal.base_weights(),
        model_sha256="bench",
        model_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        target=TARGET,
    )
    calibrated = Combiner.from_dict(result.weights)
    threshold = result.threshold.threshold
    accepted = [c for c in second if score(calibrated, c) >= threshold]
    true_precision = sum(c.truth for c in accepted) / len(accepted) if accepted else None
    weight = 1.0 / rate
    sampled = [c for c in accepted if rng.random() < rate and c.verdict is not None]
    share = weighted_share((weight, bool(c.verdict)) for c in sampled)
    covered = None
    if true_precision is not None and share.value is not None:
        covered = share.low <= true_precision <= share.high
    heldout = [c for c in second if c.split == "heldout"]
    plain = [c for c in second if score(shipped, c) >= 0.6]
    plain_true = sum(c.truth for c in plain) / len(plain) if plain else None
    plain_share = weighted_share(
        (weight, bool(c.verdict)) for c in plain if rng.random() < rate and c.verdict is not None
    )
    plain_covered = None
    if plain_true is not None and plain_share.value is not None:
        plain_covered = plain_share.low <= plain_true <= plain_share.high
    return Run(
        auc_shipped=auc(shipped, second),
        auc_calibrated=auc(calibrated, second),
        auc_shipped_heldout=auc(shipped, heldout),
        auc_calibrated_heldout=auc(calibrated, heldout),
        threshold=threshold,
        accepts_nothing=result.threshold.source == "accept_nothing",
        accepted=len(accepted),
        true_precision=true_precision,
        audited_precision=share.value,
        low=share.low,
        high=share.high,
        covered=covered,
        configured_accepted=len(plain),
        configured_true=plain_true,
        configured_audited=plain_share.value,
        configured_covered=plain_covered,
    )


def _mean(values: Sequence[float | None]) -> float:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else float("nan")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.audit_loop", description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rate", type=float, default=0.5, help="audit rate on the second half")
    parser.add_argument("--seed", type=int, default=17)
    args = parser.parse_args(argv)
    graded = grade(load(), load_answers())
    with FakeAPI(oracle=DevSetOracle(), record=False) as api:
        cases = asyncio.run(audit_all(graded, api))
    agree = sum(1 for c in cases if c.verdict == c.truth)
    exact = sum(1 for c in cases if c.method == "exact")
    print(
        f"prompts {len(cases)} (right {sum(c.truth for c in cases)}); audit verdicts agree "
        f"with the checkers on {agree}; settled by the exact check: {exact}"
    )
    rng = random.Random(args.seed)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            run = one_run(cases, rng, args.rate, Path(tmp) / "ledger.db")
            runs.append(run)
            print(
                f"run {i + 1:2d}: AUC shipped {run.auc_shipped:.3f} calibrated "
                f"{run.auc_calibrated:.3f} (held-out only {run.auc_shipped_heldout:.3f} / "
                f"{run.auc_calibrated_heldout:.3f}); threshold {run.threshold:.3f}; accepted "
                f"{run.accepted}; precision true "
                + (f"{run.true_precision:.3f}" if run.true_precision is not None else "-")
                + " audited "
                + (
                    f"{run.audited_precision:.3f} [{run.low:.3f}, {run.high:.3f}]"
                    if run.audited_precision is not None
                    else "-"
                ),
                file=sys.stderr,
            )
    covered = [r.covered for r in runs if r.covered is not None]
    nothing = sum(r.accepts_nothing for r in runs)
    gaps = [
        abs(r.audited_precision - r.true_precision)
        for r in runs
        if r.audited_precision is not None and r.true_precision is not None
    ]
    print(f"runs {len(runs)}; audit rate on the unseen half {args.rate:g}")
    print(
        f"AUC on the unseen half: shipped {_mean([r.auc_shipped for r in runs]):.3f}, calibrated "
        f"{_mean([r.auc_calibrated for r in runs]):.3f} (better in "
        f"{sum(r.auc_calibrated > r.auc_shipped for r in runs)}/{len(runs)} runs)"
    )
    print(
        "AUC on its held-out prompts only: shipped "
        f"{_mean([r.auc_shipped_heldout for r in runs]):.3f}, calibrated "
        f"{_mean([r.auc_calibrated_heldout for r in runs]):.3f}"
    )
    print(
        f"target precision {TARGET}: accepts nothing in {nothing}/{len(runs)} runs; otherwise "
        f"accepted {_mean([r.accepted for r in runs if not r.accepts_nothing]):.1f} answers a "
        f"run at true precision {_mean([r.true_precision for r in runs]):.3f}"
    )
    print(
        f"reported vs true precision: mean gap {_mean(gaps):.3f}; the 95% interval covers the "
        f"true precision in {sum(covered)}/{len(covered)} runs with a report"
    )
    plain = [r.configured_covered for r in runs if r.configured_covered is not None]
    plain_gaps = [
        abs(r.configured_audited - r.configured_true)
        for r in runs
        if r.configured_audited is not None and r.configured_true is not None
    ]
    print(
        "without a target (shipped gate, threshold 0.6): accepted "
        f"{_mean([r.configured_accepted for r in runs]):.1f} answers a run at true precision "
        f"{_mean([r.configured_true for r in runs]):.3f}; audited precision off by "
        f"{_mean(plain_gaps):.3f} on average; the 95% interval covers the true precision in "
        f"{sum(plain)}/{len(plain)} runs"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
