/*
 * cmd_top.c - `datahelix top ADDR`: a live terminal view of a running job
 * read from its Coordinator's metrics endpoint (docs/metrics.md, issue 18
 * item 2).  The view is python/datahelix/_top.py (a parser and renderer of
 * the exposition text, unit tested, and the terminal loop), which needs
 * only Python's standard library.
 *
 * Design: run through dh_cli_exec_python_file() (py_exec.c) by path, not
 * as a module: importing the datahelix package would load torch, seconds
 * of start-up a terminal tool must not pay.  Run from a source tree's
 * build/ folder, that tree's python/ goes first on PYTHONPATH.
 */
#include <limits.h>
#include <stdio.h>
#include <unistd.h>

#include "cli/cli.h"

#define CMD "top"

int dh_cmd_top(int argc, char **argv)
{
    char self[PATH_MAX], here[PATH_MAX], tree[PATH_MAX + 16];
    char probe[PATH_MAX + 64];

    if (dh_cli_self_dir(CMD, self, sizeof(self), here, sizeof(here)) < 0)
        return DH_EXIT_FAIL;
    snprintf(tree, sizeof(tree), "%s/../python", here);
    snprintf(probe, sizeof(probe), "%s/datahelix/_top.py", tree);
    return dh_cli_exec_python_file(CMD, self,
                                   access(probe, R_OK) == 0 ? tree : NULL,
                                   "_top.py", argc, argv);
}
