/*
 * cmd_bench.c - `datahelix bench`: data-loading systems side by side in
 * one run under the same CPU budget (torch DataLoader with the C or the
 * PyAV decode, a Dask pool, the datahelix ablation ladder), with the
 * paper's metrics (Sec. 5.1).
 *
 * Design: the harness is Python (it drives torch.distributed ranks, torch
 * DataLoaders and Dask): the package bench/datahelix_bench, run through
 * dh_cli_exec_python() (py_exec.c: its cli.py parses the arguments).  The
 * package is found beside this program's tree (../bench/ relative to the
 * directory of /proc/self/exe), or in $DATAHELIX_BENCH_DIR.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

#define CMD "bench"
#define PACKAGE "datahelix_bench"

/* argv[0] is "bench"; argv[1..argc-1] go to the harness as they are. */
int dh_cmd_bench(int argc, char **argv)
{
    const char *env = getenv("DATAHELIX_BENCH_DIR");
    char self[PATH_MAX], here[PATH_MAX], dir[PATH_MAX], main_py[PATH_MAX + 64];
    int len;

    if (dh_cli_self_dir(CMD, self, sizeof(self), here, sizeof(here)) < 0)
        return DH_EXIT_FAIL;
    if (env && *env)
        len = snprintf(dir, sizeof(dir), "%s", env);
    else
        len = snprintf(dir, sizeof(dir), "%s/../bench", here);
    if (len < 0 || (size_t)len >= sizeof(dir)) {
        dh_cli_error(CMD, "the path of the bench package is too long");
        return DH_EXIT_FAIL;
    }
    snprintf(main_py, sizeof(main_py), "%s/" PACKAGE "/__main__.py", dir);
    if (access(main_py, R_OK) != 0) {
        dh_cli_error(CMD,
                     "the harness package %s/" PACKAGE ": %s (it ships "
                     "in the source tree as bench/" PACKAGE " beside build/; "
                     "set DATAHELIX_BENCH_DIR to the folder that holds it)",
                     dir, strerror(errno));
        return DH_EXIT_FAIL;
    }
    return dh_cli_exec_python(CMD, self, dir, PACKAGE, argc, argv);
}
