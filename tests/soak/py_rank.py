"""One rank of the chaos soak as a PyTorch training loop would run it:
datahelix.DataLoader with a transform= (which runs on the local
DataServer's Python workers, so the soak can kill those too), against the
soak's Coordinator, printing what `datahelix consume` prints for the
soak's check: delivered ids (--ids-out) and one stderr line per
substitute / skipped step, in consume's words.

    python3 py_rank.py PYTHON_DIR MANIFEST.jsonl COORD RANK WORLD BATCH
                       EPOCHS KEYFILE IDS_OUT
"""
import sys


def keep(video):
    """The transform: the frames as they are (what it is does not matter
    here; that it runs on the workers does)."""
    return video


def main(argv):
    (pydir, manifest, coord, rank, world, batch, epochs, keyfile,
     ids_out) = argv
    sys.path.insert(0, pydir)
    import datahelix

    rank, world, batch, epochs = int(rank), int(world), int(batch), \
        int(epochs)
    with open(ids_out, "w") as out, datahelix.DataLoader(
            manifest, batch_size=batch, frames=4, size=(32, 32), rank=rank,
            world_size=world, coordinator=coord, keyfile=keyfile,
            on_error="skip", transform=keep, num_workers=2, prefetch=2,
            timeout=60) as loader:
        for ep in range(epochs):
            loader.set_epoch(ep)
            steps = set(range(len(loader)))
            for b in loader:
                steps.discard(b["step"])
                for s in b["substituted"]:
                    print(f"datahelix: py-rank: substituted: epoch {ep} "
                          f"step {b['step']} position {s['position']}: "
                          f"sample {s['failed_id']} failed ({s['stage']}, "
                          f"code {s['code']}), sample {s['substitute_id']} "
                          "delivered", file=sys.stderr, flush=True)
                for i in b["ids"].tolist():
                    out.write(f"{i}\n")
                out.flush()
            for st in sorted(steps):  # every spare failed: left out
                print(f"datahelix: py-rank: skipped: rank {rank} epoch {ep} "
                      f"step {st}: no batch", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
