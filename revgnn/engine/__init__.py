"""The application around the core: one training loop (:mod:`.loop`) for every backend
(:mod:`.backends`, :mod:`~revgnn.engine.sar_backend`) and data level (:mod:`.tasks`), with atomic run files
(:mod:`.checkpoint`) and signal handling (:mod:`.interrupt`)."""

# the built-in backends register themselves by name (revgnn.engine.backends.BACKENDS)
from revgnn.engine import backends, sar_backend  # noqa: E402, F401
