/*
 * cmd_bench.c - `datahelix bench`: data-loading systems side by side in
 * one run under the same CPU budget (torch DataLoader with the C or the
 * PyAV decode, a Dask pool, the datahelix ablation ladder), with the
 * paper's metrics (Sec. 5.1).
 *
 * Design: the harness is Python (it drives torch.distributed ranks, torch
 * DataLoaders and Dask): the package bench/datahelix_bench.  This file
 * does not parse the arguments; the package's cli.py is the one place
 * that checks them and prints --help, so the two cannot disagree.  It
 * finds the package beside this program's tree (../bench/ relative to the
 * directory of /proc/self/exe, or $DATAHELIX_BENCH_DIR), puts that folder
 * first on PYTHONPATH and execs `/usr/bin/python3 -m datahelix_bench`
 * (or $DATAHELIX_PYTHON) with argv[1..] as they came, and DATAHELIX_BIN
 * naming this program, so the ranks' data servers and the harness's
 * gen-data / probe run the same build.  What only this side can see (no
 * package, no interpreter) is a one-line error and exit status 1.
 * Locking: single-threaded; nothing returns after a successful exec.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/alloc.h"

#define CMD "bench"
#define PACKAGE "datahelix_bench"
#define PYTHONPATH_MAX (2 * PATH_MAX)

/* This program's path, and the folder that holds the package:
 * $DATAHELIX_BENCH_DIR, else <this program's directory>/../bench. */
static int find_package(char *self, size_t self_len, char *dir, size_t dir_len)
{
    const char *env = getenv("DATAHELIX_BENCH_DIR");
    char main_py[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", self, self_len - 1);
    int len;

    if (n <= 0) {
        dh_cli_error(CMD, "/proc/self/exe: %s", strerror(errno));
        return -1;
    }
    self[n] = 0;
    if (env && *env) {
        len = snprintf(dir, dir_len, "%s", env);
    } else {
        const char *slash = strrchr(self, '/');

        len = snprintf(dir, dir_len, "%.*s/../bench",
                       (int)(slash ? slash - self : 0), self);
    }
    if (len < 0 || (size_t)len >= dir_len) {
        dh_cli_error(CMD, "the path of the bench package is too long");
        return -1;
    }
    snprintf(main_py, sizeof(main_py), "%s/" PACKAGE "/__main__.py", dir);
    if (access(main_py, R_OK) != 0) {
        dh_cli_error(CMD,
                     "the harness package %s/" PACKAGE ": %s (it ships "
                     "in the source tree as bench/" PACKAGE " beside build/; "
                     "set DATAHELIX_BENCH_DIR to the folder that holds it)",
                     dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* PYTHONPATH = DIR[:the caller's PYTHONPATH]. */
static int set_pythonpath(const char *dir)
{
    const char *old = getenv("PYTHONPATH");
    char val[PYTHONPATH_MAX];
    int len;

    if (old && *old)
        len = snprintf(val, sizeof(val), "%s:%s", dir, old);
    else
        len = snprintf(val, sizeof(val), "%s", dir);
    if (len < 0 || (size_t)len >= sizeof(val)) {
        dh_cli_error(CMD, "PYTHONPATH is too long");
        return -1;
    }
    if (setenv("PYTHONPATH", val, 1) != 0) {
        dh_cli_error(CMD, "setenv: %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* The interpreter: $DATAHELIX_PYTHON, else Debian's /usr/bin/python3. */
static const char *find_python(void)
{
    const char *py = getenv("DATAHELIX_PYTHON");

    if (!py || !*py)
        py = "/usr/bin/python3";
    if (access(py, X_OK) != 0) {
        dh_cli_error(CMD,
                     "%s: %s (the harness needs Debian's python3 with "
                     "python3-torch; set DATAHELIX_PYTHON)",
                     py, strerror(errno));
        return NULL;
    }
    return py;
}

/* argv[0] is "bench"; argv[1..argc-1] go to the harness as they are. */
int dh_cmd_bench(int argc, char **argv)
{
    char self[PATH_MAX], dir[PATH_MAX];
    const char *py;
    const char **args;
    int n = 0;

    if (find_package(self, sizeof(self), dir, sizeof(dir)) < 0 ||
        !(py = find_python()) || set_pythonpath(dir) < 0)
        return DH_EXIT_FAIL;
    if (setenv("DATAHELIX_BIN", self, 1) != 0) {
        dh_cli_error(CMD, "setenv: %s", strerror(errno));
        return DH_EXIT_FAIL;
    }
    if (!(args = dh__calloc((size_t)argc + 3, sizeof(*args)))) {
        dh_cli_error(CMD, "out of memory");
        return DH_EXIT_FAIL;
    }
    args[n++] = py;
    args[n++] = "-m";
    args[n++] = PACKAGE;
    for (int i = 1; i < argc; i++)
        args[n++] = argv[i];
    args[n] = NULL;
    fflush(NULL);
    execv(py, (char *const *)args);
    dh_cli_error(CMD, "cannot run %s: %s", py, strerror(errno));
    dh__free(args);
    return DH_EXIT_FAIL;
}
