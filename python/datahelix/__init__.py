"""datahelix: a data plane for training video and multimodal models.

    loader = datahelix.DataLoader("manifest.jsonl", batch_size=4, frames=16,
                                  size=(224, 224))
    for batch in loader:      # dict: video uint8 [B,T,H,W,3], ids, ...
        ...

Batches are planned while samples are still descriptors (token balance
across ranks), prepared by DataServers inside the current GPU step, and
handed over through shared memory without a copy: ``batch["video"]`` is a
view of the local DataServer's arena, whose slot returns when the last
tensor made from it dies.  See docs/python.md.
"""
from ._loader import DataLoader, DistributedDataLoader  # noqa: F401
from ._decode import (Decoder, Source, Table, audio_features,  # noqa: F401
                      decode, decode_audio, open)  # noqa: A004
from ._cache import cache_stats  # noqa: F401
from ._C import (ArenaExhausted, DataError, SampleError,  # noqa: F401
                 TimeoutError)

__all__ = ["DataLoader", "DistributedDataLoader", "DataError", "SampleError",
           "TimeoutError", "ArenaExhausted", "decode", "decode_audio",
           "audio_features", "open", "Source",
           "Table", "Decoder", "cache_stats"]
__version__ = "0.1.0"
