"""`GET /dashboard`: one static page, its script and its style, served from memory.

No build step and nothing from elsewhere: the page, `app.js` (plain JavaScript drawing
its charts as SVG) and `app.css` are files of this package. The page holds no secret; the
person enters the admin key once (kept in the tab's sessionStorage) or opens
`/dashboard#admin_key=...` (a URL fragment never reaches the server or its logs). The
Content-Security-Policy lets the page load only its own files and talk only to this
proxy.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC = Path(__file__).parent / "static"
FILES = {
    "/dashboard": ("index.html", "text/html"),
    "/dashboard/app.js": ("app.js", "text/javascript"),
    "/dashboard/app.css": ("app.css", "text/css"),
}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        " connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def add_routes(router: web.UrlDispatcher) -> None:
    for path, (name, kind) in FILES.items():
        body = (STATIC / name).read_bytes()

        async def serve(request: web.Request, body: bytes = body, kind: str = kind) -> web.Response:
            return web.Response(body=body, content_type=kind, charset="utf-8", headers=HEADERS)

        router.add_get(path, serve)
