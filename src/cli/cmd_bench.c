/*
 * cmd_bench.c - `datahelix bench`: data-loading systems side by side in
 * one run under the same CPU budget (torch DataLoader with the C or the
 * PyAV decode, a Dask pool, the datahelix ablation ladder), with the
 * paper's metrics (Sec. 5.1).
 *
 * Design: the harness is Python (it drives torch.distributed ranks, torch
 * DataLoaders and Dask), in bench/bench_live.py.  This file checks the
 * arguments (one-line errors, exit 2, before anything starts), finds the
 * script beside this program's tree (../bench/bench_live.py relative to
 * the directory of /proc/self/exe, or $DATAHELIX_BENCH_SCRIPT) and execs
 * /usr/bin/python3 (or $DATAHELIX_PYTHON) on it with the options spelled
 * out in full, and DATAHELIX_BIN naming this program, so the ranks' data
 * servers and the harness's gen-data / probe run the same build.
 * Locking: single-threaded; nothing returns after a successful exec.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "datahelix/media.h"

#define CMD "bench"
#define MAX_FWD 64

static const char *const systems[] = {
    "native", "native-pyav", "dask-pool", "dh-base", "dh-transport",
    "dh-prefetch", "dh-ddl",
};
#define N_SYSTEMS (sizeof(systems) / sizeof(systems[0]))

static void usage(FILE *f)
{
    fprintf(f,
        "usage: datahelix bench [--systems LIST] [--ranks R] [--steps N]\n"
        "                       [--warmup W] [--workload S|M|L|mixed|shared]\n"
        "                       [--model videomae|qwen-vl|dit] [--workers N]\n"
        "                       [--batch-size B] [--json] [--out DIR] "
        "[--plots]\n"
        "                       [--validate] [--gpu [--gpu-device D]]\n\n"
        "Runs data-loading systems side by side, one after the other in one\n"
        "run, each as R training-rank processes (torch.distributed, gloo)\n"
        "that per step take a batch, hold an emulated GPU window (a sleep\n"
        "sized from the batch under --model) and all-reduce; same samples\n"
        "mix, same number of decode workers, same CPUs.  Prints the paper's\n"
        "metrics (Sec. 5.1) per system and dh-ddl's ratios to native and\n"
        "dask-pool.\n\n"
        "  --systems LIST     comma-separated, or all (default):\n"
        "                     native       torch DataLoader per rank, C decode\n"
        "                     native-pyav  the same, PyAV decode\n"
        "                     dask-pool    a Dask LocalCluster serving all "
        "ranks\n"
        "                                  (skipped without python3-distributed)\n"
        "                     dh-base, dh-transport, dh-prefetch, dh-ddl\n"
        "                                  datahelix.DataLoader(ablation=...)\n"
        "  --ranks R          training ranks (default 4)\n"
        "  --steps N          measured steps per rank (default 40)\n"
        "  --warmup W         warm-up steps left out (default 5)\n"
        "  --workload W       gen-data profiles S, M, L or mixed (default),\n"
        "                     or shared (../shared/data/videos)\n"
        "  --model M          GPU window: videomae (frames x batch, default),\n"
        "                     qwen-vl (tokens + quadratic attention), dit\n"
        "                     (latents)\n"
        "  --workers N        CPU budget: decode workers in total for every\n"
        "                     system, every process pinned to N CPUs when\n"
        "                     there are more (default 2; at least one per\n"
        "                     rank for rank-local loaders)\n"
        "  --batch-size B     samples per rank and step (default 2)\n"
        "  --frames N         frames per sample (default 16)\n"
        "  --size WxH         output size (default 224x224)\n"
        "  --prefetch K       batches in flight per rank for native,\n"
        "                     native-pyav, dask-pool (default 4; the dh-*\n"
        "                     rungs use their presets)\n"
        "  --clips N          distinct clips generated (default 24)\n"
        "  --seed S           data and plan seed (default 0)\n"
        "  --gpu-scale X      multiplies every GPU window (default 1)\n"
        "  --timeout S        bound on one system's run (default 180 + 20\n"
        "                     per step)\n"
        "  --out DIR          results.json, table.md, per-rank records,\n"
        "                     telemetry, plots (default bench/out/live)\n"
        "  --data-dir DIR     where generated clips are cached\n"
        "                     (default bench/out/live-data)\n"
        "  --json             print the results as one JSON object\n"
        "  --plots            PNGs into --out (needs python3-matplotlib)\n"
        "  --ddl-ms MS        the data deadline: a rank-step whose input\n"
        "                     wait exceeds it is a DDL miss (default 1:\n"
        "                     the batch was not ready when asked)\n"
        "  --gpu              a real step of a small video transformer\n"
        "                     (bench/gpu_model.py: forward, backward,\n"
        "                     optimizer) on --gpu-device instead of the\n"
        "                     emulated window; exit 2 without CUDA\n"
        "  --gpu-device D     cuda (default: rank r on cuda:r mod count),\n"
        "                     cuda:N, or cpu (the same model on the CPU, which\n"
        "                     it then shares with decode: a check of the\n"
        "                     path, not a measurement)\n"
        "  --validate         also simulate the same configuration with\n"
        "                     `datahelix sim` (this machine's decode times,\n"
        "                     the same GPU window) and print how far the\n"
        "                     simulated native, pool and datahelix are from\n"
        "                     the live native, dask-pool and dh-ddl\n"
        "  -h, --help         this text\n\n"
        "Runs bench/bench_live.py (found from this program's location, or\n"
        "$DATAHELIX_BENCH_SCRIPT) with /usr/bin/python3 ($DATAHELIX_PYTHON).\n"
        "Exit 0 when at least one system ran; 1 otherwise; 2 for bad "
        "arguments.\n");
}

enum {
    OPT_SYSTEMS = 256, OPT_RANKS, OPT_STEPS, OPT_WARMUP, OPT_WORKLOAD,
    OPT_MODEL, OPT_WORKERS, OPT_BATCH, OPT_FRAMES, OPT_SIZE, OPT_PREFETCH,
    OPT_CLIPS, OPT_SEED, OPT_GPU_SCALE, OPT_TIMEOUT, OPT_JSON, OPT_OUT,
    OPT_DATA_DIR, OPT_PLOTS, OPT_VALIDATE, OPT_GPU, OPT_DDL, OPT_GPU_DEV,
};

static const struct option long_opts[] = {
    {"systems", required_argument, NULL, OPT_SYSTEMS},
    {"ranks", required_argument, NULL, OPT_RANKS},
    {"steps", required_argument, NULL, OPT_STEPS},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"workload", required_argument, NULL, OPT_WORKLOAD},
    {"model", required_argument, NULL, OPT_MODEL},
    {"workers", required_argument, NULL, OPT_WORKERS},
    {"batch-size", required_argument, NULL, OPT_BATCH},
    {"frames", required_argument, NULL, OPT_FRAMES},
    {"size", required_argument, NULL, OPT_SIZE},
    {"prefetch", required_argument, NULL, OPT_PREFETCH},
    {"clips", required_argument, NULL, OPT_CLIPS},
    {"seed", required_argument, NULL, OPT_SEED},
    {"gpu-scale", required_argument, NULL, OPT_GPU_SCALE},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {"json", no_argument, NULL, OPT_JSON},
    {"out", required_argument, NULL, OPT_OUT},
    {"data-dir", required_argument, NULL, OPT_DATA_DIR},
    {"plots", no_argument, NULL, OPT_PLOTS},
    {"validate", no_argument, NULL, OPT_VALIDATE},
    {"gpu", no_argument, NULL, OPT_GPU},
    {"gpu-device", required_argument, NULL, OPT_GPU_DEV},
    {"ddl-ms", required_argument, NULL, OPT_DDL},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* The options to forward, spelled out in full (getopt_long takes
 * abbreviations; the script's parser need not agree on them). */
struct fwd {
    const char *argv[MAX_FWD];
    char names[MAX_FWD][24]; /* "--" + a long option's name */
    int n;
};

/* Appends "--name" and its value (NULL: none); values point into argv. */
static int push(struct fwd *f, const char *name, const char *value)
{
    if (f->n + 2 >= MAX_FWD)
        return dh_cli_usage_error(CMD, "too many options");
    snprintf(f->names[f->n], sizeof(f->names[f->n]), "--%s", name);
    f->argv[f->n] = f->names[f->n];
    f->n++;
    if (value)
        f->argv[f->n++] = value;
    return 0;
}

static int one_of(const char *opt, const char *s, const char *const *names,
                  size_t n, const char *expected)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(s, names[i]))
            return 0;
    return dh_cli_usage_error(CMD, "%s '%s': expected %s", opt, s, expected);
}

/* "native,dh-ddl" or "all": every name known, at least one. */
static int check_systems(const char *s)
{
    char buf[256], *save = NULL, *tok;
    int n = 0;

    if (!strcmp(s, "all"))
        return 0;
    if (strlen(s) >= sizeof(buf))
        return dh_cli_usage_error(CMD, "--systems: list too long");
    memcpy(buf, s, strlen(s) + 1);
    for (tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        size_t i;

        for (i = 0; i < N_SYSTEMS && strcmp(tok, systems[i]); i++)
            ;
        if (i == N_SYSTEMS)
            return dh_cli_usage_error(CMD, "--systems: unknown system '%s' "
                                      "(expected native, native-pyav, "
                                      "dask-pool, dh-base, dh-transport, "
                                      "dh-prefetch, dh-ddl or all)", tok);
        n++;
    }
    if (!n)
        return dh_cli_usage_error(CMD, "--systems: empty list");
    return 0;
}

static int check_int(const char *opt, const char *s, int64_t lo, int64_t hi)
{
    int64_t v;

    return dh_cli_opt_i64(CMD, opt, s, lo, hi, &v);
}

static int check_opt(int c, const char *s, int64_t *ranks, int64_t *batch)
{
    static const char *const workloads[] = {"S", "M", "L", "mixed",
                                            "shared"};
    static const char *const models[] = {"videomae", "qwen-vl", "dit"};
    struct dh_media_plan p;
    double d;

    switch (c) {
    case OPT_SYSTEMS: return check_systems(s);
    case OPT_RANKS:
        return dh_cli_opt_i64(CMD, "--ranks", s, 1, 64, ranks);
    case OPT_STEPS: return check_int("--steps", s, 1, 100000);
    case OPT_WARMUP: return check_int("--warmup", s, 0, 100000);
    case OPT_WORKLOAD:
        return one_of("--workload", s, workloads, 5,
                      "S, M, L, mixed or shared");
    case OPT_MODEL:
        return one_of("--model", s, models, 3, "videomae, qwen-vl or dit");
    case OPT_WORKERS: return check_int("--workers", s, 1, 1024);
    case OPT_BATCH:
        return dh_cli_opt_i64(CMD, "--batch-size", s, 1, 1024, batch);
    case OPT_FRAMES: return check_int("--frames", s, 1, 1024);
    case OPT_SIZE:
        dh_media_plan_init(&p);
        return dh_cli_opt_size(CMD, s, &p);
    case OPT_PREFETCH: return check_int("--prefetch", s, 1, 64);
    case OPT_CLIPS: return check_int("--clips", s, 1, 100000);
    case OPT_SEED: return check_int("--seed", s, 0, INT32_MAX);
    case OPT_GPU_SCALE:
        if (dh_cli_parse_double(s, 0, 1e6, &d) < 0)
            return dh_cli_usage_error(CMD, "--gpu-scale must be a number in "
                                      "[0, 1e6], not '%s'", s);
        return 0;
    case OPT_TIMEOUT: return check_int("--timeout", s, 10, 86400);
    case OPT_DDL:
        if (dh_cli_parse_double(s, 0, 1e9, &d) < 0)
            return dh_cli_usage_error(CMD, "--ddl-ms must be a number in "
                                      "[0, 1e9], not '%s'", s);
        return 0;
    case OPT_GPU_DEV: {
        /* whether a CUDA device is there is the harness's to say (torch) */
        char *end = NULL;

        if (!strcmp(s, "cpu") || !strcmp(s, "cuda") ||
            (!strncmp(s, "cuda:", 5) && s[5] >= '0' && s[5] <= '9' &&
             strtol(s + 5, &end, 10) >= 0 && end && !*end))
            return 0;
        return dh_cli_usage_error(CMD, "--gpu-device must be cuda, cuda:N "
                                  "or cpu, not '%s'", s);
    }
    default: return 0;
    }
}

static int parse_args(int argc, char **argv, struct fwd *f, int *help)
{
    int64_t ranks = 4, batch = 2;
    int c, idx;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", long_opts, &idx)) != -1) {
        int r;

        if ((r = dh_cli_getopt_error(CMD, c, argv)) != 0)
            return r;
        if (c == 'h') {
            *help = 1;
            continue;
        }
        if ((r = check_opt(c, optarg, &ranks, &batch)) != 0)
            return r;
        if ((r = push(f, long_opts[idx].name, optarg)) != 0)
            return r;
    }
    if (optind < argc)
        return dh_cli_usage_error(CMD, "unexpected argument '%s'",
                                  argv[optind]);
    if (ranks * batch > 4096)
        return dh_cli_usage_error(CMD, "--ranks x --batch-size must be at "
                                  "most 4096");
    return 0;
}

/* This program's path and <its directory>/../bench/bench_live.py, or
 * $DATAHELIX_BENCH_SCRIPT. */
static int find_script(char *self, size_t self_len, char *script,
                       size_t script_len)
{
    const char *env = getenv("DATAHELIX_BENCH_SCRIPT");
    ssize_t n = readlink("/proc/self/exe", self, self_len - 1);

    if (n <= 0) {
        dh_cli_error(CMD, "/proc/self/exe: %s", strerror(errno));
        return -1;
    }
    self[n] = 0;
    if (env && *env) {
        if ((size_t)snprintf(script, script_len, "%s", env) >= script_len) {
            dh_cli_error(CMD, "$DATAHELIX_BENCH_SCRIPT is too long");
            return -1;
        }
    } else {
        char dir[PATH_MAX], *slash;

        snprintf(dir, sizeof(dir), "%s", self);
        if ((slash = strrchr(dir, '/')))
            *slash = 0;
        if ((size_t)snprintf(script, script_len, "%s/../bench/bench_live.py",
                             dir) >= script_len) {
            dh_cli_error(CMD, "path of the bench script too long");
            return -1;
        }
    }
    if (access(script, R_OK) != 0) {
        dh_cli_error(CMD, "the harness %s: %s (it ships in the source tree "
                     "beside build/; set DATAHELIX_BENCH_SCRIPT to "
                     "bench_live.py)", script, strerror(errno));
        return -1;
    }
    return 0;
}

int dh_cmd_bench(int argc, char **argv)
{
    struct fwd f = {.n = 0};
    char self[PATH_MAX], script[PATH_MAX + 32];
    const char *py = getenv("DATAHELIX_PYTHON");
    const char *args[MAX_FWD + 4];
    int help = 0, r, n = 0;

    if ((r = parse_args(argc, argv, &f, &help)) != 0)
        return r;
    if (help) {
        usage(stdout);
        return DH_EXIT_OK;
    }
    if (find_script(self, sizeof(self), script, sizeof(script)) < 0)
        return DH_EXIT_FAIL;
    if (!py || !*py)
        py = "/usr/bin/python3";
    if (access(py, X_OK) != 0) {
        dh_cli_error(CMD, "%s: %s (the harness needs Debian's python3 with "
                     "python3-torch; set DATAHELIX_PYTHON)", py,
                     strerror(errno));
        return DH_EXIT_FAIL;
    }
    if (setenv("DATAHELIX_BIN", self, 1) != 0) {
        dh_cli_error(CMD, "setenv: %s", strerror(errno));
        return DH_EXIT_FAIL;
    }
    args[n++] = py;
    args[n++] = script;
    for (int i = 0; i < f.n; i++)
        args[n++] = f.argv[i];
    args[n] = NULL;
    fflush(NULL);
    execv(py, (char *const *)args);
    dh_cli_error(CMD, "cannot run %s: %s", py, strerror(errno));
    return DH_EXIT_FAIL;
}
