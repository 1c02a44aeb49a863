"""Fixtures the DistributedDataLoader tests share: each test runs once
against torch.utils.data.DataLoader (proving the test right) and once
against datahelix.DistributedDataLoader.  Import them into a test module
(`from both_loaders import binary_env, make  # noqa: F401`)."""
import sys

import pytest
import torch

from conftest import ROOT, _binary

sys.path.insert(0, str(ROOT / "python"))
import datahelix  # noqa: E402


@pytest.fixture(autouse=True)
def binary_env(monkeypatch):
    """Our binary; no Coordinator or torchrun rank from the environment."""
    monkeypatch.setenv("DATAHELIX_BIN", _binary())
    monkeypatch.delenv("DATAHELIX_COORDINATOR", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def loader_class(kind):
    return torch.utils.data.DataLoader if kind == "torch" \
        else datahelix.DistributedDataLoader


@pytest.fixture(params=["torch", "datahelix"])
def make(request):
    """make(dataset, **kw): a loader of the parametrized class, 2 workers
    and a 60 s timeout unless told; ours are closed afterwards.
    make.cls / make.kind: that class and "torch" or "datahelix"."""
    made = []

    def mk(*args, **kw):
        kw.setdefault("num_workers", 2)
        kw.setdefault("timeout", 60)
        loader = loader_class(request.param)(*args, **kw)
        made.append(loader)
        return loader

    mk.cls = loader_class(request.param)
    mk.kind = request.param
    yield mk
    for loader in made:
        if hasattr(loader, "close"):
            loader.close()
