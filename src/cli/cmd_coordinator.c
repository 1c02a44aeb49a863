/*
 * cmd_coordinator.c - `datahelix coordinator`: runs the control plane
 * (src/include/datahelix/coordinator.h) until SIGINT / SIGTERM or a Shutdown
 * message, then exits 0.
 *
 * Design: a thin shell over dh_coordinator_create/run/destroy.  The
 * signal handlers only set a flag (sigaction without SA_RESTART, so the
 * loop's poll returns EINTR and sees it at once).
 * Locking: single-threaded.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "cli/cli.h"
#include "datahelix/coordinator.h"
#include "runtime/keys.h"
#include "runtime/metrics_http.h"

#define CMD "coordinator"

struct args {
    struct dh_coordinator_opts o;
    const char *telemetry_path;
    int with_parent;
    const char *metrics_listen, *metrics_token_file;
    int metrics_interval_ms;
    struct dh_cli_remove remove;
};

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: datahelix coordinator [--listen ADDR] [--policy P]\n"
        "                             [--cpu-pools on|off]\n"
        "                             [--keyfile FILE] [--insecure]\n"
        "                             [--heartbeat-timeout-ms N] [--overdue-ms N]\n"
        "                             [--local-silence-ms N]\n"
        "                             [--telemetry FILE] [--exit-with-parent]\n"
        "                             [--exit-when-unused MS]\n"
        "                             [--metrics-listen HOST:PORT]\n"
        "                             [--metrics-token-file FILE]\n"
        "                             [--metrics-interval-ms N]\n\n"
        "Runs the control plane: registers clients and DataServers, places\n"
        "every descriptor request and forwards it to the chosen DataServer,\n"
        "re-routes the tasks of a DataServer that stops heartbeating.\n"
        "Runs until SIGINT / SIGTERM or a Shutdown message (exit 0).\n\n"
        "  --listen ADDR              ZeroMQ endpoint to bind (default %s)\n"
        "  --policy P                 round-robin, least-request (default)\n"
        "                             or deadline\n"
        "  --cpu-pools on|off         deadline policy: the local DataServers\n"
        "                             of a host that share CPUs run as many\n"
        "                             tasks at once as the CPUs can, the\n"
        "                             earliest due first (default on;\n"
        "                             docs/placement.md \"CPU pools\")\n"
        "  --heartbeat-timeout-ms N   silence after which a DataServer is\n"
        "                             declared dead (default 3000)\n"
        "  --local-silence-ms N       with a key: a rank's local DataServer\n"
        "                             is declared dead when its connection\n"
        "                             closes (its process ended), or after N\n"
        "                             ms of silence (a hung process; default\n"
        "                             10x the heartbeat timeout, >= 30000)\n"
        "  --overdue-ms N             a task on a live remote DataServer\n"
        "                             with no answer after N ms, and past\n"
        "                             4x its predicted time or its deadline,\n"
        "                             goes to its rank's local DataServer\n"
        "                             (default 5000)\n"
        "  --telemetry FILE           one JSON line per placement decision\n"
        "  --exit-with-parent         stop (cleanly) when the process that\n"
        "                             started this one dies\n"
        "  --remove-at-exit DIR       on a clean end, remove DIR if it is a\n"
        "                             datahelix-* folder of this user, mode\n"
        "                             0700 (a loader's key or socket folder;\n"
        "                             up to 4 times)\n"
        "  --exit-when-unused MS      stop once no local DataServer has been\n"
        "                             registered for MS ms (after the first\n"
        "                             one): the ranks of the job are gone\n"
        "  --keyfile FILE             the job key (datahelix keygen FILE;\n"
        "                             default $DATAHELIX_KEYFILE): every peer\n"
        "                             must hold it (CURVE, docs/security.md)\n"
        "  --insecure                 allow --listen on a non-loopback address\n"
        "                             without a key (warns: anyone who can\n"
        "                             reach it owns the job), and\n"
        "                             --metrics-listen without a token\n"
        "  --metrics-listen HOST:PORT serve Prometheus metrics over HTTP at\n"
        "                             /metrics (e.g. %s; docs/metrics.md);\n"
        "                             beyond loopback only with a token\n"
        "  --metrics-token-file FILE  require 'Authorization: Bearer TOKEN',\n"
        "                             the first line of FILE (mode 0600)\n"
        "  --metrics-interval-ms N    publish the figures at most every N ms\n"
        "                             (default 500; 1..60000)\n"
        "  -h, --help                 this text\n",
        DH_COORDINATOR_DEFAULT_LISTEN, DH_MHTTP_DEFAULT_LISTEN);
}

static const struct option long_opts[] = {
    {"listen", required_argument, NULL, 'l'},
    {"policy", required_argument, NULL, 'p'},
    {"cpu-pools", required_argument, NULL, 'C'},
    {"heartbeat-timeout-ms", required_argument, NULL, 't'},
    {"overdue-ms", required_argument, NULL, 'o'},
    {"local-silence-ms", required_argument, NULL, 'S'},
    {"telemetry", required_argument, NULL, 'T'},
    {"exit-with-parent", no_argument, NULL, 'P'},
    {"remove-at-exit", required_argument, NULL, 'X'},
    {"exit-when-unused", required_argument, NULL, 'U'},
    {"keyfile", required_argument, NULL, 'K'},
    {"insecure", no_argument, NULL, 'I'},
    {"metrics-listen", required_argument, NULL, 'M'},
    {"metrics-token-file", required_argument, NULL, 'k'},
    {"metrics-interval-ms", required_argument, NULL, 'i'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int parse_opt(void *ctx, int c)
{
    struct args *a = ctx;
    int64_t v = 0;

    switch (c) {
    case 'l':
        a->o.listen = optarg;
        return 0;
    case 'p':
        if (strcmp(optarg, "round-robin") && strcmp(optarg, "least-request") &&
            strcmp(optarg, "deadline"))
            return dh_cli_usage_error(CMD,
                                      "--policy must be round-robin, "
                                      "least-request or deadline, not '%s'",
                                      optarg);
        a->o.policy = optarg;
        return 0;
    case 'C':
        if (strcmp(optarg, "on") && strcmp(optarg, "off"))
            return dh_cli_usage_error(CMD,
                                      "--cpu-pools must be on or off, "
                                      "not '%s'",
                                      optarg);
        a->o.cpu_pools = !strcmp(optarg, "on");
        return 0;
    case 't':
        if (dh_cli_parse_i64(optarg, 1, 3600000, &v))
            return dh_cli_usage_error(CMD,
                                      "--heartbeat-timeout-ms must be "
                                      "an integer in [1, 3600000], not '%s'",
                                      optarg);
        a->o.heartbeat_timeout_ms = (int)v;
        return 0;
    case 'o':
        if (dh_cli_parse_i64(optarg, 1, 3600000, &v))
            return dh_cli_usage_error(CMD,
                                      "--overdue-ms must be an integer in "
                                      "[1, 3600000], not '%s'",
                                      optarg);
        a->o.overdue_ms = (int)v;
        return 0;
    case 'S':
        if (dh_cli_parse_i64(optarg, 1, 36000000, &v))
            return dh_cli_usage_error(CMD,
                                      "--local-silence-ms must be an integer "
                                      "in [1, 36000000], not '%s'",
                                      optarg);
        a->o.local_silence_ms = (int)v;
        return 0;
    case 'T':
        a->telemetry_path = optarg;
        return 0;
    case 'X':
        return dh_cli_remove_add(&a->remove, CMD, optarg);
    case 'P':
        a->with_parent = 1;
        return 0;
    case 'K':
        a->o.keyfile = optarg;
        return 0;
    case 'I':
        a->o.insecure = 1;
        return 0;
    case 'M':
        a->metrics_listen = optarg;
        return 0;
    case 'k':
        a->metrics_token_file = optarg;
        return 0;
    case 'i':
        if (dh_cli_parse_i64(optarg, 1, 60000, &v))
            return dh_cli_usage_error(CMD,
                                      "--metrics-interval-ms must be an "
                                      "integer in [1, 60000], not '%s'",
                                      optarg);
        a->metrics_interval_ms = (int)v;
        return 0;
    case 'U':
        if (dh_cli_parse_i64(optarg, 1, 3600000, &v))
            return dh_cli_usage_error(CMD,
                                      "--exit-when-unused must be an "
                                      "integer in [1, 3600000] ms, not '%s'",
                                      optarg);
        a->o.exit_when_unused_ms = (int)v;
        return 0;
    default:
        return dh_cli_usage_error(CMD, "bad option");
    }
}

DH_CLI_CMD(CMD, ":h", long_opts, parse_opt, 0, usage);

static int parse_args(struct args *a, int argc, char **argv)
{
    int r;

    dh_coordinator_opts_default(&a->o);
    if ((r = dh_cli_getopt(&cli_cmd, argc, argv, a, NULL)) != DH_CLI_RUN)
        return r;
    if ((a->metrics_token_file || a->metrics_interval_ms) && !a->metrics_listen)
        return dh_cli_usage_error(CMD, "--metrics-token-file and "
                                       "--metrics-interval-ms need "
                                       "--metrics-listen");
    if (a->metrics_listen)
        a->o.metrics_interval_ms = a->metrics_interval_ms
                                       ? a->metrics_interval_ms
                                       : 500;
    return DH_CLI_RUN;
}

/* What peers were refused, on one line at exit: the counters behind the
 * rate-limited refusal log (docs/wire-protocol.md "Authorization"). */
static void report(const struct dh_coordinator *c)
{
    struct dh_coordinator_stats st;

    dh_coordinator_stats(c, &st);
    dh__log(DH_LOG_INFO,
            "coordinator: stopped: %llu requests, %llu results; "
            "refused %llu, rate-limited %llu, malformed %llu, capped %llu, "
            "expired %llu",
            (unsigned long long)st.requests, (unsigned long long)st.results,
            (unsigned long long)st.refused, (unsigned long long)st.rate_limited,
            (unsigned long long)st.malformed, (unsigned long long)st.capped,
            (unsigned long long)st.expired);
}

static int render(void *ctx, char **out, size_t *len)
{
    return dh_coordinator_metrics_text(ctx, out, len);
}

/* The metrics endpoint (docs/metrics.md): its own thread, reading what
 * the Coordinator's loop publishes. */
static int start_metrics(const struct args *a, struct dh_coordinator *c,
                         struct dh_mhttp **out, struct dh_err *e)
{
    char token[DH_MHTTP_TOKEN_MAX + 1];
    struct dh_mhttp_opts mo = {.listen = a->metrics_listen,
                               .insecure = a->o.insecure,
                               .render = render,
                               .ctx = c};
    int rc;

    if (!a->metrics_listen)
        return 0;
    if (a->metrics_token_file) {
        if ((rc = dh__mhttp_load_token(a->metrics_token_file, token,
                                       sizeof(token), e)) < 0)
            return rc;
        mo.token = token;
    }
    rc = dh__mhttp_start(&mo, out, e);
    memset(token, 0, sizeof(token));
    if (rc == 0)
        fprintf(stderr,
                "datahelix: coordinator: metrics on http://%s/metrics "
                "(%s)\n",
                dh__mhttp_addr(*out),
                a->metrics_token_file ? "bearer token" : "no token");
    return rc;
}

static int serve(struct args *a)
{
    struct dh_coordinator *c = NULL;
    struct dh_mhttp *mh = NULL;
    struct dh_err e;
    FILE *tel = NULL;
    int rc;

    if (a->telemetry_path && !(tel = fopen(a->telemetry_path, "w"))) {
        dh_cli_error(CMD, "cannot open %s: %s", a->telemetry_path,
                     strerror(errno));
        return DH_EXIT_FAIL;
    }
    a->o.telemetry = tel;
    const volatile int *stop = dh_cli_stop_on_signals();

    if (a->with_parent && dh_cli_stop_with_parent() < 0) {
        dh_cli_error(CMD, "cannot watch the parent process");
        if (tel)
            fclose(tel);
        return DH_EXIT_FAIL;
    }

    dh_err_clear(&e);
    if ((rc = dh_coordinator_create(&a->o, &c, &e)) == 0 &&
        (rc = start_metrics(a, c, &mh, &e)) == 0) {
        dh__log(DH_LOG_INFO,
                "coordinator: listening on %s (policy "
                "%s, %s)",
                dh_coordinator_endpoint(c),
                a->o.policy ? a->o.policy : "least-request",
                dh__keys_path(a->o.keyfile) ? "CURVE: the job key only"
                                            : "no key");
        rc = dh_coordinator_run(c, stop, &e);
        report(c);
    }
    if (rc < 0)
        dh_cli_error(CMD, "%s", e.msg[0] ? e.msg : dh_strerror(rc));
    dh__mhttp_stop(mh); /* before the Coordinator it reads */
    dh_coordinator_destroy(c);
    if (tel)
        fclose(tel);
    /* a clean end only: after a failure its loader starts it again, and
     * the new one needs the key */
    if (rc >= 0)
        dh_cli_remove_run(&a->remove);
    return rc < 0 ? DH_EXIT_FAIL : DH_EXIT_OK;
}

int dh_cmd_coordinator(int argc, char **argv)
{
    struct args a;
    int r;

    memset(&a, 0, sizeof(a));
    if ((r = parse_args(&a, argc, argv)) != DH_CLI_RUN)
        return r;
    dh_cli_ignore_sigpipe();
    return serve(&a);
}
