/*
 * py_exec.c - subcommands whose work is Python (`bench`, `demo`): this
 * program execs Debian's interpreter on a module, with DATAHELIX_BIN naming
 * this program (so the processes the module starts run the same build) and
 * the module's folder first on PYTHONPATH.  What only this side can see (no
 * interpreter, no package) is a one-line error; the module parses the
 * arguments and prints --help, so the two sides cannot disagree.
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

#define PYTHONPATH_MAX (2 * PATH_MAX)

int dh_cli_self_dir(const char *cmd, char *self, size_t self_len, char *dir,
                    size_t dir_len)
{
    ssize_t n = readlink("/proc/self/exe", self, self_len - 1);
    const char *slash;
    int len;

    if (n <= 0) {
        dh_cli_error(cmd, "/proc/self/exe: %s", strerror(errno));
        return -1;
    }
    self[n] = 0;
    slash = strrchr(self, '/');
    len = snprintf(dir, dir_len, "%.*s", (int)(slash ? slash - self : 0), self);
    if (len < 0 || (size_t)len >= dir_len) {
        dh_cli_error(cmd, "the path of this program is too long");
        return -1;
    }
    return 0;
}

/* PYTHONPATH = DIR[:the caller's PYTHONPATH]. */
static int prepend_pythonpath(const char *cmd, const char *dir)
{
    const char *old = getenv("PYTHONPATH");
    char val[PYTHONPATH_MAX];
    int len;

    if (old && *old)
        len = snprintf(val, sizeof(val), "%s:%s", dir, old);
    else
        len = snprintf(val, sizeof(val), "%s", dir);
    if (len < 0 || (size_t)len >= sizeof(val)) {
        dh_cli_error(cmd, "PYTHONPATH is too long");
        return -1;
    }
    if (setenv("PYTHONPATH", val, 1) != 0) {
        dh_cli_error(cmd, "setenv: %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* The interpreter: $DATAHELIX_PYTHON, else Debian's /usr/bin/python3. */
static const char *find_python(const char *cmd)
{
    const char *py = getenv("DATAHELIX_PYTHON");

    if (!py || !*py)
        py = "/usr/bin/python3";
    if (access(py, X_OK) != 0) {
        dh_cli_error(cmd,
                     "%s: %s (this command needs Debian's python3 with "
                     "python3-torch; set DATAHELIX_PYTHON)",
                     py, strerror(errno));
        return NULL;
    }
    return py;
}

static int exec_python(const char *cmd, const char *self, const char *pkg_dir,
                       const char *flag, const char *what, int argc,
                       char **argv);

/* Runs `file` of the datahelix package by path: the package is found
 * (importlib's find_spec, which does not import it: its __init__ loads
 * torch) and the file run as __main__. */
#define BOOT_FMT                                                               \
    "import importlib.util as u, os, runpy, sys\n"                             \
    "s = u.find_spec('datahelix')\n"                                           \
    "d = s and s.submodule_search_locations\n"                                 \
    "if not d:\n"                                                              \
    "    sys.exit('datahelix %s: the datahelix Python package is not "         \
    "installed (pip install . from the source tree)')\n"                       \
    "sys.argv[0] = 'datahelix %s'\n"                                           \
    "runpy.run_path(os.path.join(list(d)[0], '%s'), run_name='__main__')\n"

int dh_cli_exec_python_file(const char *cmd, const char *self,
                            const char *pkg_dir, const char *file, int argc,
                            char **argv)
{
    char boot[1024];
    int len = snprintf(boot, sizeof(boot), BOOT_FMT, cmd, cmd, file);

    if (len < 0 || (size_t)len >= sizeof(boot) || strchr(file, '\'')) {
        dh_cli_error(cmd, "bad module file name");
        return DH_EXIT_FAIL;
    }
    return exec_python(cmd, self, pkg_dir, "-c", boot, argc, argv);
}

int dh_cli_exec_python(const char *cmd, const char *self, const char *pkg_dir,
                       const char *module, int argc, char **argv)
{
    return exec_python(cmd, self, pkg_dir, "-m", module, argc, argv);
}

static int exec_python(const char *cmd, const char *self, const char *pkg_dir,
                       const char *flag, const char *what, int argc,
                       char **argv)
{
    const char *py;
    const char **args;
    int n = 0;

    if (!(py = find_python(cmd)) ||
        (pkg_dir && prepend_pythonpath(cmd, pkg_dir) < 0))
        return DH_EXIT_FAIL;
    if (setenv("DATAHELIX_BIN", self, 1) != 0) {
        dh_cli_error(cmd, "setenv: %s", strerror(errno));
        return DH_EXIT_FAIL;
    }
    if (!(args = dh__calloc((size_t)argc + 3, sizeof(*args)))) {
        dh_cli_error(cmd, "out of memory");
        return DH_EXIT_FAIL;
    }
    args[n++] = py;
    args[n++] = flag;
    args[n++] = what;
    for (int i = 1; i < argc; i++)
        args[n++] = argv[i];
    args[n] = NULL;
    fflush(NULL);
    execv(py, (char *const *)args);
    dh_cli_error(cmd, "cannot run %s: %s", py, strerror(errno));
    dh__free(args);
    return DH_EXIT_FAIL;
}
