"""The three ways to install (issue 18 item 6; README "Installing"): pip
into a venv (a `datahelix` command on its PATH), `make install` /
`make uninstall` into a prefix, and the Debian package of `make deb`
(installed and removed with dpkg; root only).  Each leaves a working
program and package, and its removal leaves nothing."""
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, probed_set, run_dh

CLEAN_PATH = "/usr/bin:/bin"


def version():
    return run_dh("--version", check=True).stdout.split()[1]


def clean_env(**extra):
    """No DATAHELIX_BIN, no PYTHONPATH, PATH without the build tree."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATAHELIX_BIN", "PYTHONPATH")}
    env["PATH"] = CLEAN_PATH
    env.update(extra)
    return env


def files_under(d):
    return sorted(str(p.relative_to(d)) for p in pathlib.Path(d).rglob("*")
                  if p.is_file() or p.is_symlink())


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return probed_set(tmp_path_factory.mktemp("pkg"), "S", 6, 5) / "m.jsonl"


LOADER = textwrap.dedent("""
    import sys, datahelix
    assert datahelix.__file__.startswith(sys.argv[2]), datahelix.__file__
    with datahelix.DataLoader(sys.argv[1], batch_size=2, frames=4,
                              size=(32, 32)) as loader:
        print(sum(b["ids"].numel() for b in loader))
""")


def test_pip_install_into_a_venv_gives_the_datahelix_command(table,
                                                             tmp_path):
    """`pip install --no-build-isolation .` (offline) into a venv: the
    package, its extension, the program it starts and a `datahelix` command
    on the venv's PATH, usable from another directory without DATAHELIX_BIN
    or the build tree."""
    venv = tmp_path / "venv"
    # Debian's torch and numpy come from the system site.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages",
                    "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    p = subprocess.run([str(py), "-m", "pip", "install",
                        "--no-build-isolation", "--no-deps", "--no-index",
                        str(ROOT)], capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    cmd = venv / "bin" / "datahelix"
    assert cmd.exists(), sorted(os.listdir(venv / "bin"))
    env = clean_env(PATH=f"{venv / 'bin'}:{CLEAN_PATH}")
    away = tmp_path / "elsewhere"
    away.mkdir()
    h = subprocess.run(["datahelix", "--help"], capture_output=True,
                       text=True, timeout=60, env=env, cwd=away)
    assert h.returncode == 0, h.stderr
    assert "usage" in (h.stdout + h.stderr).lower()
    v = subprocess.run(["datahelix", "--version"], capture_output=True,
                       text=True, timeout=60, env=env, cwd=away)
    assert v.stdout.split() == ["datahelix", version()], v.stdout + v.stderr
    # The command builds a manifest, as a user needs before training.
    idx = away / "m.dhx"
    i = subprocess.run(["datahelix", "index", str(table), "-o", str(idx)],
                       capture_output=True, text=True, timeout=120, env=env,
                       cwd=away)
    assert i.returncode == 0 and idx.stat().st_size > 0, i.stderr
    site = subprocess.run([str(py), "-c", "import sysconfig; print("
                           "sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True,
                          env=env).stdout.strip()
    run = subprocess.run([str(py), "-c", LOADER, str(table), site],
                         capture_output=True, text=True, timeout=120,
                         env=env, cwd=away)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "6"
    # Its error when the bundled program is missing names the fix.
    (pathlib.Path(site) / "datahelix" / "bin" / "datahelix").unlink()
    gone = subprocess.run(["datahelix", "--help"], capture_output=True,
                          text=True, timeout=60, env=env, cwd=away)
    assert gone.returncode == 127 and "not at" in gone.stderr, gone.stderr


def test_make_install_then_uninstall_leaves_nothing(tmp_path):
    prefix = tmp_path / "prefix"
    p = subprocess.run(["make", "-C", str(ROOT), "--no-print-directory",
                        "install", f"PREFIX={prefix}"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    installed = files_under(prefix)
    for f in ("bin/datahelix", "include/datahelix/datahelix.h",
              "share/datahelix/installed-files"):
        assert f in installed, installed
    assert any(f.endswith("/datahelix/_C." + f.split("_C.")[-1])
               for f in installed if "_C." in f), installed
    v = subprocess.run([str(prefix / "bin" / "datahelix"), "--version"],
                       capture_output=True, text=True, timeout=60)
    assert v.stdout.split() == ["datahelix", version()]
    record = (prefix / "share/datahelix/installed-files").read_text().split()
    assert sorted(str(pathlib.Path(x).relative_to(prefix))
                  for x in record) == installed
    u = subprocess.run(["make", "-C", str(ROOT), "--no-print-directory",
                        "uninstall", f"PREFIX={prefix}"],
                       capture_output=True, text=True, timeout=120)
    assert u.returncode == 0, u.stderr
    assert files_under(prefix) == []
    assert not any(prefix.iterdir()), list(prefix.rglob("*"))
    again = subprocess.run(["make", "-C", str(ROOT), "--no-print-directory",
                            "uninstall", f"PREFIX={prefix}"],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode != 0 and "no record" in again.stderr


def dpkg_installed(pkg):
    p = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg],
                       capture_output=True, text=True)
    return p.returncode == 0 and "install ok installed" in p.stdout


def test_make_deb_installs_and_removes_cleanly(table, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("dpkg -i needs root")
    if dpkg_installed("datahelix") or os.path.exists("/usr/bin/datahelix"):
        pytest.skip("a datahelix is installed on this machine already: "
                    "left alone")
    p = subprocess.run(["make", "-C", str(ROOT), "--no-print-directory",
                        "deb", f"DIST={tmp_path}"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    debs = list(tmp_path.glob("datahelix_*.deb"))
    assert len(debs) == 1, p.stdout
    info = subprocess.run(["dpkg-deb", "-f", str(debs[0]), "Depends"],
                          capture_output=True, text=True, check=True).stdout
    assert "libzmq5" in info and "libavcodec" in info, info
    listed = subprocess.run(["dpkg-deb", "-c", str(debs[0])],
                            capture_output=True, text=True,
                            check=True).stdout
    files = ["/" + ln.split()[5].lstrip("./") for ln in listed.splitlines()
             if not ln.startswith("d")]
    assert "/usr/bin/datahelix" in files, files
    try:
        i = subprocess.run(["dpkg", "-i", str(debs[0])], capture_output=True,
                           text=True, timeout=300)
        assert i.returncode == 0, i.stdout + i.stderr
        env = clean_env()
        v = subprocess.run(["datahelix", "--version"], capture_output=True,
                           text=True, timeout=60, env=env, cwd=tmp_path)
        assert v.stdout.split() == ["datahelix", version()], v.stderr
        run = subprocess.run(["/usr/bin/python3", "-c", LOADER, str(table),
                              "/usr/lib/python3/dist-packages/datahelix"],
                             capture_output=True, text=True, timeout=120,
                             env=env, cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == "6"
    finally:
        r = subprocess.run(["dpkg", "-r", "datahelix"], capture_output=True,
                           text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not dpkg_installed("datahelix")
    left = [f for f in files if os.path.lexists(f)]
    assert left == [], left
    assert not os.path.exists("/usr/lib/python3/dist-packages/datahelix")
