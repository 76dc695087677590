"""The audit loop on simulated traffic: ``python -m bench.audit_loop [--runs 20]``.

A user's traffic is the dev set's 576 prompts (``quality/dev/devset.py``), answered locally by the
bundled SmolLM2-135M. The local answers are the cached ones
(``tests/data/quality_answers_smollm2.jsonl``, ``quality/dev/local_answers.py``): the same engine,
the same greedy answers, so the bench needs no model run. The paid API is ``tests/fake_api.py`` with
its :class:`~tests.fake_api.DevSetOracle`: it answers each prompt with its right answer, and it
plays the judge of ``docs/audit.md``, grading under the notion its system message names. Every
audit goes the real way: the reference from the stand-in API over HTTP, the exact check
(``proxy.audit.verdict``), then the judge protocol (``proxy.audit.judge``) when the check cannot
decide; the audits are rows of a real SQLite ledger (``migrations/0007_audits.sql``), and
``frugal calibrate``'s refit (``proxy.audit.refit.calibrate``) reads them back. The API and
the judge are asked once per prompt and notion; the runs resample those verdicts.

``--correctness`` picks the notions of correct, each simulated on its own (by default both):

* ``strict`` (``devset.is_correct``): the right content in the form asked for. This is the notion
  the shipped weights were fitted under, on this very dev set, so a refit has little to learn.
* ``content`` (``quality.dev.content``): the right content in any form, as a chat reader takes
  it. Traffic graded under another notion than the shipped weights' is what calibration is for.

Each run splits the prompts at random into two halves:

* first half: every answer is audited (rate 1) and the gate is refitted on those audits, with the
  threshold each ``--target`` precision needs;
* second half (unseen): AUC of the shipped and the calibrated weights against the grader's truth
  (the grader of the notion, on the local answer); the precision of the answers the calibrated
  gate accepts at each target's threshold; and a report as the proxy would give it, from audits
  drawn at ``--rate`` among the second half's answers: the audited precision with its 95% Wilson
  interval, against the true precision.

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

from proxy.audit import refit as cal
from proxy.audit.judge import ask_judge, judge_body
from proxy.audit.verdict import answer_text, exact_check
from proxy.ledger.audits.audit_record import AuditRecord, insert, read
from proxy.ledger.audits.estimate import weighted_share
from proxy.ledger.db.migrate import open_database
from quality import signals
from quality.combiner import HARD_CAP, Combiner, default_combiner
from quality.dev.content import is_content_correct
from quality.dev.devset import Prompt, is_correct, load
from quality.dev.local_answers import Graded, grade, load_answers, request_for
from quality.logistic import roc_auc
from tests.audit.judge_server import http_transport
from tests.fake_api import DevSetOracle, FakeAPI

NOTIONS = ("strict", "content")
CONFIGURED = 0.6
GRADERS = {"strict": is_correct, "content": is_content_correct}


@dataclass(frozen=True)
class Case:
    prompt: Prompt  # the dev set's prompt the local answer is to (its id, kind and split)
    features: dict[str, float]
    hard: bool
    truth: bool  # the notion's grader on the local answer
    verdict: bool | None  # what the audit said (exact check or stand-in judge)
    method: str | None


@dataclass(frozen=True)
class Answer:
    graded: Graded
    request: dict[str, Any]
    features: dict[str, float]
    hard: bool


def answers() -> list[Answer]:
    out = []
    for g in grade(load(), load_answers()):
        request = request_for(g.prompt)
        sigs = signals(request, g.completion)
        hard = any(s.hard for s in sigs)
        out.append(Answer(g, request, default_combiner().features(sigs), hard))
    return out


async def audit_all(items: Sequence[Answer], api: FakeAPI, correctness: str) -> list[Case]:
    """Reference and verdict of every answer under ``correctness``, through the stand-in API and
    judge, once."""
    cases = []
    grader = GRADERS[correctness]
    async with httpx.AsyncClient(timeout=30) as client:
        post = http_transport(client, api.url)
        for item in items:
            prompt, request = item.graded.prompt, item.request
            reference = answer_text(await post({**request, "model": "gpt-4o-mini"}))
            candidate = answer_text(item.graded.completion)
            match = exact_check(
                reference, candidate, correctness=correctness, request=request["messages"]
            )
            if match is not None:
                verdict, method = True, "exact"
            else:
                body = judge_body(
                    model="gpt-4o-mini",
                    messages=request["messages"],
                    reference=reference,
                    candidate=candidate,
                    correctness=correctness,
                )
                outcome = await ask_judge(post, body)
                verdict, method = outcome.correct, "judge"
            cases.append(
                Case(
                    prompt,
                    item.features,
                    item.hard,
                    grader(prompt.check, candidate),
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
class Report:
    """One gate at one threshold on the unseen half: what it accepted, its true precision, and
    the audited precision a report would show, with its 95% interval."""

    threshold: float
    accepts_nothing: bool
    accepted: int
    true_precision: float | None
    audited_precision: float | None
    low: float
    high: float

    @property
    def covered(self) -> bool | None:
        if self.true_precision is None or self.audited_precision is None:
            return None
        return self.low <= self.true_precision <= self.high


def report(
    gate: Combiner,
    threshold: float,
    cases: Sequence[Case],
    drawn: set[str],
    rate: float,
    *,
    accepts_nothing: bool = False,
) -> Report:
    """``drawn``: the ids of the answers the audit sampler drew (each with chance ``rate``)."""
    accepted = [c for c in cases if score(gate, c) >= threshold]
    true_precision = sum(c.truth for c in accepted) / len(accepted) if accepted else None
    sampled = [c for c in accepted if c.prompt.id in drawn and c.verdict is not None]
    share = weighted_share((1.0 / rate, bool(c.verdict)) for c in sampled)
    return Report(
        threshold=threshold,
        accepts_nothing=accepts_nothing,
        accepted=len(accepted),
        true_precision=true_precision,
        audited_precision=share.value,
        low=share.low,
        high=share.high,
    )


@dataclass(frozen=True)
class Run:
    auc_shipped: float
    auc_calibrated: float
    auc_shipped_heldout: float
    auc_calibrated_heldout: float
    targets: dict[float, Report]
    configured: Report  # the proxy without a target: the shipped gate at 0.6
    unseen: int


def one_run(
    cases: Sequence[Case],
    seed: str,
    rate: float,
    db: Path,
    targets: Sequence[float],
    correctness: str,
    prior_strength: float = cal.PRIOR_STRENGTH,
) -> Run:
    order = sorted(cases, key=lambda c: c.prompt.id)
    random.Random(seed).shuffle(order)  # the same split for every notion and every variant
    half = len(order) // 2
    first, second = order[:half], order[half:]
    shipped = default_combiner()
    if db.exists():
        db.unlink()
    open_database(str(db))
    conn = sqlite3.connect(db)
    records = [
        AuditRecord(
            request_id=c.prompt.id,
            ts=float(i),
            accepted=score(shipped, c) >= CONFIGURED,
            verdict=c.verdict,
            method=c.method,
            weight=1.0,
            features=c.features,
            score=score(shipped, c),
            threshold=CONFIGURED,
            task_kind=c.prompt.kind,
            correctness=correctness,
            local_model="SmolLM2-135M-Instruct.Q4_1.gguf",
        )
        for i, c in enumerate(first)
    ]
    with conn:
        insert(conn, records, log_content=False)
    audits = read(conn, since=0, until=1e12)
    conn.close()
    results = {
        t: cal.calibrate(
            audits,
            base=cal.base_weights(),
            model_sha256="bench",
            model_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            target=t,
            configured_threshold=CONFIGURED,
            prior_strength=prior_strength,
        )
        for t in targets
    }
    calibrated = Combiner.from_dict(results[targets[0]].weights)  # the same refit for every t
    heldout = [c for c in second if c.prompt.split == "heldout"]
    draw = random.Random(f"{seed}:audits")
    drawn = {c.prompt.id for c in second if draw.random() < rate}
    return Run(
        auc_shipped=auc(shipped, second),
        auc_calibrated=auc(calibrated, second),
        auc_shipped_heldout=auc(shipped, heldout),
        auc_calibrated_heldout=auc(calibrated, heldout),
        targets={
            t: report(
                calibrated,
                r.threshold.threshold,
                second,
                drawn,
                rate,
                accepts_nothing=r.threshold.source == "accept_nothing",
            )
            for t, r in results.items()
        },
        configured=report(shipped, CONFIGURED, second, drawn, rate),
        unseen=len(second),
    )


def _mean(values: Sequence[float | None]) -> float:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else float("nan")


def _share(r: Report) -> str:
    if r.audited_precision is None:
        return "-"
    return f"{r.audited_precision:.3f} [{r.low:.3f}, {r.high:.3f}]"


def _true(r: Report) -> str:
    return "-" if r.true_precision is None else f"{r.true_precision:.3f}"


def summarise(runs: Sequence[Run], targets: Sequence[float], rate: float) -> None:
    n = len(runs)
    print(f"  runs {n}; audit rate on the unseen half {rate:g}")
    better = sum(r.auc_calibrated > r.auc_shipped for r in runs)
    print(
        f"  AUC on the unseen half: shipped {_mean([r.auc_shipped for r in runs]):.3f}, "
        f"calibrated {_mean([r.auc_calibrated for r in runs]):.3f} (better in {better}/{n} runs)"
    )
    print(
        "  AUC on its held-out prompts only: shipped "
        f"{_mean([r.auc_shipped_heldout for r in runs]):.3f}, calibrated "
        f"{_mean([r.auc_calibrated_heldout for r in runs]):.3f} (better in "
        f"{sum(r.auc_calibrated_heldout > r.auc_shipped_heldout for r in runs)}/{n} runs)"
    )
    for t in targets:
        reports = [r.targets[t] for r in runs]
        nothing = sum(r.accepts_nothing for r in reports)
        some = [r for r in reports if r.true_precision is not None]
        covered = [r.covered for r in reports if r.covered is not None]
        gaps = [
            abs(r.audited_precision - r.true_precision)
            for r in reports
            if r.audited_precision is not None and r.true_precision is not None
        ]
        worst = min((r.true_precision for r in some if r.true_precision is not None), default=None)
        print(
            f"  target precision {t:g}: accepts nothing in {nothing}/{n} runs; "
            f"{len(some)} runs accept something: "
            f"{_mean([r.accepted for r in some]):.1f} answers a run (of {runs[0].unseen}), true "
            f"precision mean {_mean([r.true_precision for r in some]):.3f}, worst "
            + ("-" if worst is None else f"{worst:.3f}")
            + f", at least {t - 0.05:.2f} in "
            f"{sum(1 for r in some if (r.true_precision or 0) >= t - 0.05 - 1e-9)}/{len(some)}; "
            f"threshold mean {_mean([r.threshold for r in reports if not r.accepts_nothing]):.3f}"
        )
        print(
            f"    audited vs true precision: mean gap {_mean(gaps):.3f}; the 95% interval "
            f"covers the true precision in {sum(covered)}/{len(covered)} runs with a report"
        )
    plain = [r.configured for r in runs]
    covered = [r.covered for r in plain if r.covered is not None]
    gaps = [
        abs(r.audited_precision - r.true_precision)
        for r in plain
        if r.audited_precision is not None and r.true_precision is not None
    ]
    print(
        f"  without a target (shipped gate, threshold {CONFIGURED:g}): accepted "
        f"{_mean([r.accepted for r in plain]):.1f} answers a run at true precision "
        f"{_mean([r.true_precision for r in plain]):.3f}; audited precision off by "
        f"{_mean(gaps):.3f} on average; the 95% interval covers the true precision in "
        f"{sum(covered)}/{len(covered)} runs"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.audit_loop", description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rate", type=float, default=0.5, help="audit rate on the second half")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument(
        "--correctness",
        nargs="+",
        choices=NOTIONS,
        default=list(NOTIONS),
        help="the notions of correct to simulate, each on its own (default: both)",
    )
    parser.add_argument(
        "--target",
        type=float,
        nargs="+",
        default=[0.9, 0.8, 0.6, 0.5],
        help="target precisions (default: 0.9 0.8 0.6 0.5)",
    )
    parser.add_argument(
        "--prior-strength",
        type=float,
        default=cal.PRIOR_STRENGTH,
        help=f"the refit's pull toward the shipped weights (default {cal.PRIOR_STRENGTH:g})",
    )
    args = parser.parse_args(argv)
    items = answers()
    oracle = DevSetOracle()
    with FakeAPI(oracle=oracle, record=False) as api:
        audited = {n: asyncio.run(audit_all(items, api, n)) for n in args.correctness}
    for notion, cases in audited.items():
        agree = sum(1 for c in cases if c.verdict == c.truth)
        exact = sum(1 for c in cases if c.method == "exact")
        failed = sum(1 for c in cases if c.verdict is None)
        print(
            f"correctness = {notion!r}: prompts {len(cases)} (right {sum(c.truth for c in cases)});"
            f" audit verdicts agree with the grader on {agree}; settled by the exact check: "
            f"{exact}; judged {oracle.judged[notion]}; no verdict {failed}"
        )
    for notion, cases in audited.items():
        runs = []
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.runs):
                seed = f"{args.seed}:{i}"
                db = Path(tmp) / "ledger.db"
                run = one_run(cases, seed, args.rate, db, args.target, notion, args.prior_strength)
                runs.append(run)
                print(
                    f"{notion} run {i + 1:2d}: AUC shipped {run.auc_shipped:.3f} calibrated "
                    f"{run.auc_calibrated:.3f} (held-out only {run.auc_shipped_heldout:.3f} / "
                    f"{run.auc_calibrated_heldout:.3f}); "
                    + "; ".join(
                        f"target {t:g}: threshold {r.threshold:.3f}, accepted {r.accepted}, "
                        f"precision true {_true(r)} audited {_share(r)}"
                        for t, r in run.targets.items()
                    ),
                    file=sys.stderr,
                )
        print(f"correctness = {notion!r}:")
        summarise(runs, args.target, args.rate)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
