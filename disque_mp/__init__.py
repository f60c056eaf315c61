"""disque-mp: a multi-process Disque node."""

import os as _os

__version__ = "0.1.0"  # this package's release
# the Disque protocol version this node answers as (INFO disque_version, HELLO 3): the
# reference server's
DISQUE_VERSION = "1.0-rc1"

if _os.environ.get("DISQUE_MP_PURE"):  # the plain Python source, not the mypyc build
    from disque_mp import compiled as _compiled

    _compiled.force_pure()
