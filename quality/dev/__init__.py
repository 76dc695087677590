"""The quality gate's development tools: the dev set, its answers, calibration and evaluation.

    devset      the graded prompts (``tests/data/quality_dev.jsonl``) and their checkers
    content     the same prompts graded for content only (any form), as a chat reader would
    answers     the bundled model's answers to them, generated with the real engine and cached
    calibrate   ``python -m quality.dev.fit_weights``: refit ``quality/weights.json`` (train split)
    evaluate    ``python -m quality.dev.evaluate``: the held-out figures in ``quality/README.md``
    metrics     ROC AUC and precision at a threshold

These read ``tests/data`` and run the local engine, so they work from a clone of the repository,
not from an installed copy: the wheel ships ``quality`` without ``quality.dev``. This folder may
import ``quality`` and ``proxy.engine``; ``quality`` proper never imports it, nor ``proxy``.
"""
