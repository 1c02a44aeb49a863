"""`datahelix index`: table -> .dhx, verification, and bad input."""
import json

from conftest import run_dh


def make_table(tmp_path, gen_set):
    out = tmp_path / "m.jsonl"
    run_dh("probe", "--out", out, gen_set / "captions.jsonl", check=True)
    return out


def test_probe_index_and_verify(tmp_path, gen_set):
    table = make_table(tmp_path, gen_set)
    dhx = tmp_path / "m.dhx"
    p = run_dh("index", table, "-o", dhx, check=True)
    assert dhx.stat().st_size > 0
    v = run_dh("index", "--verify", dhx, check=True)
    rows = [json.loads(l) for l in open(table)][1:]
    profiles = sorted({r["profile"] for r in rows})
    assert f"ok, {len(rows)} samples" in v.stdout
    assert ",".join(sorted(v.stdout.strip().rsplit(": ", 1)[1].split(","))) \
        == ",".join(profiles)
    # probe --index writes the same index.
    dhx2 = tmp_path / "m2.dhx"
    run_dh("probe", "--out", tmp_path / "m2.jsonl", "--index", dhx2,
           gen_set / "captions.jsonl", check=True)
    assert run_dh("index", "--verify", dhx2, check=True).stdout.split(": ", 1)[1] \
        == v.stdout.split(": ", 1)[1]
    assert p.returncode == 0


def test_corrupt_index_is_refused(tmp_path, gen_set):
    table = make_table(tmp_path, gen_set)
    dhx = tmp_path / "m.dhx"
    run_dh("index", table, "-o", dhx, check=True)
    data = bytearray(dhx.read_bytes())
    data[len(data) - 40] ^= 0xFF  # inside the body (string table)
    dhx.write_bytes(bytes(data))
    p = run_dh("index", "--verify", dhx)
    assert p.returncode == 1
    assert p.stderr.startswith(f"datahelix: index: {dhx}")
    assert "checksum" in p.stderr
    dhx.write_bytes(bytes(data[:100]))
    p = run_dh("index", "--verify", dhx)
    assert p.returncode == 1 and str(dhx) in p.stderr


def test_malformed_table_names_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id":0,"path":"a.mp4","kind":"video"}\n'
                   '{"id":"1","path":"b.mp4","kind":"video"}\n')
    p = run_dh("index", bad, "-o", tmp_path / "x.dhx")
    assert p.returncode == 1
    assert f"{bad}:2:" in p.stderr and "id" in p.stderr
    assert not (tmp_path / "x.dhx").exists()
    gap = tmp_path / "gap.jsonl"
    gap.write_text('{"id":0,"path":"a.mp4","kind":"video"}\n'
                   '{"id":2,"path":"b.mp4","kind":"video"}\n')
    p = run_dh("index", gap, "-o", tmp_path / "x.dhx")
    assert p.returncode == 1 and "id 1" in p.stderr
    huge = tmp_path / "huge.jsonl"  # would cost a 512 MiB bitmap
    huge.write_text('{"id":4294967295,"kind":"video","path":"a"}\n')
    p = run_dh("index", huge, "-o", tmp_path / "x.dhx")
    assert p.returncode == 1 and f"{huge}:1: id 4294967295 cannot be dense" \
        in p.stderr
    wide = tmp_path / "wide.jsonl"
    wide.write_text('{"id":0,"kind":"video","path":"a","width":100000}\n')
    p = run_dh("index", wide, "-o", tmp_path / "x.dhx")
    assert p.returncode == 1 and "'width' 100000 does not fit" in p.stderr
    p = run_dh("index", tmp_path / "missing.jsonl", "-o", tmp_path / "x.dhx")
    assert p.returncode == 1 and "missing.jsonl" in p.stderr
    p = run_dh("index")
    assert p.returncode == 2 and p.stderr.startswith("datahelix: index:")


def test_every_subcommand_has_help_and_unknown_ones_fail():
    top = run_dh("--help", check=True).stdout
    for cmd in ("gen-data", "probe", "index", "decode", "plan", "top"):
        assert cmd in top
        h = run_dh(cmd, "--help", check=True)
        assert f"datahelix {cmd}" in h.stdout
    assert "not implemented" not in top
    p = run_dh("top")  # its ADDR is required
    assert p.returncode == 2 and "ADDR" in p.stderr
    p = run_dh("frobnicate")
    assert p.returncode == 2 and "unknown command" in p.stderr


# One option a value must follow, per subcommand (dh_cli_getopt: one parser
# for all of them).
VALUE_OPT = {"gen-data": "--out", "probe": "--out", "index": "-o",
             "decode": "--frames", "plan": "--manifest", "sim": "--ranks",
             "coordinator": "--listen", "dataserver": "--coordinator",
             "consume": "--coordinator"}


def test_every_subcommand_parses_its_command_line_the_same_way():
    for cmd, opt in VALUE_OPT.items():
        h = run_dh(cmd, "--help", check=True)
        assert f"datahelix {cmd}" in h.stdout and not h.stderr, cmd
        p = run_dh(cmd, "--frobnicate")
        assert p.returncode == 2, (cmd, p.stderr)
        assert p.stderr.splitlines() == [
            f"datahelix: {cmd}: bad option '--frobnicate' (see datahelix "
            f"{cmd} --help)"], (cmd, p.stderr)
        p = run_dh(cmd, opt)
        assert p.returncode == 2, (cmd, p.stderr)
        assert p.stderr.startswith(f"datahelix: {cmd}: option '{opt}' needs "
                                   "a value"), (cmd, p.stderr)
        # --help after an error still reports the error
        p = run_dh(cmd, "--frobnicate", "--help")
        assert p.returncode == 2 and not p.stdout, (cmd, p.stdout)


def drop_line(table, k):
    """The table without its k-th sample (a bad file removed by hand)."""
    lines = open(table).read().splitlines(keepends=True)
    head = [l for l in lines if "datahelix_header" in l]
    rows = [l for l in lines if "datahelix_header" not in l]
    out = table.with_name("cut.jsonl")
    out.write_text("".join(head + rows[:k] + rows[k + 1:]))
    return out, [json.loads(l) for l in rows[:k] + rows[k + 1:]]


def plan_ids(manifest, *extra):
    p = run_dh("plan", "--manifest", manifest, "--world-size", 1,
               "--batch-size", 1, "--no-drop-last", "--json", *extra)
    return p, sorted(i for x in p.stdout.splitlines() if '"ranks"' in x
                     for i in json.loads(x)["ranks"][0])


def test_line_removed_renumber_keeps_the_table_usable(tmp_path, gen_set):
    """A table that lost a line: index and plan refuse it naming the gap
    and the way out; `index --renumber` builds n-1 dense rows; plan
    --renumber and sim read it as it is."""
    table = make_table(tmp_path, gen_set)
    n = sum(1 for l in open(table) if "datahelix_header" not in l)
    cut, kept = drop_line(table, 2)
    dhx = tmp_path / "cut.dhx"
    p = run_dh("index", cut, "-o", dhx)
    assert p.returncode == 1 and not dhx.exists()
    assert p.stderr.strip() == (
        f"datahelix: index: {cut}: ids are not dense: id 2 is missing "
        f"(1 of ids 0..{n - 1} missing); renumber the samples in file "
        "order with `datahelix index --renumber`")
    p, _ = plan_ids(cut)
    assert p.returncode == 1 and "id 2 is missing" in p.stderr \
        and "--renumber" in p.stderr

    p = run_dh("index", "--renumber", cut, "-o", dhx, check=True)
    assert (f"index: renumbered {n - 1} samples 0..{n - 2} in file order, "
            f"{n - 3} ids changed") in p.stderr
    v = run_dh("index", "--verify", dhx, check=True)
    assert f"ok, {n - 1} samples" in v.stdout
    _, ids = plan_ids(dhx)
    assert ids == list(range(n - 1))  # dense again
    p, ids_jsonl = plan_ids(cut, "--renumber")
    assert p.returncode == 0 and ids_jsonl == ids
    # The rows kept their order: same tokens per renumbered id.
    p = run_dh("plan", "--manifest", dhx, "--world-size", 1, "--batch-size",
               1, "--no-drop-last", "--json", check=True)
    tok = {json.loads(x)["ranks"][0][0]: json.loads(x)["tokens"][0]
           for x in p.stdout.splitlines() if '"ranks"' in x}
    assert [tok[i] for i in range(n - 1)] == [r["est_tokens"] for r in kept]
    s = run_dh("sim", "--manifest", cut, "--steps", 4, "--ranks", 1,
               "--batch-size", 1)
    assert s.returncode == 0, s.stderr
    p = run_dh("index", "--renumber")
    assert p.returncode == 2 and "--renumber given without" in p.stderr


def test_a_long_build_prints_progress_lines_off_a_terminal(tmp_path,
                                                            gen_set):
    """stderr a pipe: a line every DATAHELIX_PROGRESS_S seconds with how
    much of the table is read (from the kernel's file offset of the
    build's descriptor); 0: none; no bar codes."""
    import os
    rows = [json.loads(l) for l in open(make_table(tmp_path, gen_set))][1:]
    big = tmp_path / "big.jsonl"
    with open(big, "w") as f:
        for i in range(150000):
            r = dict(rows[i % len(rows)], id=i,
                     path=f"/data/clip{i:07d}.mp4")
            f.write(json.dumps(r) + "\n")
    size_mib = big.stat().st_size >> 20
    env = dict(os.environ, DATAHELIX_PROGRESS_S="0.001")
    p = run_dh("index", big, "-o", tmp_path / "big.dhx", check=True,
               env=env, timeout=300)
    lines = [x for x in p.stderr.splitlines() if "MiB of the table" in x]
    assert lines, p.stderr
    assert "\r" not in p.stderr and "\033[" not in p.stderr
    for x in lines:
        done, total = x.split(": ", 1)[1].split(" ", 1)[0].split("/")
        assert int(total) == size_mib and 0 <= int(done) <= size_mib, x
    assert "index: 150000 samples" in p.stderr.splitlines()[-1]
    env["DATAHELIX_PROGRESS_S"] = "0"
    q = run_dh("index", big, "-o", tmp_path / "big2.dhx", check=True,
               env=env, timeout=300)
    assert "MiB of the table" not in q.stderr, q.stderr
