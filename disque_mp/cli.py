"""Command line: ``disque-mp [CONFIG_FILE] [--directive value ...]``, plus subcommands.

As with ``disque-server``, every config directive can be given on the command
line as ``--name args...``; these come after the file and override it.
Subcommands live in other modules, imported only when used:

    disque-mp admin ...            -> disque_mp.tools.admin.main(rest)
    disque-mp check-aof FILE ...   -> disque_mp.tools.check_aof.main(rest)
    disque-mp bench ...            -> bench.loadgen.main(rest)
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from disque_mp import DISQUE_VERSION, __version__

USAGE = """\
Usage: disque-mp [CONFIG_FILE] [--directive value ...]
       disque-mp admin queues|peek|requeue|result|node|cluster ...   (admin --help)
       disque-mp check-aof FILE ...
       disque-mp bench ...
       disque-mp --test-config [CONFIG_FILE] [--directive value ...]
       disque-mp --version | --help

Starts one Disque node: a supervisor and one worker process per core (or
--workers N), serving the Disque protocol on --port (default 7711).
Any directive of disque.conf may be given as --name value and overrides the
file, for example:

  disque-mp /etc/disque-mp/disque-mp.conf --port 7712 --workers 2
  disque-mp --port 7711 --bind 127.0.0.1 --dir /var/lib/disque-mp --loglevel verbose
  disque-mp --appendonly yes --appendfsync everysec

--test-config  read the configuration, report errors, and exit (0 = valid)

A password on the command line (--requirepass) is readable by every local user
in /proc/<pid>/cmdline: give it as --requirepass-file FILE (its first line,
a file of mode 0600) or in the environment variable DISQUE_MP_REQUIREPASS.

Config directives (each one documented in docs/operations.md, "Configuration
file"; systemd/disque-mp.conf is an example file):
"""

# requirepass from the environment: after the config file, before the command line
REQUIREPASS_ENV = "DISQUE_MP_REQUIREPASS"

# subcommand -> (module, function); imported lazily so that a node start does
# not pay for them and a missing one is a clear error, not an ImportError.
SUBCOMMANDS = {
    "admin": ("disque_mp.tools.admin", "main"),
    "check-aof": ("disque_mp.tools.check_aof", "main"),
    "bench": ("bench.loadgen", "main"),
}
# what to do where a subcommand's module is not installed (the wheel holds disque_mp,
# workers and bus; bench/ ships with the source tree only)
MISSING_HINTS = {
    "bench": ("the load generator ships with the source tree, not the wheel: in a checkout "
              "of disque-mp run `.venv/bin/disque-mp bench ...` (after `make run` or "
              "`make compile`) or `python -m bench.loadgen ...`; redis-benchmark "
              "(apt-get install redis-tools) drives a node from anywhere"),
}


class UsageError(Exception):
    pass


def parse_args(argv: list[str]) -> tuple[str | None, list[list[str]], bool]:
    """(config file, [[directive, args...], ...], test_only) from the arguments."""
    path: str | None = None
    overrides: list[list[str]] = []
    test_only = False
    i = 0
    if argv and argv[0] == "--test-config":
        test_only, i = True, 1
    if i < len(argv) and not argv[i].startswith("--"):
        path, i = argv[i], i + 1
    while i < len(argv):
        word = argv[i]
        if not word.startswith("--") or word == "--":
            raise UsageError(f"unexpected argument {word!r} (options are --name value)")
        name, eq, value = word[2:].partition("=")
        args = [value] if eq else []
        i += 1
        while not eq and i < len(argv) and not argv[i].startswith("--"):
            args.append(argv[i])
            i += 1
        if not args:
            raise UsageError(f"option --{name} needs a value")
        overrides.append([name, *args])
    return path, overrides, test_only


def _source_tree_on_path(module_name: str) -> None:
    """bench/ ships with the source tree, not the installed package: when this
    disque_mp runs from a checkout (editable install), import from there."""
    root = Path(__file__).resolve().parent.parent
    top = module_name.split(".")[0]
    if (root / top / "__init__.py").exists() and str(root) not in sys.path:
        sys.path.insert(0, str(root))


def _subcommand(name: str, rest: list[str]) -> int:
    module_name, func_name = SUBCOMMANDS[name]
    _source_tree_on_path(module_name)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or not module_name.startswith(e.name):
            raise  # the module exists but something it imports is missing
        hint = MISSING_HINTS.get(name, f"install disque-mp from its source tree "
                                       f"({module_name} is missing)")
        print(f"disque-mp: the '{name}' subcommand is not in this installation: {hint}",
              file=sys.stderr)
        return 2
    result = getattr(module, func_name)(rest)
    return int(result or 0)


def version_text() -> str:
    """``--version``: both versions, each named (``admin node`` shows the same two)."""
    return (f"disque-mp {__version__}\n"
            f"Disque protocol version {DISQUE_VERSION} (the reference server it answers as)\n")


def directive_list(width: int = 78) -> str:
    """Every directive name, wrapped: what ``--help`` lists after USAGE."""
    from disque_mp.node.config import DIRECTIVES

    lines, line = [], " "
    for d in DIRECTIVES:
        if len(line) + 1 + len(d.name) > width:
            lines.append(line)
            line = " "
        line += " " + d.name
    return "\n".join([*lines, line]) + "\n"


def main(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        return _subcommand(argv[0], argv[1:])
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE + directive_list(), end="")
        return 0
    if any(a in ("-v", "--version") for a in argv):
        print(version_text(), end="")
        return 0
    try:
        path, overrides, test_only = parse_args(argv)
    except UsageError as e:
        print(f"disque-mp: {e}\n\n{USAGE}", file=sys.stderr, end="")
        return 2
    from disque_mp.node import config

    env_pass = os.environ.pop(REQUIREPASS_ENV, None)  # the workers need not see it
    if env_pass:
        overrides = [["requirepass", env_pass], *overrides]
    try:
        cfg = config.load(path, overrides)
    except config.ConfigError as e:
        print(e.report(), file=sys.stderr, end="")
        return 1
    if test_only:
        problem = config.check_secret_file(cfg)  # the files it names, as this user reads them
        if problem:
            print(f"disque-mp: {problem}", file=sys.stderr)
            return 1
        print(f"disque-mp: configuration {path or '(command line)'} is valid")
        return 0
    from disque_mp.node import supervisor

    return supervisor.run(cfg)
