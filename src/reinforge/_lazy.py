"""Names a package loads on first use (a module `__getattr__`, PEP 562).

Why: torch and transformers take seconds to import; a package whose names need them (the root
package, `reinforge.training`) defers them, so that commands and runners that never train don't pay.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` that imports each name from `where[name]` (a module,
    absolute or relative to `package`) the first time it is asked for."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module, package), name)

    return __getattr__
