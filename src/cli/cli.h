/*
 * cli.h - shared pieces of the `datahelix` binary: the subcommand table
 * signature, one-line error reporting, number parsing, and the progress bar.
 *
 * Contract (DESIGN 4.1): every subcommand has --help, exits 0 on success and
 * non-zero with one line `datahelix: <what>: <why>` on stderr for bad input.
 */
#ifndef DH_CLI_H
#define DH_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "datahelix/error.h"

/* Exit codes shared by every subcommand. */
enum { DH_EXIT_OK = 0, DH_EXIT_FAIL = 1, DH_EXIT_USAGE = 2 };

typedef int (*dh_cmd_fn)(int argc, char **argv);

/* A program's command table (main.c, main_svc.c) and its dispatch
 * (cli_dispatch.c): --help, --version, unknown commands. */
struct dh_cli_entry {
    const char *name;
    dh_cmd_fn fn;
    const char *summary;
};
struct dh_cli_program {
    const char *name;  /* "datahelix": usage, --version, errors */
    const char *about; /* a paragraph under the usage line, or NULL */
    const struct dh_cli_entry *commands;
    size_t n;
    const char *unknown_hint; /* appended to "unknown command", or NULL */
};
int dh_cli_dispatch(const struct dh_cli_program *p, int argc, char **argv);

/* Subcommands (one file each). argv[0] is the subcommand name. */
int dh_cmd_gen_data(int argc, char **argv);
int dh_cmd_probe(int argc, char **argv);
int dh_cmd_index(int argc, char **argv);
int dh_cmd_shard(int argc, char **argv);
int dh_cmd_decode(int argc, char **argv);
int dh_cmd_plan(int argc, char **argv);
int dh_cmd_sim(int argc, char **argv);
int dh_cmd_coordinator(int argc, char **argv);
int dh_cmd_dataserver(int argc, char **argv);
int dh_cmd_consume(int argc, char **argv);
int dh_cmd_bench(int argc, char **argv);
int dh_cmd_keygen(int argc, char **argv);
int dh_cmd_demo(int argc, char **argv);
int dh_cmd_top(int argc, char **argv);

/* ---- subcommands whose work is a Python module (py_exec.c) ---- */
/* This program's path (/proc/self/exe) and its folder.  0, or -1 with the
 * error printed for `cmd`. */
int dh_cli_self_dir(const char *cmd, char *self, size_t self_len, char *dir,
                    size_t dir_len);
/* Replaces this process with `$DATAHELIX_PYTHON or /usr/bin/python3 -m
 * MODULE argv[1..]`, DATAHELIX_BIN = self and, if pkg_dir is not NULL,
 * pkg_dir first on PYTHONPATH.  Returns only on failure (DH_EXIT_FAIL,
 * the error printed). */
int dh_cli_exec_python(const char *cmd, const char *self, const char *pkg_dir,
                       const char *module, int argc, char **argv);
/* The same for FILE of the datahelix package, run by path as __main__
 * without importing the package (whose __init__ loads torch): for
 * commands that need only the standard library (`top`). */
int dh_cli_exec_python_file(const char *cmd, const char *self,
                            const char *pkg_dir, const char *file, int argc,
                            char **argv);

/* Prints "datahelix: <what>: <why>\n" to stderr. */
void dh_cli_error(const char *what, const char *fmt, ...) DH_PRINTF(2, 3);

/* Reports a usage error for `cmd` and returns DH_EXIT_USAGE. */
int dh_cli_usage_error(const char *cmd, const char *fmt, ...) DH_PRINTF(2, 3);

/* ---- one subcommand's command line, table-driven ---- */
struct option;

struct dh_cli_cmd {
    const char *name;              /* "consume": the error lines' <what> */
    const char *optstring;         /* getopt_long's, with ':' first (after
                                      a '+' to stop at the first operand) */
    const struct option *longopts; /* {"help", ..., 'h'} included */
    int (*opt)(void *ctx, int c);  /* one option (its value in optarg): 0,
                                      or DH_EXIT_USAGE with its line */
    int max_args;                  /* operands accepted; -1: any */
    void (*usage)(FILE *f);
};

/* One subcommand's table, `cli_cmd`, for dh_cli_getopt(). */
#define DH_CLI_CMD(name_, optstring_, longopts_, opt_, max_args_, usage_)      \
    static const struct dh_cli_cmd cli_cmd = {.name = (name_),                 \
                                              .optstring = (optstring_),       \
                                              .longopts = (longopts_),         \
                                              .opt = (opt_),                   \
                                              .max_args = (max_args_),         \
                                              .usage = (usage_)}

/* What dh_cli_getopt() returns when the command should run. */
#define DH_CLI_RUN (-1)

/*
 * Parses argv[1..] by `cmd`: every option goes to cmd->opt (except 'h',
 * which is --help / -h), an unknown option, a missing value or an operand
 * past max_args is one usage line.  DH_CLI_RUN with *first (may be NULL)
 * = the index of the first operand; else the exit code to return now:
 * DH_EXIT_OK once usage went to stdout for --help, DH_EXIT_USAGE after an
 * error line.  Resets getopt's state first.
 */
int dh_cli_getopt(const struct dh_cli_cmd *cmd, int argc, char **argv,
                  void *ctx, int *first);

/* For getopt_long() with a leading ':' in its option string: the usage
 * error for c == ':' (missing value) or '?' (unknown option); 0 for any
 * other c.  Call it right after getopt_long(). */
int dh_cli_getopt_error(const char *cmd, int c, char **argv);

/* Option `name`'s value `s` as an integer in [lo, hi]: 0, or (and a
 * one-line usage error for `cmd`) "NAME must be an integer in [lo, hi],
 * not 'S'". */
int dh_cli_opt_i64(const char *cmd, const char *name, const char *s, int64_t lo,
                   int64_t hi, int64_t *out);

/* Strict integer / float parsing: whole string, in [lo, hi]. 0 or -1. */
int dh_cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
/* --ca-bundle FILE: the CAs HTTPS sources trust (DATAHELIX_CA_BUNDLE for
 * this process and the services it starts); a usage error (2) when FILE
 * cannot be read. */
int dh_cli_opt_ca_bundle(const char *cmd, const char *file);
/* --cache-dir DIR / --cache-bytes N: the host-local cache of remote
 * objects (DATAHELIX_CACHE_DIR / DATAHELIX_CACHE_BYTES for this process
 * and what it starts); a usage error (2) for a bad value. */
int dh_cli_opt_cache_dir(const char *cmd, const char *dir);
int dh_cli_opt_cache_bytes(const char *cmd, const char *n);
/* "WxH" (each 1..16384) into p->width / p->height; else a usage error
 * (DH_EXIT_USAGE) naming cmd. */
struct dh_media_plan;
int dh_cli_opt_size(const char *cmd, const char *s, struct dh_media_plan *p);
int dh_cli_parse_double(const char *s, double lo, double hi, double *out);

/* ---- progress on stderr ----
 * On a terminal: a bar redrawn in place.  Elsewhere (logs, pipes): a plain
 * line every $DATAHELIX_PROGRESS_S seconds (default 10; 0: none), so a long
 * run's log shows it is alive; dh_progress_log_every() sets that period
 * (0: none, e.g. for --quiet). */
struct dh_progress {
    const char *label;
    uint64_t total;
    uint64_t done;
    uint64_t failed;
    double t_start;
    double t_last_draw;
    double t_last_log;
    double log_every_s; /* 0: no lines when not a terminal */
    char note[64];      /* shown after the counts, e.g. "12.3x real time" */
    int enabled;
};

void dh_progress_start(struct dh_progress *p, const char *label,
                       uint64_t total);
/* When stderr is not a terminal, print one line every `secs` seconds
 * (0: never, the default). */
void dh_progress_log_every(struct dh_progress *p, double secs);
/* Copies `note` (truncated to fit) to show after the counts. */
void dh_progress_set_note(struct dh_progress *p, const char *note);
/* Thread-compatible: call from one thread. Redraws at most ~10 times/s. */
void dh_progress_update(struct dh_progress *p, uint64_t done, uint64_t failed);
/* Clears the bar line. */
void dh_progress_finish(struct dh_progress *p);

/* Per-profile summary (count, mean frames, resolution, est. CPU ms,
 * tokens, output MB; total CPU s) of the descriptors with ok[i] != 0
 * (ok may be NULL: all).  Not thread-safe (static scratch). */
struct dh_desc;
void dh_cli_print_profile_summary(FILE *f, const struct dh_desc *descs,
                                  const int *ok, size_t n);

/* Installs SIGINT/SIGTERM handlers (without SA_RESTART, so blocking polls
 * return EINTR) that set the returned flag: the stop flag of a daemon's run
 * loop.  Call once per process. */
const volatile int *dh_cli_stop_on_signals(void);
/* A service (coordinator, dataserver, consume) must not die of a log line
 * written to a pipe whose reader went away (the Python loader that started
 * it has exited, a `| head`): SIGPIPE is ignored, the write fails with
 * EPIPE and the service goes on.  Sockets already send with MSG_NOSIGNAL. */
void dh_cli_ignore_sigpipe(void);

/* --remove-at-exit DIR (coordinator, dataserver): folders a loader made
 * for a job (its key, its ipc socket) that the service removes when it
 * ends cleanly, so none is left after a kill -9 of the loader (issue 41).
 * At most DH_CLI_MAX_REMOVE; a usage error past that. */
#define DH_CLI_MAX_REMOVE 4
struct dh_cli_remove {
    const char *dir[DH_CLI_MAX_REMOVE];
    int n;
};
int dh_cli_remove_add(struct dh_cli_remove *r, const char *cmd,
                      const char *dir);
/* Removes each folder that is one this user's loaders make: a real folder
 * (not a link) named datahelix-*, owned by this user, mode 0700; its
 * entries are unlinked (no sub-folders are entered), then the folder.
 * Anything else is left alone.  Best effort: nothing is reported. */
void dh_cli_remove_run(const struct dh_cli_remove *r);
/* Also raise that flag when the parent process dies (a thread polls
 * getppid()).  -1 if the thread cannot start. */
int dh_cli_stop_with_parent(void);

/* Monotonic seconds. */
double dh_cli_now(void);

/* Most worker threads a command starts. */
#define DH_CLI_MAX_THREADS 256

/* Runs work(arg) on min(n, DH_CLI_MAX_THREADS) threads while this thread
 * runs wait(arg) (a progress loop that returns once the work is done or
 * stopped); when no thread can start, work(arg) runs here instead and
 * wait is not called.  Returns when every thread has ended. */
void dh_cli_run_threads(int64_t n, void *(*work)(void *), void (*wait)(void *),
                        void *arg);

/* dh_cli_error() on a line of its own: on a terminal it first clears a
 * progress bar being drawn there.  Callers serialise it with the bar's
 * updates. */
void dh_cli_error_line(const char *cmd, const char *fmt, ...) DH_PRINTF(2, 3);

#endif
