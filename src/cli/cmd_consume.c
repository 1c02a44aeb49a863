/*
 * cmd_consume.c - `datahelix consume`: a C consumer that iterates like a
 * training rank (what `-f null` is to ffmpeg): plans each epoch with the
 * Tier-1 planner, takes this rank's steps through the client library
 * (include/datahelix/client.h), optionally holds each batch for a GPU
 * window, writes the sample ids it received, and prints per-step input
 * wait and a summary.
 *
 * Design: a thin shell over dh_plan_* and dh_client_*; next() is called in
 * 100 ms slices so SIGINT / SIGTERM end the run promptly and cleanly (the
 * client stops its embedded DataServer).
 * Locking: single-threaded (the client's I/O thread lives in the library).
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "core/alloc.h"
#include "datahelix/client.h"
#include "datahelix/index.h"
#include "datahelix/plan.h"

#define CMD "consume"
#define SLICE_MS 100
/* Spares sent with each request under --on-error skip (spare.h). */
#define SKIP_SPARES 4

struct args {
    struct dh_client_opts o;
    const char *manifest, *ids_out, *telemetry_path;
    uint32_t batch, epochs;
    int64_t window_ms, max_steps;
    uint64_t seed;
    int balance, json, skip, have_rank, have_world;
    int copy; /* --transport copy: each batch copied out (ablation base) */
};

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: datahelix consume --coordinator ADDR --manifest M.dhx "
        "--rank R\n"
        "                         --world-size W --batch-size B [options]\n\n"
        "Iterates like training rank R: plans every epoch (the same plan on\n"
        "every rank), requests this rank's batches ahead through the\n"
        "Coordinator, receives them from its local DataServer's shared-\n"
        "memory arena in step order, and prints per-step input wait and a\n"
        "summary.\n\n"
        "  --coordinator ADDR   ZeroMQ endpoint of the Coordinator\n"
        "  --manifest M.dhx     the index (datahelix index M.jsonl -o M.dhx)\n"
        "  --rank R, --world-size W, --batch-size B\n"
        "  --epochs E           epochs to run (default 1)\n"
        "  --steps N            stop each epoch after N steps (default all)\n"
        "  --prefetch K         steps requested ahead (default 4)\n"
        "  --microbatches M     requests per step (default 1)\n"
        "  --window-ms MS       hold each batch MS ms, as a GPU step would\n"
        "  --step-deadline-ms MS  a step's period, fixed (default: the\n"
        "                       measured one); requests carry k x MS as\n"
        "                       slack for the deadline policy\n"
        "  --ddl-ms MS          a step is a DDL miss when its input wait\n"
        "                       exceeds MS (default 1)\n"
        "  --frames N           frames per sample (default 16)\n"
        "  --size WxH           output size (default 224x224)\n"
        "  --seed S             plan seed (default 0)\n"
        "  --balance B          fixed (default), free or none\n"
        "  --dataserver NAME    attach to a running local DataServer's\n"
        "                       socket @NAME (default: start one)\n"
        "  --workers N          decode threads of the started one (def. 2)\n"
        "  --listen ADDR        where the started one takes payloads from\n"
        "                       remote DataServers (default: none, local\n"
        "                       decoding only)\n"
        "  --keyfile FILE       the job key (datahelix keygen FILE; default\n"
        "                       $DATAHELIX_KEYFILE): CURVE to the\n"
        "                       Coordinator; the started DataServer gets it\n"
        "  --insecure           the started DataServer may --listen on a\n"
        "                       non-loopback address without a key (warns)\n"
        "  --start-timeout-ms MS  bound on registering and starting the\n"
        "                       local DataServer (default 15000)\n"
        "  --max-restarts N     restarts of a local DataServer that died\n"
        "                       (default 3; at most 62)\n"
        "  --timeout-ms MS      bound on waiting for one batch (def. 60000)\n"
        "  --on-error P         raise (default: stop at the first failed\n"
        "                       sample) or skip (a failed sample is replaced\n"
        "                       by a spare of this rank's plan, so every\n"
        "                       step keeps its size; a step whose spares\n"
        "                       all fail is counted and left out)\n"
        "  --ids-out FILE       write the sample ids received (the delivered\n"
        "                       ones: substitutes included), one per line\n"
        "  --telemetry FILE     JSONL, one record per step (DESIGN 4.4)\n"
        "  --trace FILE         Chrome trace-event JSON of the run (open it\n"
        "                       in Perfetto; docs/trace.md): steps, waits,\n"
        "                       each task's stages per server, and the\n"
        "                       cause of every late step\n"
        "  --json               per-step lines and the summary as JSON\n"
        "  --transport T        shm (default: the batch is a view of the\n"
        "                       arena) or copy (copied out first, as a pool\n"
        "                       that sends tensors by value would)\n"
        "  --ablation A         the paper's ladder as presets: base (copy,\n"
        "                       no prefetch, random split), transport (+\n"
        "                       zero copy), prefetch (+ prefetch 4, token\n"
        "                       balance), ddl (the same here; run the\n"
        "                       Coordinator with --policy deadline)\n"
        "  -h, --help           this text\n\n"
        "The DataServer is `datahelix` from $DATAHELIX_BIN, else this\n"
        "program.  Exit 0 when every epoch is done; 1 on an error.\n");
}

static const struct option long_opts[] = {
    {"coordinator", required_argument, NULL, 'c'},
    {"manifest", required_argument, NULL, 'm'},
    {"rank", required_argument, NULL, 'r'},
    {"world-size", required_argument, NULL, 'W'},
    {"batch-size", required_argument, NULL, 'B'},
    {"epochs", required_argument, NULL, 'E'},
    {"steps", required_argument, NULL, 'n'},
    {"prefetch", required_argument, NULL, 'k'},
    {"microbatches", required_argument, NULL, 'M'},
    {"window-ms", required_argument, NULL, 'w'},
    {"frames", required_argument, NULL, 'f'},
    {"size", required_argument, NULL, 's'},
    {"seed", required_argument, NULL, 'S'},
    {"balance", required_argument, NULL, 'b'},
    {"dataserver", required_argument, NULL, 'd'},
    {"workers", required_argument, NULL, 'j'},
    {"listen", required_argument, NULL, 'L'},
    {"keyfile", required_argument, NULL, 'K'},
    {"insecure", no_argument, NULL, 'I'},
    {"start-timeout-ms", required_argument, NULL, 'X'},
    {"max-restarts", required_argument, NULL, 'R'},
    {"timeout-ms", required_argument, NULL, 't'},
    {"on-error", required_argument, NULL, 'e'},
    {"ids-out", required_argument, NULL, 'i'},
    {"telemetry", required_argument, NULL, 'T'},
    {"trace", required_argument, NULL, 'Z'},
    {"json", no_argument, NULL, 'J'},
    {"transport", required_argument, NULL, 'x'},
    {"ddl-ms", required_argument, NULL, 'D'},
    {"step-deadline-ms", required_argument, NULL, 'P'},
    {"ablation", required_argument, NULL, 'A'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int opt_u32(const char *name, const char *s, int64_t lo, int64_t hi,
                   uint32_t *out)
{
    int64_t v = 0;
    int r = dh_cli_opt_i64(CMD, name, s, lo, hi, &v);

    if (!r)
        *out = (uint32_t)v;
    return r;
}

/* The paper's ablation ladder (Table 3) as presets; the placement policy
 * of each rung is the Coordinator's (--policy there). */
static int ablation(struct args *a, const char *s)
{
    if (!strcmp(s, "base")) {
        a->copy = 1, a->o.prefetch = 1, a->balance = DH_BALANCE_NONE;
    } else if (!strcmp(s, "transport")) {
        a->copy = 0, a->o.prefetch = 1, a->balance = DH_BALANCE_NONE;
    } else if (!strcmp(s, "prefetch") || !strcmp(s, "ddl")) {
        a->copy = 0, a->o.prefetch = 4, a->balance = DH_BALANCE_FIXED;
    } else {
        return dh_cli_usage_error(CMD,
                                  "--ablation '%s': expected base, "
                                  "transport, prefetch or ddl",
                                  s);
    }
    return 0;
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
    case 'm':
        a->manifest = optarg;
        return 0;
    case 'r':
        a->have_rank = 1;
        return opt_u32("--rank", optarg, 0, 65535, &a->o.rank);
    case 'W':
        a->have_world = 1;
        return opt_u32("--world-size", optarg, 1, 65536, &a->o.world_size);
    case 'B':
        return opt_u32("--batch-size", optarg, 1, 65536, &a->batch);
    case 'E':
        return opt_u32("--epochs", optarg, 1, 65535, &a->epochs);
    case 'n':
        return dh_cli_opt_i64(CMD, "--steps", optarg, 1, 1 << 24,
                              &a->max_steps);
    case 'k':
        return opt_u32("--prefetch", optarg, 1, DH_CLIENT_MAX_PREFETCH,
                       &a->o.prefetch);
    case 'M':
        return opt_u32("--microbatches", optarg, 1, DH_CLIENT_MAX_MICROBATCHES,
                       &a->o.microbatches);
    case 'w':
        return dh_cli_opt_i64(CMD, "--window-ms", optarg, 0, 3600000,
                              &a->window_ms);
    case 'f':
        if (!(r = dh_cli_opt_i64(CMD, "--frames", optarg, 1, 4096, &v)))
            a->o.plan.frames = v;
        return r;
    case 's':
        return dh_cli_opt_size(CMD, optarg, &a->o.plan);
    case 'S':
        if (!(r = dh_cli_opt_i64(CMD, "--seed", optarg, 0, INT64_MAX, &v)))
            a->seed = (uint64_t)v;
        return r;
    case 'b':
        if (!strcmp(optarg, "fixed"))
            a->balance = DH_BALANCE_FIXED;
        else if (!strcmp(optarg, "free"))
            a->balance = DH_BALANCE_FREE;
        else if (!strcmp(optarg, "none"))
            a->balance = DH_BALANCE_NONE;
        else
            return dh_cli_usage_error(CMD,
                                      "--balance '%s': expected fixed, "
                                      "free or none",
                                      optarg);
        return 0;
    case 'd':
        a->o.dataserver = optarg;
        return 0;
    case 'j':
        return opt_u32("--workers", optarg, 1, 256, &a->o.ds_workers);
    case 'L':
        a->o.ds_listen = optarg;
        return 0;
    case 'K':
        a->o.keyfile = optarg;
        return 0;
    case 'I': { /* for the DataServer this command starts */
        static const char *const insecure[] = {"--insecure", NULL};

        a->o.ds_args = insecure;
        return 0;
    }
    case 'X':
        if (!(r = dh_cli_opt_i64(CMD, "--start-timeout-ms", optarg, 1, 3600000,
                                 &v)))
            a->o.start_timeout_ms = (int)v;
        return r;
    case 'R':
        /* CL_MAX_ARENAS (64) holds the first server and its restarts. */
        if (!(r = dh_cli_opt_i64(CMD, "--max-restarts", optarg, 0, 62, &v)))
            a->o.max_restarts = (int)v;
        return r;
    case 't':
        if (!(r = dh_cli_opt_i64(CMD, "--timeout-ms", optarg, 1, 86400000, &v)))
            a->o.timeout_ms = (int)v;
        return r;
    case 'e':
        if (!strcmp(optarg, "raise"))
            a->skip = 0;
        else if (!strcmp(optarg, "skip"))
            a->skip = 1, a->o.spares = SKIP_SPARES;
        else
            return dh_cli_usage_error(CMD,
                                      "--on-error '%s': expected raise "
                                      "or skip",
                                      optarg);
        return 0;
    case 'i':
        a->ids_out = optarg;
        return 0;
    case 'T':
        a->telemetry_path = optarg;
        return 0;
    case 'Z':
        a->o.trace = optarg;
        return 0;
    case 'J':
        a->json = 1;
        return 0;
    case 'x':
        if (!strcmp(optarg, "shm"))
            a->copy = 0;
        else if (!strcmp(optarg, "copy"))
            a->copy = 1;
        else
            return dh_cli_usage_error(CMD,
                                      "--transport '%s': expected shm "
                                      "or copy",
                                      optarg);
        return 0;
    case 'A':
        return ablation(a, optarg);
    case 'D':
        if (dh_cli_parse_double(optarg, 0, DH_CLIENT_MAX_STEP_MS, &a->o.ddl_ms))
            return dh_cli_usage_error(CMD,
                                      "--ddl-ms '%s': expected a "
                                      "number of ms in [0, 86400000]",
                                      optarg);
        return 0;
    case 'P':
        if (dh_cli_parse_double(optarg, 0, DH_CLIENT_MAX_STEP_MS,
                                &a->o.step_deadline_ms))
            return dh_cli_usage_error(CMD,
                                      "--step-deadline-ms '%s': "
                                      "expected a number of ms in [0, "
                                      "86400000]",
                                      optarg);
        return 0;
    default:
        return dh_cli_usage_error(CMD, "bad option");
    }
}

DH_CLI_CMD(CMD, ":h", long_opts, parse_opt, 0, usage);

static int parse_args(struct args *a, int argc, char **argv)
{
    int r;

    dh_client_opts_default(&a->o);
    a->epochs = 1;
    if ((r = dh_cli_getopt(&cli_cmd, argc, argv, a, NULL)) != DH_CLI_RUN)
        return r;
    if (!a->o.coordinator || !a->manifest || !a->have_rank || !a->have_world ||
        !a->batch)
        return dh_cli_usage_error(CMD, "--coordinator, --manifest, --rank, "
                                       "--world-size and --batch-size are "
                                       "required");
    if (a->o.rank >= a->o.world_size)
        return dh_cli_usage_error(CMD,
                                  "--rank %u: must be below --world-size "
                                  "%u",
                                  a->o.rank, a->o.world_size);
    if (a->batch < a->o.microbatches)
        return dh_cli_usage_error(CMD,
                                  "--batch-size %u is smaller than "
                                  "--microbatches %u",
                                  a->batch, a->o.microbatches);
    return DH_CLI_RUN;
}

/* This rank's schedule of one epoch, from the same plan every rank makes. */
static int schedule(const struct args *a, const struct dh_index *ix,
                    uint32_t epoch, struct dh_plan_schedule *out,
                    struct dh_err *e)
{
    struct dh_index_columns col;
    struct dh_plan_opts po;

    dh_index_columns(ix, &col);
    dh_plan_opts_init(&po);
    po.world_size = a->o.world_size;
    po.batch_size = a->batch;
    po.seed = a->seed;
    po.epoch = epoch;
    po.balance = a->balance;
    return dh_plan_schedule(
        col.est_tokens, col.profile, col.count, NULL, 0, &po, a->o.rank,
        a->max_steps > 0 ? (uint64_t)a->max_steps : 0, out, e);
}

struct run {
    const struct args *a;
    struct dh_client *c;
    FILE *ids;
    uint64_t samples, skipped;
    unsigned char copied; /* keeps the copy from being optimised away */
    const volatile int *stop;
};

static void hold_window(const struct run *r, const struct dh_client_batch *b)
{
    volatile uint8_t sink = 0;
    struct timespec ts;

    /* Touch one byte per page, as a copy to the GPU would read them. */
    for (uint32_t j = 0; j < b->n_parts; j++)
        for (uint64_t o = 0; o < b->parts[j].len; o += 4096)
            sink ^= ((const uint8_t *)b->parts[j].data)[o];
    (void)sink;
    if (r->a->window_ms <= 0)
        return;
    ts.tv_sec = (time_t)(r->a->window_ms / 1000);
    ts.tv_nsec = (long)(r->a->window_ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) != 0 && !*r->stop)
        ;
}

static void step_line(const struct run *r, const struct dh_client_batch *b)
{
    if (r->a->json)
        printf("{\"epoch\":%u,\"step\":%" PRIu64 ",\"samples\":%u,"
               "\"input_wait_ms\":%.3f}\n",
               b->epoch, b->step, b->n_samples, b->input_wait_ms);
    else
        printf("epoch %u step %" PRIu64 ": %u samples, input wait %.2f ms\n",
               b->epoch, b->step, b->n_samples, b->input_wait_ms);
    fflush(stdout); /* a watcher sees each step as it happens */
}

/* --transport copy: the batch leaves the arena by value (then the slot
 * goes back at once, as a pool's message buffer would). */
static int copy_out(struct run *r, const struct dh_client_batch *b)
{
    for (uint32_t j = 0; j < b->n_parts; j++) {
        void *p = malloc(b->parts[j].len);

        if (!p)
            return -1;
        memcpy(p, b->parts[j].data, b->parts[j].len);
        r->copied ^= ((const unsigned char *)p)[b->parts[j].len / 2];
        free(p);
    }
    return 0;
}

/* One step: 1 got a batch (or skipped a failed sample), 0 epoch done,
 * < 0 failed (e says why). */
static int one_step(struct run *r, struct dh_err *e)
{
    struct dh_client_batch *b = NULL;
    double t0 = dh_cli_now();
    int rc;

    /* DH_ETIMEOUT is a slice that ran out, and only that (a step that
     * failed is DH_ESAMPLE or DH_EARENA). */
    do {
        rc = dh_client_next_for(r->c, SLICE_MS, &b, e);
    } while (rc == DH_ETIMEOUT && !*r->stop &&
             (dh_cli_now() - t0) * 1e3 < (double)r->a->o.timeout_ms);
    if (rc == DH_EEMPTY)
        return 0;
    if (rc == DH_ETIMEOUT && *r->stop)
        return dh_err_set(e, DH_EIO, "interrupted");
    if (rc < 0) {
        /* A failed step is consumed; anything else is fatal. */
        if (r->a->skip && rc == DH_ESAMPLE) {
            fprintf(stderr, "datahelix: consume: skipped: %s\n", e->msg);
            r->skipped++;
            return 1;
        }
        return rc;
    }
    for (uint32_t i = 0; i < b->n_subs; i++)
        fprintf(stderr,
                "datahelix: consume: substituted: epoch %u step %" PRIu64
                " position %u: sample %" PRIu64 " failed (%s, code %d), "
                "sample %" PRIu64 " delivered\n",
                b->epoch, b->step, b->subs[i].position, b->subs[i].failed_id,
                dh_stage_name((enum dh_stage)b->subs[i].stage),
                b->subs[i].cause, b->subs[i].substitute_id);
    if (r->ids)
        for (uint32_t i = 0; i < b->n_samples; i++)
            fprintf(r->ids, "%" PRIu64 "\n", b->sample_ids[i]);
    r->samples += b->n_samples;
    step_line(r, b);
    if (r->a->copy && copy_out(r, b) < 0) {
        dh_client_batch_release(b);
        return dh_err_set(e, DH_ENOMEM,
                          "out of memory for --transport "
                          "copy");
    }
    hold_window(r, b);
    dh_client_batch_release(b);
    return 1;
}

static int run_epochs(struct run *r, const struct dh_index *ix,
                      struct dh_err *e)
{
    int rc = 0;

    for (uint32_t ep = 0; ep < r->a->epochs && !*r->stop; ep++) {
        struct dh_plan_schedule sc = {0};

        rc = schedule(r->a, ix, ep, &sc, e);
        if (rc == 0)
            rc = dh_client_start_epoch(r->c, ep, 0, sc.n_steps, sc.ids, sc.offs,
                                       e);
        dh_plan_schedule_free(&sc);
        while (rc == 0 && !*r->stop && (rc = one_step(r, e)) == 1)
            rc = 0;
        if (rc < 0)
            return rc;
        rc = 0;
    }
    if (*r->stop)
        return dh_err_set(e, DH_EIO, "interrupted");
    return rc;
}

/* Late steps by cause and the worst of them (docs/trace.md). */
static void late_summary(const struct run *r)
{
    static const char *const stages[] = {
        "queue", "alloc",  "read",     "decode", "scale",  "collate",
        "place", "notify", "transfer", "route",  "client", "unknown"};
    enum { NS = sizeof(stages) / sizeof(stages[0]) };
    struct dh_client_late *late = NULL, *worst = NULL;
    uint64_t total = 0, by[NS] = {0};
    size_t n = dh_client_late(r->c, NULL, 0, &total), got = 0;
    int first = 1;

    if (n && (late = malloc(n * sizeof(*late))))
        got = dh_client_late(r->c, late, n, NULL);
    for (size_t i = 0; i < got && i < n; i++) {
        for (size_t k = 0; k < NS; k++)
            if (!strcmp(late[i].stage, stages[k]))
                by[k]++;
        if (!worst || late[i].input_wait_ms > worst->input_wait_ms)
            worst = &late[i];
    }
    if (r->a->json) {
        printf(",\"late\":{\"steps\":%" PRIu64 ",\"kept\":%zu,"
               "\"by_stage\":{",
               total, got);
        for (size_t k = 0; k < NS; k++)
            if (by[k]) {
                printf("%s\"%s\":%" PRIu64, first ? "" : ",", stages[k], by[k]);
                first = 0;
            }
        printf("}");
        if (worst) {
            printf(",\"worst\":{\"step\":%" PRIu64 ",\"input_wait_ms\":%.3f,"
                   "\"stage\":\"%s\",\"stage_ms\":%.3f,\"server\":%u,"
                   "\"sample\":",
                   worst->step, worst->input_wait_ms, worst->stage,
                   worst->stage_ms, worst->server_id);
            if (worst->sample_id == DH_CLIENT_NO_SAMPLE)
                printf("null");
            else
                printf("%" PRIu64, worst->sample_id);
            printf("}");
        }
        printf("}");
    } else if (total) {
        printf("rank %u: %" PRIu64 " late steps by cause:", r->a->o.rank,
               total);
        for (size_t k = 0; k < NS; k++)
            if (by[k])
                printf(" %s %" PRIu64, stages[k], by[k]);
        if (worst) {
            printf("; worst: step %" PRIu64 " waited %.1f ms: %s %.1f ms",
                   worst->step, worst->input_wait_ms, worst->stage,
                   worst->stage_ms);
            if (worst->sample_id != DH_CLIENT_NO_SAMPLE)
                printf(" (sample %" PRIu64 ", %s)", worst->sample_id,
                       worst->path);
            printf(" on server %u", worst->server_id);
        }
        printf("\n");
    }
    free(late);
}

static void summary(const struct run *r)
{
    struct dh_client_stats st;
    double sps;

    dh_client_stats(r->c, &st);
    sps = st.elapsed_s > 0 ? (double)r->samples / st.elapsed_s : 0;
    if (r->a->json) {
        printf("{\"summary\":{\"rank\":%u,\"steps\":%" PRIu64 ",\"samples\":"
               "%" PRIu64 ",\"samples_per_s\":%.2f,\"input_wait_p50_ms\":%.3f,"
               "\"input_wait_p95_ms\":%.3f,\"input_wait_max_ms\":%.3f,"
               "\"misses\":%" PRIu64 ",\"errors\":%" PRIu64 ",\"skipped\":"
               "%" PRIu64 ",\"substituted\":%" PRIu64
               ",\"quarantined\":%" PRIu64 ",\"restarts\":%" PRIu64
               ",\"reissued\":%" PRIu64 ",\"coordinator_restarts\":%" PRIu64
               ",\"elapsed_s\":%.3f",
               r->a->o.rank, st.steps, r->samples, sps, st.input_wait_p50_ms,
               st.input_wait_p95_ms, st.input_wait_max_ms, st.misses, st.errors,
               r->skipped, st.substituted, st.quarantined, st.restarts,
               st.reissued, st.coordinator_restarts, st.elapsed_s);
        late_summary(r);
        printf("}}\n");
        return;
    }
    printf("rank %u: %" PRIu64 " steps, %" PRIu64 " samples in %.2f s = "
           "%.1f samples/s; input wait p50 %.2f ms, p95 %.2f ms, max %.2f ms;"
           " %" PRIu64 " misses, %" PRIu64 " errors (%" PRIu64 " skipped), "
           "%" PRIu64 " substituted, %" PRIu64 " server restarts\n",
           r->a->o.rank, st.steps, r->samples, st.elapsed_s, sps,
           st.input_wait_p50_ms, st.input_wait_p95_ms, st.input_wait_max_ms,
           st.misses, st.errors, r->skipped, st.substituted, st.restarts);
    late_summary(r);
}

static int consume(struct args *a)
{
    struct run r = {.a = a};
    struct dh_index *ix = NULL;
    FILE *tel = NULL;
    struct dh_err e;
    int rc;

    dh_err_clear(&e);
    r.stop = dh_cli_stop_on_signals();
    if ((rc = dh_index_open(a->manifest, 0, &ix, &e)) < 0)
        goto out;
    if (a->ids_out && !(r.ids = fopen(a->ids_out, "w"))) {
        rc = dh_err_set(&e, DH_EIO, "%s: cannot write", a->ids_out);
        goto out;
    }
    if (a->telemetry_path && !(tel = fopen(a->telemetry_path, "w"))) {
        rc = dh_err_set(&e, DH_EIO, "%s: cannot write", a->telemetry_path);
        goto out;
    }
    a->o.index_path = a->manifest;
    a->o.telemetry = tel;
    a->o.max_batch = a->batch;
    if (!getenv("DATAHELIX_BIN"))
        a->o.datahelix_bin = "/proc/self/exe";
    if ((rc = dh_client_create(&a->o, &r.c, &e)) < 0)
        goto out;
    rc = run_epochs(&r, ix, &e);
    summary(&r);
out:
    dh_client_destroy(r.c);
    if (r.ids && fclose(r.ids) != 0 && rc == 0)
        rc = dh_err_set(&e, DH_EIO, "%s: write failed", a->ids_out);
    if (tel)
        fclose(tel);
    dh_index_close(ix);
    if (rc < 0)
        dh_cli_error(CMD, "%s", e.msg[0] ? e.msg : dh_strerror(rc));
    return rc < 0 ? DH_EXIT_FAIL : DH_EXIT_OK;
}

int dh_cmd_consume(int argc, char **argv)
{
    struct args a;
    int r;

    memset(&a, 0, sizeof(a));
    if ((r = parse_args(&a, argc, argv)) != DH_CLI_RUN)
        return r;
    dh_cli_ignore_sigpipe();
    return consume(&a);
}
