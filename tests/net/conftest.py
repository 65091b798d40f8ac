"""The gateway tests' helpers (a served gateway on a scripted backend), shared with this folder."""

from gateway.conftest import (  # noqa: F401  (fixtures and helpers re-exported for this folder)
    SECRET,
    Served,
    finished_attempt,
    running_attempt,
    serve,
    served,
    tokenizer,
)
