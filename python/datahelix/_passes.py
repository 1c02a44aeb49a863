"""Task-id passes of this process (docs/wire-protocol.md "Task ids").

A task's wire id is (pass, step, rank, part), with its epoch carried
beside it.  Every schedule a loader hands its client - an iteration, a
re-planned rest, a resume, each DistributedDataLoader pass - is a new
pass, so a late result of an abandoned schedule can never stand for a step
of this one, at any epoch count.  The count is per process, not per loader
or client: two loaders of one rank in one process that talk to one
Coordinator (a loader closed and a new one resuming from its state, say)
must not give two schedules one id, since the Coordinator may still hold
the old loader's tasks.  A rank is one process, so this is job-wide for
the rank.  The client refuses a pass it has seen and the 65,537th
(DH_WIRE_MAX_PASSES): ids never wrap.
"""
import itertools

_count = itertools.count()  # next() is atomic under the GIL


def new_pass():
    """A pass number this process has not used before."""
    return next(_count)
