"""The README and the docs say what is (issue 41 item 3): every
`datahelix SUBCOMMAND --flag` they show is a subcommand with that flag
(its --help lists it), every `make TARGET` is a Makefile target, the README
stays a first screen (at most 300 lines), and its DDP example runs as
written under torchrun."""
import pathlib
import re
import subprocess
import sys

import pytest

from conftest import ROOT, run_dh, _binary

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# `datahelix SUB ...` inside a code span or a code block line
CMD = re.compile(r"(?:^|[`$ (])datahelix ([a-z][a-z-]*)((?: [^`\n|)]*)?)")
MAKE = re.compile(r"`make ([a-z][a-z0-9-]*)")


def subcommands():
    p = run_dh("--help")
    return set(re.findall(r"^  ([a-z][a-z-]*) ", p.stdout + p.stderr, re.M))


def uses():
    """(file, line number, subcommand, [flags]) of every command shown."""
    for f in DOCS:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for m in CMD.finditer(line):
                flags = re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)",
                                   m.group(2))
                yield f.name, n, m.group(1), flags


def test_every_command_and_flag_shown_exists():
    subs = subcommands()
    assert {"probe", "shard", "decode", "coordinator"} <= subs, subs
    helps, bad = {}, []
    for name, n, sub, flags in uses():
        if sub not in subs:
            continue  # prose: "datahelix is ...", "datahelix-svc"
        if sub not in helps:
            p = run_dh(sub, "--help")
            helps[sub] = p.stdout + p.stderr
        bad += [f"{name}:{n}: datahelix {sub} {f}" for f in flags
                if f not in helps[sub] and f != "--help"]
    assert not bad, "\n".join(bad)


def test_every_make_target_shown_exists():
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", (ROOT / "Makefile")
                             .read_text(), re.M))
    bad = [f"{f.name}: make {t}" for f in DOCS
           for t in MAKE.findall(f.read_text()) if t not in targets]
    assert not bad, "\n".join(bad)


def test_the_readme_is_a_first_screen():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    first = "\n".join(text.splitlines()[:60])
    assert "make demo" in first and "make test" in first
    assert "torchrun" in text and "## A DDP job" in text


def blocks(text, after):
    """The code blocks of the section headed `after`: {language: text}."""
    sec = text[text.index(after):]
    sec = sec[:sec.index("\n## ", 1)]
    return {m.group(1): m.group(2) for m in
            re.finditer(r"```(\w+)\n(.*?)```", sec, re.S)}


def test_the_readmes_ddp_example_runs_as_written(tmp_path):
    """gen-data, the README's probe line, then its train.py under
    torchrun with 2 ranks: both ranks run both epochs."""
    from procs import free_port
    b = blocks((ROOT / "README.md").read_text(), "## A DDP job")
    code = b["python"]
    assert len(code.strip().splitlines()) <= 15
    probe, torchrun = [x for x in b["sh"].splitlines() if x.strip()]
    assert probe.startswith("datahelix probe ") and "torchrun" in torchrun
    run_dh("gen-data", "--out", tmp_path / "clips", "--profiles", "S",
           "--count", 8, "--seed", 1, check=True, timeout=300)
    args = probe.split("#")[0].split()[1:]  # "probe", its options
    run_dh(*args, check=True, cwd=tmp_path)
    (tmp_path / "train.py").write_text(code)
    env = dict(__import__("os").environ,
               PYTHONPATH=str(ROOT / "python"), DATAHELIX_BIN=_binary())
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
         "2", "--redirects", "1", "--tee", "1", "--master_port",
         str(free_port()), "train.py", "m.jsonl"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    for r in (0, 1):
        assert re.search(rf"rank {r} epoch 1: [1-9]\d* steps", p.stdout), \
            p.stdout[-2000:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
