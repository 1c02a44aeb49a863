"""The host-local cache of remote objects (docs/remote.md "The cache"):
the loaders' cache_dir= / cache_bytes= arguments and its shared counters.

The counters live in the cache folder's `stats` file, written by every
process that uses the folder (src/media/cache.c: a magic, a version, then
hits, misses, fetched_bytes, evictions and bytes as little-endian u64).
"""
import os
import struct

_MAGIC = 0x44484341
_LAYOUT = struct.Struct("<II5Q")
_FIELDS = ("hits", "misses", "fetched_bytes", "evictions", "bytes")
MIN_BYTES = 4 << 20


def check(cache_dir, cache_bytes):
    """The DataServer arguments for cache_dir / cache_bytes, or []."""
    if cache_dir is None:
        if cache_bytes is not None:
            raise ValueError("datahelix: cache_bytes needs cache_dir (the "
                             "folder the host's DataServers share)")
        return []
    cache_dir = os.path.abspath(os.fspath(cache_dir))
    args = ["--cache-dir", cache_dir]
    if cache_bytes is not None:
        if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) \
                or cache_bytes < MIN_BYTES:
            raise ValueError(f"datahelix: cache_bytes={cache_bytes!r}: an "
                             f"int of at least {MIN_BYTES} (4 MiB)")
        args += ["--cache-bytes", str(cache_bytes)]
    return args


def cache_stats(cache_dir):
    """The counters of the cache in `cache_dir`, every process's together:
    {"hits", "misses" (chunks), "fetched_bytes", "evictions", "bytes"
    (held now)}; None when there is no cache there yet."""
    try:
        with open(os.path.join(os.fspath(cache_dir), "stats"), "rb") as f:
            raw = f.read(_LAYOUT.size)
    except FileNotFoundError:
        return None
    if len(raw) < _LAYOUT.size:
        return None
    magic, _version, *vals = _LAYOUT.unpack(raw)
    if magic != _MAGIC:
        return None
    return dict(zip(_FIELDS, vals))
