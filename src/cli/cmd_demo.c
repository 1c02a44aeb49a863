/*
 * cmd_demo.c - `datahelix demo`: the README's first command from an
 * installed package (`make demo` runs the same module from the source
 * tree): a mixed video set, probed, then a short 4-rank torchrun training
 * job on CPU fed once by torch's DataLoader (PyAV) and once by
 * datahelix.DataLoader, side by side (python/datahelix/_demo.py).
 *
 * Design: run through dh_cli_exec_python() (py_exec.c), module
 * datahelix._demo, which parses the arguments.  Run from a source tree's
 * build/ folder, that tree's python/ goes first on PYTHONPATH; installed,
 * the interpreter finds the installed package by itself.
 */
#include <limits.h>
#include <stdio.h>
#include <unistd.h>

#include "cli/cli.h"

#define CMD "demo"

int dh_cmd_demo(int argc, char **argv)
{
    char self[PATH_MAX], here[PATH_MAX], tree[PATH_MAX + 16];
    char probe[PATH_MAX + 64];

    if (dh_cli_self_dir(CMD, self, sizeof(self), here, sizeof(here)) < 0)
        return DH_EXIT_FAIL;
    snprintf(tree, sizeof(tree), "%s/../python", here);
    snprintf(probe, sizeof(probe), "%s/datahelix/_demo.py", tree);
    return dh_cli_exec_python(CMD, self, access(probe, R_OK) == 0 ? tree : NULL,
                              "datahelix._demo", argc, argv);
}
