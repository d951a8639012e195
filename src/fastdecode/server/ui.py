"""The chat page at GET /: an HTML file, its script and its stylesheet, shipped as package data.

The script is a file of its own, so the Content-Security-Policy can forbid
inline script: even text that reached the page as HTML could not run, and
nothing is loaded from another host.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from starlette.responses import Response

CSP = "; ".join((
    "default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'",
    "img-src 'self' data:", "base-uri 'none'", "form-action 'none'", "frame-ancestors 'none'",
))
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidate, so a new version of the package shows at once
}
# URL path -> (file under static/, media type). The page links its files relatively (ui/...),
# so it also works behind a proxy that serves it under a path prefix.
FILES = {
    "/": ("chat.html", "text/html; charset=utf-8"),
    "/ui/chat.js": ("chat.js", "text/javascript; charset=utf-8"),
    "/ui/chat.css": ("chat.css", "text/css; charset=utf-8"),
}


def ui_router() -> APIRouter:
    router = APIRouter()
    static = resources.files(__package__) / "static"
    for path, (name, media_type) in FILES.items():
        router.add_api_route(path, _serve((static / name).read_bytes(), media_type), methods=["GET"],
                             include_in_schema=False)
    return router


def _serve(body: bytes, media_type: str):
    async def serve() -> Response:
        return Response(body, media_type=media_type, headers=HEADERS)
    return serve
