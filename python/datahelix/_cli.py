"""The `datahelix` console command of a pip install (setup.py
entry_points): runs the `datahelix` program the install bundled in the
package (datahelix/bin/), with the same arguments, as that program.

`make install` and the Debian package put the program itself on PATH
instead; this shim is only for pip, which cannot install a C program as a
command.  It never falls back to `datahelix` on PATH: that may be this
very script."""
import os
import sys


def main():
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin",
                        "datahelix")
    prog = os.environ.get("DATAHELIX_BIN") or here
    if not os.access(prog, os.X_OK):
        sys.stderr.write(
            f"datahelix: the datahelix program is not at {prog}: this "
            "package was installed without it (reinstall with `pip install "
            "--no-build-isolation .` from the source tree, or use "
            "`make install`)\n")
        return 127
    try:
        os.execv(prog, [prog] + sys.argv[1:])
    except OSError as e:
        sys.stderr.write(f"datahelix: cannot run {prog}: {e.strerror}\n")
        return 126
    return 0  # not reached: execv replaced this process


if __name__ == "__main__":
    sys.exit(main())
