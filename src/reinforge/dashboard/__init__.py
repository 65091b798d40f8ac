"""The store's web dashboard: a static page and its assets, whose script reads the store's JSON routes.

No build step, no network, no data in the page itself: serving the page and its assets needs no token;
the script sends the token (taken from the URL fragment `#token=...`, which browsers never send to the
server, or typed in) with every JSON request. The charts are drawn by uPlot 1.6.32 (MIT licence, Leon
Sorokin; `assets/uPlot.LICENSE.txt`), copied unmodified from its npm package's `dist/` folder.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

__all__ = ["ASSET_TYPES", "dashboard_asset", "dashboard_html"]

ASSET_TYPES = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
    "uPlot.LICENSE.txt": "text/plain; charset=utf-8",
}
"""The files served under /dashboard/assets/ (a fixed list: a request names one of these or gets 404)."""


@lru_cache(maxsize=1)
def dashboard_html() -> str:
    """The dashboard page (read once from the package)."""
    return resources.files(__name__).joinpath("index.html").read_text(encoding="utf-8")


@lru_cache(maxsize=len(ASSET_TYPES))
def dashboard_asset(name: str) -> tuple[bytes, str] | None:
    """An asset's bytes and media type, or None for a name that is not one of `ASSET_TYPES`."""
    media_type = ASSET_TYPES.get(name)
    if media_type is None:
        return None
    return resources.files(__name__).joinpath("assets", name).read_bytes(), media_type
