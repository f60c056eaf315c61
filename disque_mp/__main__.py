"""Entry point: ``python -m disque_mp`` and the ``disque-mp`` console script."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from disque_mp.cli import main as cli_main

    return cli_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
