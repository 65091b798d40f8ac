"""The store's web dashboard: one static HTML page whose script reads the store's JSON routes.

No build step and no data in the page itself, so serving it needs no token; the script sends the
token (taken from the URL fragment `#token=...`, which browsers never send to the server, or typed
in) with every JSON request.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

__all__ = ["dashboard_html"]


@lru_cache(maxsize=1)
def dashboard_html() -> str:
    """The dashboard page (read once from the package)."""
    return resources.files(__name__).joinpath("index.html").read_text(encoding="utf-8")
