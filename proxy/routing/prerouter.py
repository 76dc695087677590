"""The pre-router: from the request alone, will the local answer be accepted?

A small logistic model over what a request says before any answer exists:

    task_<kind>        the task kind (``quality.task``: json, math, code, ...; "other" is all 0)
    req_len_log        log(1 + characters in the messages)
    req_instructions   explicit format instructions found (``quality.instructions``)
    req_system         a system (or developer) message is present
    req_format         a ``response_format`` other than text
    req_turns          log(1 + earlier messages)
    req_template       how often requests of the same template (the system message and the
                       user message's first three words) were accepted: the smoothed log-odds
                       over the training audits, relative to all of them (0 when unseen)

It is fitted by ``frugal calibrate`` (:func:`fit`, on the audits' ``accepted`` flags) and kept in
the calibrated weights file under ``"prerouter"``. :class:`PreRouter` reads it from
``[quality] weights_path`` (again when the file changes) and, with ``[router] prereject = true``,
says "skip the local attempt" for a request whose chance of acceptance is below
:data:`REJECT_BELOW`, except for an :data:`EXPLORE` share of them, drawn at random, which still
try locally so that the audits keep seeing such requests. A model fitted on fewer than
:data:`MIN_AUDITS` audits never acts. The request features are what the audits should store
(:func:`request_features`, merged into an audit's features): the model uses those found there.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from quality._view import view_of
from quality.combiner import Model
from quality.instructions import failed_instructions
from quality.logistic import fit_logistic, standardise
from quality.task import KINDS, kind_of

REJECT_BELOW = 0.15
"""A request whose predicted chance of being accepted is below this goes to the API at once."""
EXPLORE = 0.1
"""Share of the requests predicted to be rejected that still try locally, to keep learning."""
MIN_AUDITS = 100
"""Fewest audits (with both outcomes, at least 10 each) a pre-router must be fitted on to act."""
MIN_EACH = 10
TEMPLATE_SMOOTHING = 10.0  # pseudo-audits at the overall rate behind each template's rate
MAX_TEMPLATES = 500
RECHECK_S = 10.0  # how often the weights file is looked at again
LAMBDA = 1.0
TEMPLATE_KEY = "req_template_id"
BASE_FEATURES = (
    *(f"task_{k}" for k in KINDS),
    "req_len_log",
    "req_instructions",
    "req_system",
    "req_format",
    "req_turns",
)
_EMPTY_ANSWER: dict[str, Any] = {"choices": [{"message": {"content": ""}}]}


def template_id(body: Mapping[str, Any]) -> int:
    """A 28-bit number naming the request's template: its system message(s) and the first
    three words of its last user message (a float holds it exactly, as audits store features)."""
    view = view_of(dict(body), _EMPTY_ANSWER)
    system = view.instructions[: max(0, len(view.instructions) - len(view.prompt))]
    head = " ".join(view.prompt.lower().split()[:3])
    digest = hashlib.sha256(f"{system}\x00{head}".encode()).hexdigest()
    return int(digest[:7], 16)


def request_features(body: Mapping[str, Any]) -> dict[str, float]:
    """The pre-router's features of a chat request (no answer needed)."""
    view = view_of(dict(body), _EMPTY_ANSWER)
    kind = kind_of(view)
    messages = body.get("messages")
    if not isinstance(messages, list):
        messages = []
    chars = sum(
        len(json.dumps(m.get("content"), ensure_ascii=False))
        for m in messages
        if isinstance(m, dict)
    )
    _, instructions = failed_instructions(view.instructions, "")
    fmt = view.response_format
    features = {f"task_{k}": 1.0 if k == kind else 0.0 for k in KINDS}
    features.update(
        req_len_log=math.log1p(chars),
        req_instructions=float(instructions),
        req_system=1.0 if len(view.instructions) > len(view.prompt) else 0.0,
        req_format=1.0 if fmt is not None and fmt.get("type") != "text" else 0.0,
        req_turns=math.log1p(max(0, len(messages) - 1)),
    )
    features[TEMPLATE_KEY] = float(template_id(body))
    return features


def _feature(name: str, x: Mapping[str, float], templates: Mapping[int, float]) -> float:
    """A feature's value for the model: the template's learned log-odds shift for
    ``req_template``, else the request's own feature (0 when it lacks it)."""
    if name == "req_template":
        return templates.get(int(x.get(TEMPLATE_KEY, -1.0)), 0.0)
    return float(x.get(name, 0.0))


@dataclass(frozen=True, kw_only=True)
class PreRouterModel:
    """The gate's own standardised logistic model (:class:`quality.combiner.Model`) over the
    request's features, with the per-template shifts and what it was fitted on."""

    model: Model
    templates: dict[int, float] = field(default_factory=dict)  # template id -> log-odds shift
    audits: int = 0
    accepted: int = 0
    cv_auc: float | None = None

    def probability(self, x: Mapping[str, float]) -> float:
        values = {name: _feature(name, x, self.templates) for name in self.model.features}
        return self.model.probability(values)

    @property
    def ready(self) -> bool:
        rejected = self.audits - self.accepted
        return self.audits >= MIN_AUDITS and min(self.accepted, rejected) >= MIN_EACH

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.model.to_dict(),
            "templates": {str(k): v for k, v in self.templates.items()},
            "audits": self.audits,
            "accepted": self.accepted,
            "cv_auc": self.cv_auc,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PreRouterModel:
        return cls(
            model=Model.from_dict(data),  # checks that the four lists have one length
            templates={int(k): float(v) for k, v in (data.get("templates") or {}).items()},
            audits=int(data.get("audits", 0)),
            accepted=int(data.get("accepted", 0)),
            cv_auc=None if data.get("cv_auc") is None else float(data["cv_auc"]),
        )


def _template_table(rows: Sequence[Mapping[str, float]], y: Sequence[bool]) -> dict[int, float]:
    """Each template's smoothed log-odds of acceptance, relative to all rows' (the most
    frequent :data:`MAX_TEMPLATES`, seen at least twice)."""
    counts: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for row, accepted in zip(rows, y, strict=True):
        if TEMPLATE_KEY in row:
            c = counts[int(row[TEMPLATE_KEY])]
            c[0] += 1
            c[1] += int(accepted)
    rate = (sum(y) + 1.0) / (len(y) + 2.0)
    base = math.log(rate / (1 - rate))
    common = sorted(counts.items(), key=lambda kv: -kv[1][0])[:MAX_TEMPLATES]
    table = {}
    for key, (n, hits) in common:
        if n < 2:
            continue
        p = (hits + TEMPLATE_SMOOTHING * rate) / (n + TEMPLATE_SMOOTHING)
        table[key] = math.log(p / (1 - p)) - base
    return table


def fit(rows: Sequence[Mapping[str, float]], accepted: Sequence[bool]) -> PreRouterModel | None:
    """Fit on audits' features and whether the gate accepted; None without both outcomes.
    Uses the request features present in every row (the task kind always is)."""
    y_list = [bool(a) for a in accepted]
    if not rows or all(y_list) or not any(y_list):
        return None
    names = [f for f in BASE_FEATURES if all(f in r for r in rows)]
    templates = _template_table(rows, y_list) if all(TEMPLATE_KEY in r for r in rows) else {}
    if templates:
        names.append("req_template")
    x = np.array([[_feature(n, r, templates) for n in names] for r in rows], dtype=float)
    y = np.array([1.0 if a else 0.0 for a in y_list])
    mean, scale = standardise(x) if names else (np.zeros(0), np.zeros(0))
    coef, b = fit_logistic((x - mean) / scale if names else x, y, LAMBDA)
    return PreRouterModel(
        model=Model(
            features=tuple(names),
            mean=tuple(float(v) for v in mean),
            scale=tuple(float(v) for v in scale),
            coef=tuple(float(v) for v in coef),
            intercept=float(b),
        ),
        templates=templates,
        audits=len(y_list),
        accepted=sum(y_list),
    )


class PreRouter:
    """The pre-router of one server: its model, read from ``[quality] weights_path``."""

    def __init__(
        self,
        weights_path: str,
        *,
        enabled: bool,
        rng: random.Random | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        self.weights_path = weights_path
        self.enabled = enabled and bool(weights_path)
        self.model: PreRouterModel | None = None
        self.problem: str | None = None
        self._rng = rng or random.Random()
        self._clock = clock
        self._checked = -math.inf
        self._stamp: tuple[int, int] | None = None

    def refresh(self) -> None:
        """Read the model again if the weights file changed (at most every ``RECHECK_S``)."""
        now = self._clock()
        if now - self._checked < RECHECK_S:
            return
        self._checked = now
        try:
            st = os.stat(self.weights_path)
        except OSError:
            self.model = None
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            with open(self.weights_path, encoding="utf-8") as f:
                data = json.load(f).get("prerouter")
            self.model = PreRouterModel.from_dict(data) if data else None
            self.problem = None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            self.model = None
            self.problem = f"{type(exc).__name__}: {exc}"

    def predicted_reject(self, body: Mapping[str, Any]) -> bool:
        """True when this request should skip the local attempt (``predicted_reject``)."""
        if not self.enabled or "messages" not in body:
            return False
        self.refresh()
        model = self.model
        if model is None or not model.ready:
            return False
        if model.probability(request_features(body)) >= REJECT_BELOW:
            return False
        return self._rng.random() >= EXPLORE  # the explored ones try locally all the same

    def health(self) -> dict[str, Any]:
        model = self.model
        return {
            "enabled": self.enabled,
            "active": bool(self.enabled and model is not None and model.ready),
            "audits": model.audits if model is not None else 0,
            "problem": self.problem,
        }
