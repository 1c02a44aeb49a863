/*
 * cmd_dataserver.c - `datahelix dataserver`: runs a local DataServer
 * (include/datahelix/dataserver.h) for one rank until SIGINT / SIGTERM or
 * a Shutdown from the Coordinator, then exits 0.  `--remote` (the CPU
 * sidecar mode) is not implemented yet.
 *
 * Design: a thin shell over dh_dataserver_create/run/destroy; the signal
 * handlers only set a flag (no SA_RESTART, so the loop's poll returns EINTR
 * and sees it at once).
 * Locking: single-threaded (the worker threads live in the library).
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "datahelix/dataserver.h"

#define CMD "dataserver"

struct args {
    struct dh_dataserver_opts o;
    int have_rank, help;
};

static void usage(FILE *f)
{
    fprintf(f,
        "usage: datahelix dataserver --coordinator ADDR --rank R "
        "--index M.dhx\n"
        "                            [--workers N] [--server-id ID]\n"
        "                            [--arena-mb MB] [--heartbeat-ms MS]\n\n"
        "Runs the local DataServer of rank R: registers with the\n"
        "Coordinator, decodes the batches routed to it into its shared-\n"
        "memory arena and notifies the Coordinator.  Runs until SIGINT /\n"
        "SIGTERM or a Shutdown message (exit 0).\n\n"
        "  --coordinator ADDR   ZeroMQ endpoint of the Coordinator\n"
        "  --rank R             the rank this server is local to\n"
        "  --index M.dhx        the index the sample ids refer to\n"
        "  --workers N          decode threads (default 2)\n"
        "  --server-id ID       server id, >= 1 (default R + 1)\n"
        "  --arena-mb MB        shared-memory arena size (default 256)\n"
        "  --heartbeat-ms MS    heartbeat period (default 500)\n"
        "  --remote             remote sidecar mode (not implemented yet)\n"
        "  -h, --help           this text\n");
}

static const struct option long_opts[] = {
    {"coordinator", required_argument, NULL, 'c'},
    {"rank", required_argument, NULL, 'r'},
    {"index", required_argument, NULL, 'i'},
    {"workers", required_argument, NULL, 'w'},
    {"server-id", required_argument, NULL, 's'},
    {"arena-mb", required_argument, NULL, 'a'},
    {"heartbeat-ms", required_argument, NULL, 'b'},
    {"remote", no_argument, NULL, 'R'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int parse_opt(struct args *a, int c)
{
    int64_t v = 0;
    int r = 0;

    switch (c) {
    case 'c': a->o.coordinator = optarg; return 0;
    case 'i': a->o.index_path = optarg; return 0;
    case 'r':
        if (!(r = dh_cli_opt_i64(CMD, "--rank", optarg, 0, 65535, &v))) {
            a->o.rank = (uint32_t)v;
            a->have_rank = 1;
        }
        return r;
    case 'w':
        if (!(r = dh_cli_opt_i64(CMD, "--workers", optarg, 1, 256, &v)))
            a->o.workers = (unsigned)v;
        return r;
    case 's':
        if (!(r = dh_cli_opt_i64(CMD, "--server-id", optarg, 1, UINT32_MAX - 1, &v)))
            a->o.server_id = (uint32_t)v;
        return r;
    case 'a':
        if (!(r = dh_cli_opt_i64(CMD, "--arena-mb", optarg, 1, 1 << 20, &v)))
            a->o.arena_bytes = (size_t)v << 20;
        return r;
    case 'b':
        if (!(r = dh_cli_opt_i64(CMD, "--heartbeat-ms", optarg, 1, 3600000, &v)))
            a->o.heartbeat_ms = (int)v;
        return r;
    case 'R':
        return dh_cli_usage_error(CMD, "--remote: not implemented yet in "
                                  "this version of datahelix");
    case 'h': a->help = 1; return 0;
    default: return dh_cli_usage_error(CMD, "bad option");
    }
}

static int parse_args(struct args *a, int argc, char **argv)
{
    int c, r;

    dh_dataserver_opts_default(&a->o);
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
        if ((r = dh_cli_getopt_error(CMD, c, argv)) != 0)
            return r;
        if ((r = parse_opt(a, c)) != 0)
            return r;
    }
    if (a->help)
        return 0;
    if (optind < argc)
        return dh_cli_usage_error(CMD, "unexpected argument '%s'",
                                  argv[optind]);
    if (!a->o.coordinator || !a->have_rank || !a->o.index_path)
        return dh_cli_usage_error(CMD, "--coordinator, --rank and --index "
                                  "are required");
    return 0;
}

static int serve(struct args *a)
{
    struct dh_dataserver *s = NULL;
    struct dh_err e;
    int rc;

    const volatile int *stop = dh_cli_stop_on_signals();

    dh_err_clear(&e);
    if ((rc = dh_dataserver_create(&a->o, &s, &e)) == 0) {
        fprintf(stderr, "datahelix: dataserver: rank %u registered with %s "
                "(%u workers, %zu MiB arena)\n", a->o.rank, a->o.coordinator,
                a->o.workers, a->o.arena_bytes >> 20);
        rc = dh_dataserver_run(s, stop, &e);
    }
    if (rc < 0)
        dh_cli_error(CMD, "%s", e.msg[0] ? e.msg : dh_strerror(rc));
    dh_dataserver_destroy(s);
    return rc < 0 ? DH_EXIT_FAIL : DH_EXIT_OK;
}

int dh_cmd_dataserver(int argc, char **argv)
{
    struct args a;
    int r;

    memset(&a, 0, sizeof(a));
    if ((r = parse_args(&a, argc, argv)) != 0)
        return r;
    if (a.help) {
        usage(stdout);
        return DH_EXIT_OK;
    }
    return serve(&a);
}
