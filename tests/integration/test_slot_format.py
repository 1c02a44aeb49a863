"""The slot format of DistributedDataLoader batches (python/datahelix/_slot.py,
docs/python.md "The slot format"), without a server: every leaf kind
round-trips with its type, tensors and arrays are views of the slot, what
the format cannot carry is refused at the writer naming its place, and a
hostile slot (bad offsets, huge shapes, unknown dtypes, deep nesting,
invalid JSON, a pickle) is refused with a clear error and runs no code.
"""
import collections
import json
import pathlib
import pickle
import sys

import pytest

from conftest import ROOT

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
sys.path.insert(0, str(ROOT / "python"))
from datahelix import _slot  # noqa: E402

Point = collections.namedtuple("Point", ["x", "label"])


def encode(obj):
    p = _slot.plan_batch(obj)
    buf = bytearray(p.nbytes)
    p.write(memoryview(buf))
    return buf


def decode(buf):
    return _slot.decode(buf)


def slot(meta, data=b"", magic=_slot.MAGIC):
    """A slot of `meta` (a dict: JSON; bytes: as is) and `data`."""
    m = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    head = magic + len(m).to_bytes(8, "little") + m
    head += b"\0" * (-len(head) % _slot.ALIGN)
    return bytearray(head + data)


def inside(ptr, buf):
    lo = np.frombuffer(buf, dtype=np.uint8).__array_interface__["data"][0]
    return lo <= ptr < lo + len(buf)


def test_every_leaf_kind_round_trips_with_its_type():
    batch = {
        "img": torch.arange(24, dtype=torch.float32).view(2, 3, 4),
        "strided": torch.arange(6).view(2, 3).t(),   # not contiguous
        "kinds": [torch.tensor([True, False]),
                  torch.ones(2, dtype=torch.bfloat16),
                  torch.zeros(0, 5, dtype=torch.int16)],
        "np": np.arange(6, dtype=np.int32).reshape(3, 2),
        "np_scalar": np.float64(2.5),
        "complex": np.array([1 + 2j], dtype=np.complex64),
        "scalars": (1, -2 ** 70, 2.5, float("inf"), True, None, "s\u00e9",
                    b"\x00raw\xff"),
        "point": Point(torch.tensor([1, 2]), "p"),
        7: "int key", ("k", 1): "tuple key", None: "none key",
    }
    got = decode(encode(batch))["obj"]
    assert set(got) == set(batch)
    assert torch.equal(got["img"], batch["img"]) and \
        got["img"].dtype == torch.float32
    assert torch.equal(got["strided"], batch["strided"])
    for a, b in zip(got["kinds"], batch["kinds"]):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    assert got["np"].dtype == np.int32 and got["np"].tolist() == \
        batch["np"].tolist()
    assert type(got["np_scalar"]) is np.float64 and got["np_scalar"] == 2.5
    assert got["complex"].tolist() == [1 + 2j]
    assert type(got["scalars"]) is tuple and got["scalars"] == \
        batch["scalars"]
    assert [type(v) for v in got["scalars"]] == \
        [type(v) for v in batch["scalars"]]
    p = got["point"]
    assert type(p).__name__ == "Point" and p._fields == ("x", "label")
    assert p.x.tolist() == [1, 2] and p.label == "p"
    # its own class: this module is loaded where the batch is read (issue
    # 41: batch types preserved, as torch's default_collate keeps them)
    assert type(p) is Point
    assert type(decode(encode([1, (2,)]))["obj"]) is list


def test_a_namedtuple_whose_module_is_not_loaded_is_rebuilt(monkeypatch):
    """The class is found by dict lookups in sys.modules only: a module
    the reader has not loaded is never imported, the tuple is rebuilt by
    name and fields; a loaded name that is no namedtuple of those fields
    is not used either."""
    import sys
    orig = Point
    buf = encode(Point(1, "a"))
    meta_mod = sys.modules[__name__]
    monkeypatch.delitem(sys.modules, __name__)
    got = decode(buf)["obj"]
    assert type(got) is not orig and type(got).__name__ == "Point"
    assert got == (1, "a") and got._fields == ("x", "label")
    assert __name__ not in sys.modules  # not imported by the reader
    monkeypatch.setitem(sys.modules, __name__, meta_mod)
    other = collections.namedtuple("Point", ["x", "y"])  # other fields
    monkeypatch.setattr(meta_mod, "Point", other)
    got = decode(buf)["obj"]
    assert type(got) is not other and got._fields == ("x", "label")
    monkeypatch.setattr(meta_mod, "Point", orig)
    assert type(decode(buf)["obj"]) is orig


def test_tensors_and_arrays_are_views_of_the_slot():
    buf = encode({"t": torch.arange(1000), "a": np.ones(500),
                  "b": [torch.zeros(3, 3)]})
    got = decode(buf)["obj"]
    for t in (got["t"], got["b"][0]):
        assert inside(t.data_ptr(), buf)
    assert inside(got["a"].__array_interface__["data"][0], buf)
    got["t"][0] = 77  # a view: writing it writes the slot
    assert decode(buf)["obj"]["t"][0].item() == 77


class Foo:
    pass


@pytest.mark.parametrize("obj, where, what", [
    ({"meta": [1, 2, Foo()]}, r"batch\['meta'\]\[2\]", "type .*Foo"),
    ([{"k": {1, 2}}], r"batch\[0\]\['k'\]", "type builtins.set"),
    ({Foo(): 1}, r"batch\[<.*Foo.*\]", "dict key of type Foo"),
    ((np.array([object()]),), r"batch\[0\]", "numpy dtype object"),
    ({"s": torch.zeros(3).to_sparse()}, r"batch\['s'\]", "sparse"),
    (Point(1, lambda: 0), r"batch\.label", "type builtins.function"),
    ([collections.namedtuple("R", ["a", "def"], rename=True)(1, 2)],
     r"batch\[0\]", "namedtuple R .* cannot be rebuilt"),
])
def test_what_cannot_travel_is_refused_naming_its_place(obj, where, what):
    with pytest.raises(TypeError, match=f"{where}: .*{what}") as ei:
        _slot.plan_batch(obj)
    assert "allowed" in str(ei.value) or "sparse" in what or \
        "key" in what or "rebuilt" in what


def test_nesting_past_the_cap_is_refused_at_the_writer():
    deep = 1
    for _ in range(_slot.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(TypeError, match="nested deeper than 64"):
        _slot.plan_batch(deep)
    ok = 1
    for _ in range(_slot.MAX_DEPTH - 1):
        ok = [ok]
    assert decode(encode(ok))["obj"] == ok


def tensor_meta(entry, root=None):
    return {"v": 2, "kind": "batch", "root": root or {"T": 0},
            "tensors": [entry]}


def nested(n):
    return {"v": 2, "kind": "batch",
            "root": json.loads("{\"l\":[" * n + "]}" * n)}


HOSTILE = [
    ("bad magic", slot({}, magic=b"NOTASLOT"), "bad magic"),
    ("truncated", bytearray(b"DHPYSLT2\x05"), "bad magic"),
    ("meta length past the slot",
     bytearray(_slot.MAGIC + (1 << 62).to_bytes(8, "little")),
     "runs past the slot"),
    ("invalid JSON", slot(b"{\"v\": 2, \"kind\": \"batch\", "), "not JSON"),
    ("not UTF-8", slot(b"\xff\xfe"), "not JSON"),
    ("JSON list", slot(b"[1, 2]"), "not a version 2"),
    ("wrong version", slot({"v": 1, "kind": "batch", "root": 1}),
     "not a version 2"),
    ("unknown kind", slot({"v": 2, "kind": "exec", "root": 1}),
     "unknown kind"),
    ("offset past the slot",
     slot(tensor_meta(["uint8", [64], 64, 64]), b"\0" * 64),
     "outside the slot"),
    ("negative offset", slot(tensor_meta(["uint8", [4], -64, 4]), b"\0" * 64),
     "offset: -64 is not"),
    ("unaligned offset", slot(tensor_meta(["uint8", [4], 3, 4]), b"\0" * 64),
     "outside the slot"),
    ("huge shape", slot(tensor_meta(["uint8", [1 << 40, 1 << 40], 0, 64]),
                        b"\0" * 64), "bytes, not 64"),
    ("dim too big", slot(tensor_meta(["uint8", [1 << 63], 0, 8])),
     "a dim"),
    ("negative dim", slot(tensor_meta(["uint8", [-1], 0, 0])), "a dim"),
    ("too many dims", slot(tensor_meta(["uint8", [1] * 40, 0, 1])),
     "at most 32"),
    ("shape of a string", slot(tensor_meta(["uint8", "64", 0, 64])),
     "shape is not a list"),
    ("nbytes beyond shape", slot(tensor_meta(["float32", [4], 0, 64]),
                                 b"\0" * 64), "16 bytes, not 64"),
    ("unknown dtype", slot(tensor_meta(["object", [1], 0, 8]), b"\0" * 64),
     "dtype 'object' is not allowed"),
    ("dtype attribute", slot(tensor_meta(["__class__", [1], 0, 8])),
     "dtype '__class__' is not allowed"),
    ("numpy object dtype",
     slot({"v": 2, "kind": "batch", "root": {"N": 0},
           "arrays": [["object", [1], 0, 8]]}, b"\0" * 64),
     "dtype 'object' is not allowed"),
    ("tensor index out of range", slot(tensor_meta(["uint8", [1], 0, 1],
                                                   {"T": 5}), b"\0" * 64),
     "tensor index: 5"),
    ("bytes past the slot",
     slot({"v": 2, "kind": "batch", "root": {"B": 0},
           "bytes": [[0, 1 << 40]]}), "outside the slot"),
    ("deep nesting", slot(nested(_slot.MAX_DEPTH + 1)), "deeper than 64"),
    ("very deep JSON", slot(b"[" * 200000 + b"]" * 200000),
     "nests too deep|not JSON|not a version"),
    ("unknown tag", slot({"v": 2, "kind": "batch", "root": {"X": 1}}),
     "unknown node tag"),
    ("a dict that is no node",
     slot({"v": 2, "kind": "batch", "root": {"a": 1, "b": 2}}),
     "no node"),
    ("namedtuple of a dotted name",
     slot({"v": 2, "kind": "batch",
           "root": {"nt": "os.system", "f": ["a"], "v": [1]}}),
     "not an identifier"),
    ("namedtuple of bad fields",
     slot({"v": 2, "kind": "batch",
           "root": {"nt": "P", "f": ["__import__"], "v": [1]}}),
     "namedtuple 'P'"),
    ("namedtuple with a module that is no string",
     slot({"v": 2, "kind": "batch",
           "root": {"nt": "P", "f": ["a"], "v": [1], "m": 7, "q": "P"}}),
     "no string"),
    ("namedtuple values for fields",
     slot({"v": 2, "kind": "batch",
           "root": {"nt": "P", "f": ["a", "b"], "v": [1]}}),
     "1 values for 2 fields"),
    ("unhashable key",
     slot({"v": 2, "kind": "batch", "root": {"d": [[{"l": []}, 1]]}}),
     "dict key of type list"),
    ("too many tensors",
     slot({"v": 2, "kind": "batch", "root": None,
           "tensors": [["uint8", [0], 0, 0]] * (_slot.MAX_BUFFERS + 1)}),
     "at most 65536"),
    ("error without text",
     slot({"v": 2, "kind": "error", "module": "builtins",
           "qualname": "ValueError", "name": "ValueError", "message": "m",
           "traceback": 5, "worker_id": 0, "pid": 1, "sample": None,
           "where": "w"}), "error traceback: not a string"),
    ("error of unknown stage",
     slot({"v": 2, "kind": "error", "module": "builtins",
           "qualname": "ValueError", "name": "ValueError", "message": "m",
           "traceback": "t", "worker_id": 0, "pid": 1, "sample": None,
           "where": "w", "stage": "x"}), "stage 'x'"),
]


@pytest.mark.parametrize("name, buf, cause", HOSTILE,
                         ids=[h[0] for h in HOSTILE])
def test_a_hostile_slot_is_refused_with_its_cause(name, buf, cause):
    with pytest.raises(_slot.SlotError, match=cause):
        decode(buf)
    assert issubclass(_slot.SlotError, ValueError)


class Marker:
    """Unpickling this creates the file `path` (it calls open())."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickle_in_a_slot_is_never_executed(tmp_path):
    mark = tmp_path / "pwned"
    payload = pickle.dumps(Marker(mark))
    pickle.loads(payload)  # the payload works: it creates the file ...
    assert mark.exists()
    mark.unlink()
    old = bytearray(b"DHPYSLT1" + len(payload).to_bytes(8, "little") +
                    payload)
    for buf in (old,                      # the old format's header
                slot(payload),            # as the description
                slot({"v": 2, "kind": "batch", "root": payload.hex()},
                     payload)):           # as a string and as data
        try:
            out = decode(buf)
            assert out["obj"] == payload.hex()  # a string stays a string
        except _slot.SlotError:
            pass
        assert not mark.exists()  # ... but a slot never runs it
    # Nothing on the reading side can unpickle.
    src = pathlib.Path(_slot.__file__).read_text()
    assert "pickle" not in src.replace("never unpickled", "")
    assert not hasattr(_slot, "pickle")


def test_an_error_travels_as_text():
    try:
        raise KeyError("bad key")
    except KeyError:
        p = _slot.plan_error(sys.exc_info(), 1, 42, 7, "in a worker")
    buf = bytearray(p.nbytes)
    p.write(memoryview(buf))
    err = decode(buf)
    assert err["kind"] == "error" and err["name"] == "KeyError"
    assert err["module"] == "builtins" and err["message"] == "'bad key'"
    assert "Traceback (most recent call last)" in err["traceback"]
    assert (err["sample"], err["pid"], err["worker_id"]) == (7, 42, 1)
    assert all(type(v) in (str, int, type(None)) for v in err.values())


def test_an_error_type_is_looked_up_never_imported():
    from datahelix._distributed import _error_type

    assert _error_type("builtins", "KeyError") is KeyError
    assert _error_type("datahelix._slot", "EncodeError") is _slot.EncodeError
    # A module this process has not imported stays so (importing `this`
    # would print; any module's import runs its code).
    assert "this" not in sys.modules
    assert _error_type("this", "Anything") is None
    assert "this" not in sys.modules
    for module, qualname in [("builtins", "print"),        # not a class
                             ("builtins", "int"),          # not an Exception
                             ("os", "__class__"),
                             ("builtins", "__import__"),
                             ("datahelix._slot", "json.JSONDecodeError")]:
        assert _error_type(module, qualname) is None, (module, qualname)
