"""frugal calibrate: the refit on audits, the prior's pull, the tagged weights file and the CLI.

Audits are written to a real SQLite ledger (the migrations, the audits table) by
``proxy.ledger.audits.audit_record.insert``; their features are drawn at random around the shipped
standardisation, and their verdicts from a "true" model that differs from the shipped one, so
a refit has something to learn.
"""

from __future__ import annotations

import json
import math
import random
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from proxy import cli
from proxy.audit import refit as cal
from proxy.engine.weights import GateWeights
from proxy.ledger.audits.audit_record import AuditRecord, insert
from proxy.ledger.db.location import parse
from proxy.ledger.db.migrate import open_database
from quality.combiner import HARD_CAP, MODEL_TAG, Combiner, Model, WeightsError, file_sha256

SHIPPED = cal.base_weights()
MODEL = Model.from_dict(SHIPPED["models"]["full_no_relevance"])


def synthetic_audits(n: int, seed: int = 0) -> list[AuditRecord]:
    """Audits whose truth leans on ``len_log`` (which the shipped weights barely weigh)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        feats = {
            f: m + s * rng.gauss(0, 1)
            for f, m, s in zip(MODEL.features, MODEL.mean, MODEL.scale, strict=True)
        }
        z = 2.5 * (feats["len_log"] - MODEL.mean[MODEL.features.index("len_log")])
        right = rng.random() < 1 / (1 + math.exp(-z))
        out.append(
            AuditRecord(
                request_id=f"r{i}",
                ts=1000.0 + i,
                accepted=rng.random() < 0.5,
                verdict=right,
                features=feats,
                score=0.5,
                task_kind=rng.choice(["math", "write", "other"]),
                local_model="model.gguf",
            )
        )
    return out


def distance(a: Model, b: Model) -> float:
    return float(np.linalg.norm(np.array(a.coef) - np.array(b.coef)))


def test_few_audits_move_the_weights_a_little_and_many_a_lot() -> None:
    small = cal.calibrate(synthetic_audits(40), base=SHIPPED, model_sha256="ab", model_file="m")
    large = cal.calibrate(synthetic_audits(800), base=SHIPPED, model_sha256="ab", model_file="m")
    moved_small = distance(small.fits["full_no_relevance"].model, MODEL)
    moved_large = distance(large.fits["full_no_relevance"].model, MODEL)
    assert 0 < moved_small < moved_large / 3


def test_the_refit_ranks_unseen_audits_better_than_the_shipped_weights() -> None:
    result = cal.calibrate(synthetic_audits(600), base=SHIPPED, model_sha256="ab", model_file="m")
    fit = result.fits["full_no_relevance"]
    assert fit.auc_after > fit.auc_before + 0.1
    # The written models still obey the shipped rule: a fault never raises the score.
    coef = dict(zip(fit.model.features, fit.model.coef, strict=True))
    assert coef["fmt_fail"] <= 0 and coef["refusal"] <= 0
    # No relevance feature in the audits: the "full" model is the same refit.
    assert result.weights["models"]["full"] == result.weights["models"]["full_no_relevance"]
    assert result.weights[MODEL_TAG] == "ab"


def test_too_few_audits_is_a_plain_refusal() -> None:
    with pytest.raises(cal.CalibrationError, match="at least 20 usable"):
        cal.calibrate(synthetic_audits(10), base=SHIPPED, model_sha256="ab", model_file="m")


def test_failed_audits_are_left_out_and_low_scored_ones_kept() -> None:
    audits = synthetic_audits(60)
    extra = [
        AuditRecord(accepted=True, verdict=None, features=audits[0].features, task_kind="other"),
        AuditRecord(accepted=False, verdict=True, features=audits[0].features, score=0.05),
    ]
    result = cal.calibrate(audits + extra, base=SHIPPED, model_sha256="ab", model_file="m")
    assert result.fits["full_no_relevance"].n == 61


def test_the_refit_learns_from_answers_the_shipped_weights_score_below_the_hard_cap() -> None:
    """Traffic whose truth ignores ``fmt_fail`` (a reader who forgives the form): the shipped
    weights punish it hard, so they score many right answers at or below the hard cap. Those
    are what tell the refit to weigh ``fmt_fail`` less."""
    rng = random.Random(3)
    audits = []
    head = MODEL.features.index("conf_head")
    for i in range(300):
        feats = {
            f: m + s * rng.gauss(0, 1)
            for f, m, s in zip(MODEL.features, MODEL.mean, MODEL.scale, strict=True)
        }
        z = 2.0 * (feats["conf_head"] - MODEL.mean[head]) / MODEL.scale[head]
        audits.append(
            AuditRecord(
                request_id=f"r{i}",
                ts=float(i),
                accepted=False,
                verdict=rng.random() < 1 / (1 + math.exp(-z)),
                features=feats,
                score=MODEL.probability(feats),
                task_kind=rng.choice(["math", "write", "other"]),
            )
        )
    low = [a for a in audits if a.score is not None and a.score <= HARD_CAP]
    assert len(low) > 100 and sum(1 for a in low if a.verdict) > 30
    fit = cal.calibrate(audits, base=SHIPPED, model_sha256="ab", model_file="m").fits
    refit = fit["full_no_relevance"]
    assert refit.n == 300
    shipped = MODEL.coef[MODEL.features.index("fmt_fail")]
    assert refit.model.coef[MODEL.features.index("fmt_fail")] > shipped / 2
    assert refit.auc_after > refit.auc_before + 0.1


def test_the_threshold_reads_a_low_scored_answer_at_its_stored_score() -> None:
    """An answer a hard gate capped stays capped whatever the weights, and the audit does not
    say which low scores were caps: the threshold never counts one as accepted above it."""
    audits = synthetic_audits(200, seed=4)
    capped = [
        AuditRecord(
            request_id=f"c{i}",
            accepted=False,
            verdict=False,
            features=a.features,
            score=0.01,
            task_kind=a.task_kind,
        )
        for i, a in enumerate(audits[:100])
    ]
    plain = cal.calibrate(audits, base=SHIPPED, model_sha256="ab", model_file="m", target=0.6)
    both = cal.calibrate(
        audits + capped, base=SHIPPED, model_sha256="ab", model_file="m", target=0.6
    )
    assert plain.threshold.source == "target"
    # The wrong capped answers weigh on the fit, but at or above the threshold there are none:
    assert both.threshold.source == "target" and both.threshold.threshold > HARD_CAP


def seeded_ledger(tmp_path: Path, audits: list[AuditRecord]) -> Path:
    db = tmp_path / "ledger.db"
    open_database(str(db))
    conn = sqlite3.connect(db)
    with conn:
        insert(conn, audits, log_content=False)
    conn.close()
    return db


def fake_model(tmp_path: Path, content: bytes = b"GGUF not really a model") -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    return path


def test_the_cli_writes_a_weights_file_tagged_for_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = fake_model(tmp_path)
    db = seeded_ledger(tmp_path, synthetic_audits(300))
    other = AuditRecord(accepted=True, verdict=True, features={}, local_model="other.gguf")
    conn = sqlite3.connect(db)
    with conn:
        insert(conn, [other], log_content=False)
    conn.close()
    config = tmp_path / "frugal.toml"
    config.write_text(
        f'[local]\nmodel_path = "{model}"\n[ledger]\npath = "{db}"\n', encoding="utf-8"
    )
    out = tmp_path / "weights.json"
    assert cli.main(["calibrate", "--config", str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "audits of this model: 300" in printed
    assert "AUC shipped" in printed and "threshold for target precision 0.9" in printed
    data = json.loads(out.read_text())
    assert data[MODEL_TAG] == file_sha256(model)
    assert data["model_file"] == "model.gguf"
    Combiner.load_for_model(out, model)  # loads, tag checked


def test_the_cli_says_plainly_when_there_are_too_few_audits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = fake_model(tmp_path)
    db = seeded_ledger(tmp_path, synthetic_audits(5))
    code = cli.main(
        [
            "calibrate",
            "--db",
            str(db),
            "--out",
            str(tmp_path / "w.json"),
            "--config",
            str(_config(tmp_path, model, db)),
        ]
    )
    assert code == 1
    assert "a refit needs at least 20" in capsys.readouterr().err
    assert not (tmp_path / "w.json").exists()


def _config(tmp_path: Path, model: Path, db: Path, **quality: Any) -> Path:
    path = tmp_path / "c.toml"
    lines = [f'[local]\nmodel_path = "{model}"', f'[ledger]\npath = "{db}"', "[quality]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in quality.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def tagged(tmp_path: Path, sha: str) -> Path:
    path = tmp_path / "tagged.json"
    path.write_text(json.dumps({**SHIPPED, MODEL_TAG: sha, "model_file": "big.gguf"}))
    return path


def test_a_file_for_another_model_is_refused_with_both_names(tmp_path: Path) -> None:
    model = fake_model(tmp_path)
    path = tagged(tmp_path, "0" * 64)
    with pytest.raises(WeightsError, match=r"calibrated for big.gguf .* not for model.gguf"):
        Combiner.load_for_model(path, model)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON"),
        ('{"models": {}}', "not a weights file"),
        (json.dumps(SHIPPED), "no model_sha256 tag"),
    ],
)
def test_a_corrupt_or_untagged_file_is_refused(tmp_path: Path, content: str, message: str) -> None:
    model = fake_model(tmp_path)
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(WeightsError, match=message):
        Combiner.load_for_model(path, model)


def test_serve_refuses_a_file_tagged_for_another_model_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = fake_model(tmp_path)
    db = tmp_path / "ledger.db"
    config = _config(tmp_path, model, db, weights_path=str(tagged(tmp_path, "f" * 64)))
    assert cli.main(["serve", "--config", str(config), "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "[quality] weights_path" in err and "not for model.gguf" in err


def test_the_worker_picks_up_a_new_file_and_keeps_the_old_one_when_it_is_bad(
    tmp_path: Path,
) -> None:
    model = fake_model(tmp_path)
    path = tmp_path / "w.json"
    weights = GateWeights(str(path), str(model), optional=True)
    assert weights.start() == {"path": str(path), "calibrated": False}
    assert weights.current() is None  # not refitted yet: the shipped weights
    result = cal.calibrate(
        synthetic_audits(100), base=SHIPPED, model_sha256=file_sha256(model), model_file="m"
    )
    cal.write_weights(path, result.weights)
    first = weights.current()
    assert first is not None
    path.write_text("{broken")
    assert weights.current() is first
    assert weights.problem is not None and "not JSON" in weights.problem
    with pytest.raises(WeightsError, match="no such file"):
        GateWeights(str(tmp_path / "missing.json"), str(model)).start()


async def test_auto_calibration_refits_every_n_new_audits(tmp_path: Path) -> None:
    model = fake_model(tmp_path)
    audits = synthetic_audits(150)
    for a in audits:
        object.__setattr__(a, "local_model", "model.gguf")
    db = seeded_ledger(tmp_path, audits[:90])
    out = tmp_path / "auto.json"
    auto = cal.AutoCalibrator(
        parse(str(db)), str(model), str(out), target=None, configured_threshold=0.6, every=50
    )
    assert await auto.step() is True  # 90 new audits
    assert json.loads(out.read_text())["calibrated_on"]["audits"] == 90
    conn = sqlite3.connect(db)
    with conn:
        insert(conn, audits[90:130], log_content=False)
    conn.close()
    assert await auto.step() is False  # 40 new: fewer than 50
    conn = sqlite3.connect(db)
    with conn:
        insert(conn, audits[130:], log_content=False)
    conn.close()
    assert await auto.step() is True
    assert json.loads(out.read_text())["calibrated_on"]["audits"] == 150
