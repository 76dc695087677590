"""``GET /dashboard``: the savings page, served from files inside the package.

The page (``static/dashboard.html``, ``.css``, ``.js`` and ``format.js``) and the chart library
it draws with (uPlot, MIT, taken from the npm registry with its licence: ``static/uPlot.*``) are
read once, when the app is made, and served from memory. Nothing is fetched from anywhere else
at run time, and nothing is built: the files in the repository are the files served.

The page holds no data. It asks for a client key (kept in the tab's ``sessionStorage``) unless
the proxy is keyless, then reads ``/v1/frugal/report`` (:mod:`proxy.server.report`), ``/healthz``
and ``/metrics`` with it as ``Authorization: Bearer``. So ``/dashboard`` and its files are open
paths (:data:`proxy.server.auth.OPEN_PATHS`); the key is checked on every data call.

Every response here carries :data:`SECURITY_HEADERS`: a Content-Security-Policy that allows
scripts, styles, images and connections from this origin only and no inline script (markup
that a model or key name might smuggle in could not run), ``frame-ancestors 'none'`` (no page
can frame it), ``nosniff``, and no referrer. Each file has an ETag and is revalidated
(``no-cache``), so a new version of the proxy is picked up on the next load.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

from proxy.errors import NotFound

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
}
PAGE = "dashboard.html"
FILES = (
    PAGE,
    "dashboard.css",
    "dashboard.js",
    "format.js",
    "icon.svg",
    "uPlot.iife.min.js",
    "uPlot.min.css",
    "uPlot.LICENSE.txt",
)
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",  # frame-ancestors, for browsers that predate it
    "referrer-policy": "no-referrer",
}


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


def _load(name: str) -> Asset:
    body = resources.files("proxy.server").joinpath("static", name).read_bytes()
    suffix = name[name.rindex(".") :]
    return Asset(body, CONTENT_TYPES[suffix], '"' + hashlib.sha256(body).hexdigest()[:32] + '"')


class Dashboard:
    """The page and its files (``names`` of :data:`FILES`), read once; ``page`` serves
    ``/dashboard``, ``asset`` the rest."""

    def __init__(self, names: tuple[str, ...] = FILES) -> None:
        self.assets = {name: _load(name) for name in names}

    async def page(self, request: Request) -> Response:
        return self._send(request, self.assets[PAGE])

    async def asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        asset = self.assets.get(name) if name != PAGE else None
        if asset is None:
            raise NotFound(f"no such file of the dashboard: {name[:100]}")
        return self._send(request, asset)

    @staticmethod
    def _send(request: Request, asset: Asset) -> Response:
        headers = {**SECURITY_HEADERS, "etag": asset.etag, "cache-control": "no-cache"}
        if asset.etag in request.headers.get("if-none-match", ""):
            return Response(status_code=304, headers=headers)
        return Response(asset.body, media_type=asset.content_type, headers=headers)
