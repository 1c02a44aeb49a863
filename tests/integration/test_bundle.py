"""`make bundle` (docs/bundle.md): the relocatable tree made from build/,
unpacked from its tarball into another folder, runs there with
LD_LIBRARY_PATH unset; ldd of each of its ELF files resolves every library
inside the bundle or to the short list of host libraries; with the host's
copies of the bundled libraries hidden (a private mount namespace) it still
decodes a real clip and imports; and its abi3 extension loads under
/usr/bin/python3 and under every other CPython >= 3.11 found here."""
import glob
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap

import pytest

from conftest import ROOT, SHARED_DATA, _binary

# What the bundle leaves to the host (scripts/make-bundle.sh SYSTEM).
SYSTEM = {"linux-vdso.so.1", "ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6",
          "libpthread.so.0", "libdl.so.2", "librt.so.1", "libresolv.so.2",
          "libutil.so.1", "libanl.so.1", "libstdc++.so.6", "libgcc_s.so.1"}
# What must be inside: the libraries a stock Linux lacks that we use directly.
MUST_BUNDLE = ["libavformat.so", "libavcodec.so", "libavutil.so",
               "libswscale.so", "libswresample.so", "libzmq.so",
               "libsodium.so", "libprotobuf-c.so", "libjansson.so"]


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH",
                        "DATAHELIX_BIN")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """make-bundle.sh over DATAHELIX_BIN's build folder (what `make bundle`
    runs after `make build`), then the tarball unpacked somewhere else: the
    copy every test uses.  The folder it was made in is removed, so nothing
    can lean on it."""
    if not shutil.which("patchelf"):
        pytest.fail("patchelf missing: scripts/setup-deps.sh installs it")
    build = pathlib.Path(_binary()).resolve().parent
    made = tmp_path_factory.mktemp("made")
    p = subprocess.run([str(ROOT / "scripts" / "make-bundle.sh"), str(build),
                        str(made)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    tars = list(made.glob("datahelix-*-linux-x86_64.tar.gz"))
    assert len(tars) == 1, list(made.iterdir())
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    with tarfile.open(tars[0]) as t:
        t.extractall(elsewhere)
    shutil.rmtree(made)
    (root,) = list(elsewhere.iterdir())
    return root


def _elves(root):
    out = []
    for f in sorted(root.rglob("*")):
        if f.is_file() and not f.is_symlink():
            with open(f, "rb") as fh:
                if fh.read(4) == b"\x7fELF":
                    out.append(f)
    return out


@pytest.fixture(scope="module")
def clip(tmp_path_factory, bundle):
    """A real clip of shared/data, else one the bundle itself generates."""
    real = SHARED_DATA / "videos" / "decord__flipping_a_pancake.mkv"
    if real.is_file():
        return real
    d = tmp_path_factory.mktemp("clip")
    subprocess.run([str(bundle / "bin" / "datahelix"), "gen-data", "--out",
                    str(d), "--profiles", "S", "--count", "1"], check=True,
                   env=_clean_env(), capture_output=True, timeout=120)
    return sorted(d.rglob("*.mp4"))[0]


def test_the_copy_runs_version_and_decodes(bundle, clip):
    exe = bundle / "bin" / "datahelix"
    env = _clean_env()
    v = subprocess.run([str(exe), "--version"], env=env, capture_output=True,
                       text=True, timeout=30)
    assert v.returncode == 0, v.stderr
    want = subprocess.run([_binary(), "--version"], capture_output=True,
                          text=True, timeout=30).stdout
    assert v.stdout == want and v.stdout.startswith("datahelix ")
    d = subprocess.run([str(exe), "decode", "-n", "8", "-s", "112x112",
                        str(clip)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert d.returncode == 0, d.stderr
    assert "8 frames 112x112 (8 valid)" in d.stderr, d.stderr
    assert "0 failed" in d.stderr, d.stderr


def test_ldd_resolves_inside_the_bundle_or_to_the_host_list(bundle):
    elves = _elves(bundle)
    names = {f.name for f in elves}
    assert {"datahelix", "datahelix-svc", "_C.abi3.so"} <= names
    for lib in MUST_BUNDLE:
        assert any(n.startswith(lib) for n in names), (lib, sorted(names))
    bad = []
    for f in elves:
        p = subprocess.run(["ldd", str(f)], env=_clean_env(),
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, (f, p.stderr)
        for line in p.stdout.splitlines():
            parts = line.split()
            if "not found" in line:
                bad.append(f"{f.name}: {line.strip()}")
            elif len(parts) >= 3 and parts[1] == "=>":
                inside = pathlib.Path(parts[2]).is_relative_to(bundle)
                if not inside and parts[0] not in SYSTEM:
                    bad.append(f"{f.name}: {parts[0]} from the host "
                               f"({parts[2]})")
                if inside and parts[0] in SYSTEM:
                    bad.append(f"{f.name}: host library {parts[0]} bundled")
    assert not bad, "\n".join(bad[:20])


def test_runpaths_are_relative_to_the_files(bundle):
    want = {"datahelix": "$ORIGIN/../lib", "datahelix-svc": "$ORIGIN/../lib",
            "_C.abi3.so": "$ORIGIN/../../lib"}
    for f in _elves(bundle):
        p = subprocess.run(["readelf", "-d", str(f)], capture_output=True,
                           text=True, timeout=30)
        m = re.search(r"\(RUNPATH\)\s+Library runpath: \[(.*)\]", p.stdout)
        assert m, f"{f}: no RUNPATH"
        assert m.group(1) == want.get(f.name, "$ORIGIN"), (f, m.group(1))
    req = (bundle / "REQUIRES").read_text()
    assert re.search(r"GLIBC_2\.\d+", req) and "libc.so.6" in req, req


# The check run in the namespace where the host's copies of every bundled
# library are covered by /dev/null (except those /usr/bin/python3 itself
# needs to start): the host build must fail, the bundle must not.
HIDE = textwrap.dedent("""
    import ctypes, os, subprocess, sys
    bundle, clip, host_bin = sys.argv[1:4]
    keep = set(sys.argv[4:])
    libc = ctypes.CDLL(None, use_errno=True)
    hidden = []
    for so in os.listdir(os.path.join(bundle, "lib")):
        if so.startswith("libdatahelix") or so in keep:
            continue
        for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"):
            p = os.path.realpath(os.path.join(d, so))
            if os.path.isfile(p) and p not in hidden:
                if libc.mount(b"/dev/null", p.encode(), None, 4096, None):
                    sys.exit(f"mount over {p}: {os.strerror(ctypes.get_errno())}")
                hidden.append(p)
    print("hidden", len(hidden))
    h = subprocess.run([host_bin, "--version"], capture_output=True)
    print("host build rc", h.returncode)
    d = subprocess.run([os.path.join(bundle, "bin", "datahelix"), "decode",
                        "-n", "4", "-s", "64x64", clip], capture_output=True,
                       text=True)
    print("bundle decode rc", d.returncode, d.stderr.strip().splitlines()[-1:])
    # The extension alone: the package's __init__ imports torch, whose
    # own needs (libffi, ...) are hidden here too.
    so = os.path.join(bundle, "python", "datahelix", "_C.abi3.so")
    code = ("import importlib.util as u; "
            "s = u.spec_from_file_location('datahelix._C', %r); "
            "s.loader.exec_module(u.module_from_spec(s)); "
            "print('maps', sorted({l.split()[-1] for l in open('/proc/self/maps') "
            "if 'libavcodec' in l or 'libzmq' in l}))" % so)
    i = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True)
    print("import rc", i.returncode, i.stdout.strip(), i.stderr.strip()[-300:])
""")


def test_runs_where_the_host_has_none_of_the_bundled_libraries(bundle, clip):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    ldd = subprocess.run(["ldd", "/usr/bin/python3"], capture_output=True,
                         text=True, timeout=30).stdout
    keep = [ln.split()[0] for ln in ldd.splitlines() if "=>" in ln]
    p = subprocess.run(["unshare", "--mount", "--propagation", "private",
                        "/usr/bin/python3", "-c", HIDE, str(bundle),
                        str(clip), _binary(), *keep],
                       env=_clean_env(), capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert int(re.search(r"hidden (\d+)", out).group(1)) > 50, out
    # The host's own build cannot even start now: the hiding works.
    assert "host build rc 0" not in out, out
    assert "bundle decode rc 0" in out, out
    assert "import rc 0" in out, out
    maps = re.search(r"maps \[(.*)\]", out).group(1)
    assert "libavcodec" in maps and "libzmq" in maps, out
    assert all(m.strip(" '").startswith(str(bundle))
               for m in maps.split(",")), out


def _pythons():
    """/usr/bin/python3 and every other CPython >= 3.11 on this machine
    ($DATAHELIX_TEST_PYTHONS, colon-separated, else the usual places):
    Debian 12 ships only 3.11, so a second one is whatever else is here."""
    env = os.environ.get("DATAHELIX_TEST_PYTHONS")
    cands = ["/usr/bin/python3"] + (env.split(":") if env else sorted(
        glob.glob("/usr/bin/python3.1[1-9]") +
        glob.glob("/usr/local/bin/python3.1[1-9]") +
        glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[1-9]*/bin/python3"))))
    seen, out = set(), []
    for c in cands:
        if not os.access(c, os.X_OK):
            continue
        v = subprocess.run([c, "-c", "import sys, platform; print("
                            "platform.python_implementation(), "
                            "'%d.%d.%d' % sys.version_info[:3])"],
                           capture_output=True, text=True, timeout=30)
        impl_ver = v.stdout.split()
        if v.returncode or impl_ver[0] != "CPython":
            continue
        if tuple(map(int, impl_ver[1].split("."))) < (3, 11, 0):
            continue
        if impl_ver[1] in seen:
            continue
        seen.add(impl_ver[1])
        out.append((c, impl_ver[1]))
    return out


# Loads datahelix._C alone (the package's __init__ needs torch, which only
# Debian's python has), builds a small index and reads it back, and checks
# a type that only the extension makes refuses to be made from Python.
LOAD = textwrap.dedent("""
    import importlib.util, sys, tempfile, os
    so = sys.argv[1]
    spec = importlib.util.spec_from_file_location("datahelix._C", so)
    C = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(C)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x.dhx")
        C.python_index(p, 5)
        ix = C.Index(p)
        print("len", len(ix), ix.path(3))
    try:
        C.Batch()
        print("Batch made")
    except TypeError:
        print("Batch refused")
""")


def test_abi3_extension_loads_under_each_python(bundle):
    so = bundle / "python" / "datahelix" / "_C.abi3.so"
    pys = _pythons()
    assert pys and pys[0][0] == "/usr/bin/python3", pys
    for py, ver in pys:
        p = subprocess.run([py, "-c", LOAD, str(so)], env=_clean_env(),
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, (py, ver, p.stderr)
        assert "len 5 dataset[3]" in p.stdout, (py, ver, p.stdout)
        assert "Batch refused" in p.stdout, (py, ver, p.stdout)
    print("abi3 loaded under", ", ".join(f"{v} ({p})" for p, v in pys))
    if len(pys) < 2:
        pytest.skip("no second CPython >= 3.11 here (Debian 12 ships only "
                    "3.11): loaded under /usr/bin/python3 only")


def test_the_whole_package_imports_from_the_bundle(bundle):
    """Under Debian's python3 (which has torch): `import datahelix` from
    the bundle's python/ folder, and the program it would start is the
    bundle's own."""
    code = ("import datahelix, datahelix._C as C; "
            "from datahelix import _services; "
            "print(C.__file__); print(_services.binary()); "
            "print(_services.service_binary())")
    p = subprocess.run(["/usr/bin/python3", "-c", code],
                       env=_clean_env(PYTHONPATH=str(bundle / "python")),
                       capture_output=True, text=True, timeout=120,
                       cwd="/")
    assert p.returncode == 0, p.stderr
    ext, prog, svc = p.stdout.split()
    assert ext == str(bundle / "python" / "datahelix" / "_C.abi3.so")
    assert pathlib.Path(prog).resolve() == bundle / "bin" / "datahelix"
    assert pathlib.Path(svc).resolve() == bundle / "bin" / "datahelix-svc"
    assert sys.version_info >= (3, 11)
