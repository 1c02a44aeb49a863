/*
 * cmd_dataserver.c - `datahelix dataserver`: runs a DataServer
 * (src/include/datahelix/dataserver.h), local to one rank (`--rank R`,
 * optionally `--listen` for payloads from remote servers) or a remote CPU
 * sidecar (`--remote`), until SIGINT / SIGTERM or a Shutdown from the
 * Coordinator, then exits 0.
 *
 * Design: a thin shell over dh_dataserver_create/run/destroy; the signal
 * handlers only set a flag (no SA_RESTART, so the loop's poll returns EINTR
 * and sees it at once).
 * Locking: single-threaded (the worker threads live in the library).
 */
#include <getopt.h>
#include <stdlib.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "cli/cli.h"
#include "datahelix/dataserver.h"
#include "datahelix/wire.h"

#define CMD "dataserver"

struct args {
    struct dh_dataserver_opts o;
    int have_rank;
    char token[DH_WIRE_TOKEN_LEN + 1];
    struct dh_cli_remove remove;
};

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: datahelix dataserver --coordinator ADDR --rank R "
        "--index M.dhx\n"
        "                            [--listen ADDR [--advertise ADDR]]\n"
        "                            [--client-socket NAME [--client-pid P]\n"
        "                             | --client-fd N]\n"
        "       datahelix dataserver --remote --coordinator ADDR "
        "--index M.dhx\n"
        "                            [--deliver-timeout-ms MS]\n"
        "   common options:          [--workers N] [--server-id ID]\n"
        "                            [--payload-stripes N]\n"
        "                            [--arena-mb MB] [--heartbeat-ms MS]\n\n"
        "Runs the local DataServer of rank R: registers with the\n"
        "Coordinator, decodes the batches routed to it into its shared-\n"
        "memory arena and notifies the Coordinator.  With --remote, runs a\n"
        "remote CPU sidecar instead: it decodes the batches routed to it\n"
        "into a private staging area and sends each to the requester's\n"
        "local DataServer, which must run with --listen (without it, the\n"
        "Coordinator keeps that rank's work local).  Runs until SIGINT /\n"
        "SIGTERM or a Shutdown message (exit 0).\n\n"
        "  --coordinator ADDR   ZeroMQ endpoint of the Coordinator\n"
        "  --rank R             the rank this server is local to\n"
        "  --remote             remote sidecar mode (no --rank)\n"
        "  --index M.dhx        the index the sample ids refer to\n"
        "  --workers N          decode threads (default 2)\n"
        "  --server-id ID       server id, >= 1 (default R + 1; remote: a\n"
        "                       hash of host name and pid)\n"
        "  --arena-mb MB        shared-memory arena size (default 256;\n"
        "                       remote: staging memory)\n"
        "  --heartbeat-ms MS    heartbeat period (default 500)\n"
        "  --cache-dir DIR      keep chunks of S3 / HTTP(S) objects in DIR,\n"
        "                       shared by the host's DataServers\n"
        "                       (docs/remote.md; default: no cache)\n"
        "  --cache-bytes N      the cache's bound (default 10 GiB)\n"
        "  --sample-timeout-ms MS  per-sample watchdog: a decode running\n"
        "                       longer is abandoned, its batch fails\n"
        "                       (default 60000; 0: none)\n"
        "  --listen ADDR        local: take payloads from remote servers on\n"
        "                       this ZeroMQ endpoint (e.g.\n"
        "                       tcp://127.0.0.1:0 picks a free port); the\n"
        "                       bound address is announced\n"
        "  --advertise ADDR     announce ADDR instead (required when\n"
        "                       --listen binds every interface, tcp://*:P)\n"
        "  --remove-at-exit DIR on a clean end, remove DIR if it is a\n"
        "                       datahelix-* folder of this user, mode 0700\n"
        "                       (a loader's key folder; up to 4 times)\n"
        "  --keyfile FILE       the job key (datahelix keygen FILE; default\n"
        "                       $DATAHELIX_KEYFILE): CURVE on the\n"
        "                       Coordinator link, --listen and deliveries\n"
        "  --insecure           allow --listen on a non-loopback address\n"
        "                       without a key (warns)\n"
        "  --payload-stripes N  connections (and I/O threads) a payload\n"
        "                       link uses, 1..8: a large batch is cut into\n"
        "                       N parts so CURVE runs on N cores (default\n"
        "                       $DATAHELIX_PAYLOAD_STRIPES, else half the\n"
        "                       CPUs, 1..4)\n"
        "  --deliver-timeout-ms MS  remote: how long a local server may take\n"
        "                       to accept a batch before the task fails\n"
        "                       (default 5000)\n"
        "  --client-socket NAME hand the arena to the client that connects\n"
        "                       to the abstract Unix socket @NAME (a\n"
        "                       process of this user only)\n"
        "  --client-pid P       with --client-socket: only process P\n"
        "  --client-fd N        hand it over inherited socket N (how a\n"
        "                       client starts its embedded server)\n"
        "                       With either, the server stops when its\n"
        "                       client goes away.\n"
        "  Python-dataset mode (what datahelix.DistributedDataLoader starts;\n"
        "  needs --client-fd: unpickling runs code, so only the client that\n"
        "  started this server names the dataset):\n"
        "  --python-dataset FILE  run requests on Python worker processes\n"
        "                       over this pickled dataset, not the media\n"
        "                       pipeline\n"
        "  --python-workers N   worker processes (default 1)\n"
        "  --python EXE         interpreter (default python3 on PATH)\n"
        "  --python-path DIR    first on the workers' PYTHONPATH\n"
        "  --python-job-timeout-ms MS  a worker busy longer on one batch is\n"
        "                       killed and replaced, the batch fails\n"
        "                       (default 600000)\n"
        "  --python-seed S      workers' base seed before the first batch\n"
        "  --python-unlink      remove FILE (and --index, if beside it) once\n"
        "                       the client has gone\n"
        "  --python-forkserver SOCK  fork the workers from the fork server\n"
        "                       listening on Unix socket SOCK (a process\n"
        "                       of this user that holds the dataset\n"
        "                       already) instead of starting interpreters;\n"
        "                       they are exec'd if it is gone\n"
        "  -h, --help           this text\n");
}

/* Long-only options (values clear of every short letter). */
enum {
    OPT_PY_DATASET = 0x100,
    OPT_PY_WORKERS,
    OPT_PY_EXE,
    OPT_PY_PATH,
    OPT_PY_TIMEOUT,
    OPT_PY_SEED,
    OPT_PY_UNLINK,
    OPT_PY_FORKSERVER,
    OPT_CLIENT_PID,
    OPT_STRIPES,
    OPT_REMOVE,
    OPT_CACHE_DIR,
    OPT_CACHE_BYTES
};

static const struct option long_opts[] = {
    {"coordinator", required_argument, NULL, 'c'},
    {"rank", required_argument, NULL, 'r'},
    {"index", required_argument, NULL, 'i'},
    {"workers", required_argument, NULL, 'w'},
    {"server-id", required_argument, NULL, 's'},
    {"arena-mb", required_argument, NULL, 'a'},
    {"heartbeat-ms", required_argument, NULL, 'b'},
    {"sample-timeout-ms", required_argument, NULL, 'W'},
    {"remote", no_argument, NULL, 'R'},
    {"client-socket", required_argument, NULL, 'S'},
    {"client-fd", required_argument, NULL, 'F'},
    {"client-pid", required_argument, NULL, OPT_CLIENT_PID},
    {"listen", required_argument, NULL, 'l'},
    {"advertise", required_argument, NULL, 'A'},
    {"keyfile", required_argument, NULL, 'K'},
    {"insecure", no_argument, NULL, 'I'},
    {"deliver-timeout-ms", required_argument, NULL, 'D'},
    {"payload-stripes", required_argument, NULL, OPT_STRIPES},
    {"python-dataset", required_argument, NULL, OPT_PY_DATASET},
    {"python-workers", required_argument, NULL, OPT_PY_WORKERS},
    {"python", required_argument, NULL, OPT_PY_EXE},
    {"python-path", required_argument, NULL, OPT_PY_PATH},
    {"python-job-timeout-ms", required_argument, NULL, OPT_PY_TIMEOUT},
    {"python-seed", required_argument, NULL, OPT_PY_SEED},
    {"python-unlink", no_argument, NULL, OPT_PY_UNLINK},
    {"python-forkserver", required_argument, NULL, OPT_PY_FORKSERVER},
    {"remove-at-exit", required_argument, NULL, OPT_REMOVE},
    {"cache-dir", required_argument, NULL, OPT_CACHE_DIR},
    {"cache-bytes", required_argument, NULL, OPT_CACHE_BYTES},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* --python-* options (Python-dataset mode). */
static int parse_python_opt(struct args *a, int c)
{
    int64_t v = 0;
    int r = 0;

    switch (c) {
    case OPT_PY_DATASET:
        a->o.python_dataset = optarg;
        return 0;
    case OPT_PY_EXE:
        a->o.python = optarg;
        return 0;
    case OPT_PY_PATH:
        a->o.python_path = optarg;
        return 0;
    case OPT_PY_UNLINK:
        a->o.python_unlink = 1;
        return 0;
    case OPT_PY_FORKSERVER:
        a->o.python_forkserver = optarg;
        return 0;
    case OPT_REMOVE:
        return dh_cli_remove_add(&a->remove, CMD, optarg);
    case OPT_CACHE_DIR:
        return dh_cli_opt_cache_dir(CMD, optarg);
    case OPT_CACHE_BYTES:
        return dh_cli_opt_cache_bytes(CMD, optarg);
    case OPT_PY_WORKERS:
        if (!(r = dh_cli_opt_i64(CMD, "--python-workers", optarg, 1, 64, &v)))
            a->o.python_workers = (unsigned)v;
        return r;
    case OPT_PY_TIMEOUT:
        if (!(r = dh_cli_opt_i64(CMD, "--python-job-timeout-ms", optarg, 1,
                                 INT32_MAX, &v)))
            a->o.python_job_timeout_ms = (int)v;
        return r;
    case OPT_PY_SEED:
        if (!(r = dh_cli_opt_i64(CMD, "--python-seed", optarg, 0, INT64_MAX,
                                 &v)))
            a->o.python_seed = (uint64_t)v;
        return r;
    default:
        return dh_cli_usage_error(CMD, "bad option");
    }
}

static int parse_opt(void *ctx, int c)
{
    struct args *a = ctx;
    int64_t v = 0;
    int r = 0;

    switch (c) {
    case 'c':
        a->o.coordinator = optarg;
        return 0;
    case 'i':
        a->o.index_path = optarg;
        return 0;
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
        if (!(r = dh_cli_opt_i64(CMD, "--server-id", optarg, 1, UINT32_MAX - 1,
                                 &v)))
            a->o.server_id = (uint32_t)v;
        return r;
    case 'a':
        if (!(r = dh_cli_opt_i64(CMD, "--arena-mb", optarg, 1, 1 << 20, &v)))
            a->o.arena_bytes = (size_t)v << 20;
        return r;
    case OPT_STRIPES:
        if (!(r = dh_cli_opt_i64(CMD, "--payload-stripes", optarg, 1, 8, &v)))
            a->o.payload_stripes = (unsigned)v;
        return r;
    case 'D':
        if (!(r = dh_cli_opt_i64(CMD, "--deliver-timeout-ms", optarg, 1,
                                 3600000, &v)))
            a->o.deliver_timeout_ms = (int)v;
        return r;
    case 'l':
        a->o.listen = optarg;
        return 0;
    case 'A':
        a->o.advertise = optarg;
        return 0;
    case 'K':
        a->o.keyfile = optarg;
        return 0;
    case 'I':
        a->o.insecure = 1;
        return 0;
    case 'W':
        if (!(r = dh_cli_opt_i64(CMD, "--sample-timeout-ms", optarg, 0,
                                 86400000, &v)))
            a->o.sample_timeout_ms = (int)v;
        return r;
    case 'b':
        if (!(r = dh_cli_opt_i64(CMD, "--heartbeat-ms", optarg, 1, 3600000,
                                 &v)))
            a->o.heartbeat_ms = (int)v;
        return r;
    case 'S':
        a->o.client_socket = optarg;
        return 0;
    case 'F':
        if (!(r = dh_cli_opt_i64(CMD, "--client-fd", optarg, 3, 1 << 20, &v)))
            a->o.client_fd = (int)v;
        return r;
    case OPT_CLIENT_PID:
        if (!(r = dh_cli_opt_i64(CMD, "--client-pid", optarg, 1, INT32_MAX,
                                 &v)))
            a->o.client_pid = (int)v;
        return r;
    case 'R':
        a->o.remote = 1;
        return 0;
    default:
        return parse_python_opt(a, c);
    }
}

/* Options of a local server only. */
static int check_remote(const struct args *a)
{
    if (a->have_rank)
        return dh_cli_usage_error(CMD,
                                  "--remote and --rank exclude each "
                                  "other: a remote server serves any rank");
    if (a->o.listen || a->o.client_fd >= 0 || a->o.client_socket)
        return dh_cli_usage_error(CMD, "--remote takes no --listen or "
                                       "client link: it sends batches to the "
                                       "ranks' local servers");
    return 0;
}

DH_CLI_CMD(CMD, ":h", long_opts, parse_opt, 0, usage);

/* The rank's token comes in the environment of a server its client
 * started (never on the command line, which other users can read); it is
 * copied and removed, so the server's own children do not inherit it.
 * Without it the server draws one and hands it to its client. */
static int take_token(struct args *a)
{
    const char *t = getenv(DH_RANK_TOKEN_ENV);

    if (!t)
        return DH_CLI_RUN;
    if (a->o.remote || strlen(t) >= sizeof(a->token)) {
        unsetenv(DH_RANK_TOKEN_ENV);
        return a->o.remote ? DH_CLI_RUN
                           : dh_cli_usage_error(CMD, DH_RANK_TOKEN_ENV
                                                " is not a rank token");
    }
    snprintf(a->token, sizeof(a->token), "%s", t);
    unsetenv(DH_RANK_TOKEN_ENV);
    a->o.token = a->token;
    return DH_CLI_RUN;
}

static int parse_args(struct args *a, int argc, char **argv)
{
    int r;

    dh_dataserver_opts_default(&a->o);
    if ((r = dh_cli_getopt(&cli_cmd, argc, argv, a, NULL)) != DH_CLI_RUN)
        return r;
    if (!a->o.coordinator || !a->o.index_path ||
        (!a->have_rank && !a->o.remote))
        return dh_cli_usage_error(CMD, "--coordinator, --index and --rank "
                                       "(or --remote) are required");
    if (a->o.client_fd >= 0 && a->o.client_socket)
        return dh_cli_usage_error(CMD, "--client-socket and --client-fd "
                                       "exclude each other");
    if (a->o.advertise && !a->o.listen)
        return dh_cli_usage_error(CMD, "--advertise needs --listen");
    if (a->o.client_pid && !a->o.client_socket)
        return dh_cli_usage_error(CMD, "--client-pid needs --client-socket");
    if (a->o.python_dataset && a->o.client_fd < 0)
        return dh_cli_usage_error(CMD, "--python-dataset needs --client-fd: "
                                       "a dataset is accepted only from the "
                                       "client that started this server");
    if (a->o.python_dataset && a->o.listen)
        return dh_cli_usage_error(CMD, "--python-dataset excludes --listen: "
                                       "a Python-dataset server takes "
                                       "batches only from its own workers, "
                                       "never payloads from the network");
    if (a->o.python_forkserver && !a->o.python_dataset)
        return dh_cli_usage_error(CMD, "--python-forkserver needs "
                                       "--python-dataset");
    if (a->o.remote && (r = check_remote(a)) != 0)
        return r;
    return take_token(a);
}

static void announce(const struct args *a, const struct dh_dataserver *s)
{
    const char *ep = dh_dataserver_endpoint(s);

    if (a->o.remote)
        dh__log(DH_LOG_INFO,
                "dataserver: remote server %u registered "
                "with %s (%u workers, %zu MiB staging)",
                dh_dataserver_id(s), a->o.coordinator, a->o.workers,
                a->o.arena_bytes >> 20);
    else /* a Python-dataset server's workers are its Python processes */
        dh__log(DH_LOG_INFO,
                "dataserver: rank %u (server %u) "
                "registered with %s (%u %sworkers, %zu MiB arena%s%s)",
                a->o.rank, dh_dataserver_id(s), a->o.coordinator,
                a->o.python_dataset ? a->o.python_workers : a->o.workers,
                a->o.python_dataset ? "Python " : "", a->o.arena_bytes >> 20,
                ep ? ", payloads on " : "", ep ? ep : "");
}

/* What crossed hosts, on the way out (docs/dataserver.md "Striped
 * payloads"): a remote's batches sent, a local's taken. */
static void summary(const struct args *a, const struct dh_dataserver *s)
{
    struct dh_dataserver_stats st;

    dh_dataserver_stats(s, &st);
    if (a->o.remote)
        fprintf(stderr,
                "datahelix: dataserver: remote server %u forwarded %llu "
                "batches (%llu bytes; %llu payload parts)\n",
                dh_dataserver_id(s), (unsigned long long)st.forwarded,
                (unsigned long long)st.forwarded_bytes,
                (unsigned long long)st.parts_out);
    else if (dh_dataserver_endpoint(s))
        fprintf(stderr,
                "datahelix: dataserver: rank %u (server %u) took %llu "
                "payloads from remote servers (%llu bytes; %llu payload "
                "parts), %llu malformed messages\n",
                a->o.rank, dh_dataserver_id(s), (unsigned long long)st.payloads,
                (unsigned long long)st.cross_ds_bytes,
                (unsigned long long)st.parts_in,
                (unsigned long long)st.malformed);
}

static int serve(struct args *a)
{
    struct dh_dataserver *s = NULL;
    struct dh_err e;
    int rc;

    const volatile int *stop = dh_cli_stop_on_signals();

    dh_err_clear(&e);
    if ((rc = dh_dataserver_create(&a->o, &s, &e)) == 0) {
        announce(a, s);
        rc = dh_dataserver_run(s, stop, &e);
        summary(a, s);
    }
    if (rc < 0)
        dh_cli_error(CMD, "%s", e.msg[0] ? e.msg : dh_strerror(rc));
    dh_dataserver_destroy(s);
    /* a clean end only (its client went away, or it was told to stop):
     * a crashed one is started again by its client, which needs the key */
    if (rc >= 0)
        dh_cli_remove_run(&a->remove);
    return rc < 0 ? DH_EXIT_FAIL : DH_EXIT_OK;
}

int dh_cmd_dataserver(int argc, char **argv)
{
    struct args a;
    int r;

    memset(&a, 0, sizeof(a));
    if ((r = parse_args(&a, argc, argv)) != DH_CLI_RUN)
        return r;
    dh_cli_ignore_sigpipe();
    return serve(&a);
}
