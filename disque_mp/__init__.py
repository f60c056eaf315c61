"""disque-mp: a multi-process Disque node."""

import os as _os

__version__ = "0.1.0"

if _os.environ.get("DISQUE_MP_PURE"):  # the plain Python source, not the mypyc build
    from disque_mp import compiled as _compiled

    _compiled.force_pure()
