"""The "datahelix" logger (docs/usage.md "Logs"): what the loaders and the
services they start have to say - the Coordinator's and DataServers' own
lines, drained from their stderr, and the loaders' own events - goes
through Python's logging module under the logger named "datahelix".

By default it writes each message as it is (the C processes' lines are
already `datahelix: WHO: LEVEL: MESSAGE`) to whatever sys.stderr is at the
time, at the level $DATAHELIX_LOG names (debug, info, warn - the default:
warnings and errors only -, error), and does not propagate.  An application that routes logs itself
takes it over: remove the handler and set propagate, e.g.
``lg = logging.getLogger("datahelix"); lg.handlers.clear();
lg.propagate = True``.
"""
import logging
import os
import re
import sys

LOGGER = logging.getLogger("datahelix")

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO,
           "warn": logging.WARNING, "warning": logging.WARNING,
           "error": logging.ERROR}
# `datahelix: WHO: LEVEL: ` (the C library's core/log.h format)
_LINE_LEVEL = re.compile(r"^[^:]*(?:: [^:]*)?: (debug|info|warn|error): ")


class _Stderr(logging.StreamHandler):
    """A StreamHandler bound to sys.stderr when it writes, not when it was
    made (test runners and notebooks replace sys.stderr)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # logging.StreamHandler sets it; ignored
        pass


def env_level():
    """The level $DATAHELIX_LOG names; warn when unset or unknown: the
    services a loader starts say their start, joins and stops at info,
    which a training job's terminal does not want each time (issue 41)."""
    return _LEVELS.get(os.environ.get("DATAHELIX_LOG", "").strip().lower(),
                       logging.WARNING)


def server_log():
    """DATAHELIX_LOG for the services a loader starts: the user's, else
    warn (the C programs' own default is info; a loader's terminal wants
    warnings and errors only)."""
    v = os.environ.get("DATAHELIX_LOG", "").strip().lower()
    return {"warning": "warn"}.get(v, v) if v in _LEVELS else "warn"


def _setup():
    if getattr(LOGGER, "_datahelix_ready", False):
        return
    LOGGER._datahelix_ready = True
    LOGGER.setLevel(env_level())
    if not LOGGER.handlers:
        h = _Stderr()
        h.setFormatter(logging.Formatter("%(message)s"))
        LOGGER.addHandler(h)
        LOGGER.propagate = False


def line_level(line):
    """The logging level of one line a datahelix process wrote (info for
    a line without one)."""
    m = _LINE_LEVEL.match(line)
    return _LEVELS[m.group(1)] if m else logging.INFO


_setup()
