/*
 * cmd_sim.c - `datahelix sim`: runs the discrete-event simulator (src/sim,
 * docs/sim.md) for one workload, a manifest, or the paper's 11-workload
 * matrix, with native / pool / datahelix side by side, and prints a table
 * per workload plus the Table 2 aggregate (geometric mean of throughput,
 * arithmetic means of the rest), or one JSON object with --json.
 * Single-threaded.
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "sim/sim.h"

#define CMD "sim"

struct args {
    struct dh_sim_config c;
    const char *workload, *manifest;
    enum dh_sim_model model;
    int systems[DH_SIM_NSYSTEMS], nsys;
    int json, have_local, have_gpu;
    double gpu[3]; /* --gpu-ms A,B,C: A + B t + C t^2 per sample */
};

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: datahelix sim [--ranks R] [--local L] [--remote M] [--cores C]\n"
        "                     [--batch-size B] [--steps S] [--warmup W]\n"
        "                     [--workload NAME | --manifest M.jsonl]\n"
        "                     [--model videomae|qwen-vl|dit]\n"
        "                     [--systems native,pool,datahelix] [--seed S]\n"
        "                     [--json] [model options]\n\n"
        "Simulates synchronous data-parallel training fed by local and remote\n"
        "DataServers with the project's own planner and placement code, and\n"
        "prints the paper's metrics per system (docs/sim.md).\n\n"
        "  --ranks R           training ranks (default 8)\n"
        "  --local L           local DataServers (default R)\n"
        "  --remote M          remote DataServers (default 16)\n"
        "  --cores C           workers per DataServer (default 4); native gets\n"
        "                      (L + M) x C spread over its rank-local servers\n"
        "  --batch-size B      samples per rank per step (default 2)\n"
        "  --steps S           measured steps (default 100)\n"
        "  --warmup W          warm-up steps, excluded (default 20)\n"
        "  --workload NAME     kinetics-s, kinetics-m, kinetics-l,\n"
        "                      kinetics-mixed (default), openvid-mixed, or\n"
        "                      paper (the 11-workload matrix)\n"
        "  --manifest M        a probed descriptor table (JSONL)\n"
        "  --model MODEL       GPU-window model (default videomae)\n"
        "  --systems LIST      comma-separated (default native,pool,datahelix)\n"
        "  --seed S            seed (default 1)\n"
        "  --json              one JSON object instead of tables\n"
        "model options:\n"
        "  --prefetch K        batches requested ahead (default 2)\n"
        "  --link-gbps G       remote link bandwidth (default 10)\n"
        "  --link-latency-ms T remote link latency (default 0.2)\n"
        "  --ddl-ms D          DDL miss: input wait > D ms (default 0)\n"
        "  --noise SIGMA       lognormal sigma of actual/estimated CPU (0.3)\n"
        "  --cpu-scale X       multiplies every est_cpu_ms (default 1)\n"
        "  --allreduce-ms T    all-reduce time per step (default 0)\n"
        "  --gpu-ms A,B,C      a sample's GPU ms = A + B*tokens + C*tokens^2\n"
        "                      instead of the --model calibration (to match\n"
        "                      a live run's emulated window)\n"
        "  --native-cores N    native's workers per rank (default: the whole\n"
        "                      (local + remote) x cores budget spread over\n"
        "                      the ranks; --native-cores C is the paper's\n"
        "                      Native rd0, each rank's own server alone)\n"
        "  --handover SYS=A,B,C,D\n"
        "                      SYS's hand-over (default none; repeat per\n"
        "                      system): A + B*MB ms of CPU per sample of MB\n"
        "                      megabytes (x --cpu-scale), and C + D*MB ms of\n"
        "                      next() on a ready batch of MB megabytes\n"
        "  --replay-order      every system splits a --manifest in its own\n"
        "                      order: step k, rank r take samples (kR+r)B ..\n"
        "                      (kR+r+1)B-1 (a live run's split, replayed;\n"
        "                      datahelix then skips its planner)\n"
        "Tier 2 (docs/rebalance.md):\n"
        "  --est-error SIGMA   actual / estimated tokens and GPU time are\n"
        "                      lognormal with this sigma (default 0), for\n"
        "                      every system; adds step_p50_ms, step_p95_ms\n"
        "  --tier2             datahelix rebalances every round with the\n"
        "                      loader's cost gate (adds \"tier2\" to --json)\n"
        "  --tier2-rounds R    steps per round (default 4)\n"
        "  --tier2-margin M    move only if gain > cost x M (default 1.5)\n"
        "  -h, --help          this text\n");
}

enum {
    O_PREFETCH = 256,
    O_GBPS,
    O_LAT,
    O_DDL,
    O_NOISE,
    O_SCALE,
    O_AR,
    O_GPU,
    O_NATIVE,
    O_HANDOVER,
    O_REPLAY,
    O_ESTERR,
    O_TIER2,
    O_T2ROUND,
    O_T2MARGIN
};

static const struct option long_opts[] = {
    {"ranks", required_argument, NULL, 'r'},
    {"local", required_argument, NULL, 'l'},
    {"remote", required_argument, NULL, 'm'},
    {"cores", required_argument, NULL, 'c'},
    {"batch-size", required_argument, NULL, 'b'},
    {"steps", required_argument, NULL, 's'},
    {"warmup", required_argument, NULL, 'w'},
    {"workload", required_argument, NULL, 'W'},
    {"manifest", required_argument, NULL, 'M'},
    {"model", required_argument, NULL, 'o'},
    {"systems", required_argument, NULL, 'S'},
    {"seed", required_argument, NULL, 'e'},
    {"json", no_argument, NULL, 'j'},
    {"prefetch", required_argument, NULL, O_PREFETCH},
    {"link-gbps", required_argument, NULL, O_GBPS},
    {"link-latency-ms", required_argument, NULL, O_LAT},
    {"ddl-ms", required_argument, NULL, O_DDL},
    {"noise", required_argument, NULL, O_NOISE},
    {"cpu-scale", required_argument, NULL, O_SCALE},
    {"allreduce-ms", required_argument, NULL, O_AR},
    {"gpu-ms", required_argument, NULL, O_GPU},
    {"native-cores", required_argument, NULL, O_NATIVE},
    {"handover", required_argument, NULL, O_HANDOVER},
    {"replay-order", no_argument, NULL, O_REPLAY},
    {"est-error", required_argument, NULL, O_ESTERR},
    {"tier2", no_argument, NULL, O_TIER2},
    {"tier2-rounds", required_argument, NULL, O_T2ROUND},
    {"tier2-margin", required_argument, NULL, O_T2MARGIN},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int opt_u32(const char *name, int64_t lo, int64_t hi, uint32_t *out)
{
    int64_t v;
    int r = dh_cli_opt_i64(CMD, name, optarg, lo, hi, &v);

    if (!r)
        *out = (uint32_t)v;
    return r;
}

static int opt_dbl(const char *name, double lo, double hi, double *out)
{
    if (dh_cli_parse_double(optarg, lo, hi, out))
        return dh_cli_usage_error(CMD,
                                  "%s must be a number in [%g, %g], "
                                  "not '%s'",
                                  name, lo, hi, optarg);
    return 0;
}

static int parse_systems(struct args *a, const char *list)
{
    memset(a->systems, 0, sizeof(a->systems));
    a->nsys = 0;
    for (const char *t = list; *t;) {
        size_t n = strcspn(t, ",");
        char name[32];
        enum dh_sim_system s;

        snprintf(name, sizeof(name), "%.*s", n < 31 ? (int)n : 31, t);
        if (n >= sizeof(name) || dh_sim_system_parse(name, &s))
            return dh_cli_usage_error(CMD,
                                      "unknown system '%.*s' (native, "
                                      "pool, datahelix)",
                                      (int)n, t);
        a->nsys += !a->systems[s];
        a->systems[s] = 1;
        t += n + (t[n] == ',');
    }
    if (!a->nsys)
        return dh_cli_usage_error(CMD, "--systems names no system");
    return 0;
}

/* "X1,...,Xn": n finite non-negative numbers into out; -1 otherwise. */
static int parse_numbers(const char *v, double *out, int n)
{
    char *end;
    const char *p = v;

    for (int i = 0; i < n; i++) {
        out[i] = strtod(p, &end);
        if (end == p || !(out[i] >= 0) || out[i] > 1e12 ||
            *end != (i < n - 1 ? ',' : '\0'))
            return -1;
        p = end + 1;
    }
    return 0;
}

static int parse_gpu(struct args *a, const char *v)
{
    if (parse_numbers(v, a->gpu, 3))
        return dh_cli_usage_error(CMD,
                                  "--gpu-ms must be A,B,C (three "
                                  "non-negative numbers), not '%s'",
                                  v);
    a->have_gpu = 1;
    return 0;
}

/* "SYSTEM=A,B,C,D" (struct dh_sim_handover's four fields, in order). */
static int parse_handover(struct args *a, const char *v)
{
    const char *eq = strchr(v, '=');
    char name[32];
    double x[4];
    enum dh_sim_system s;

    if (!eq || eq - v >= (ptrdiff_t)sizeof(name))
        return dh_cli_usage_error(CMD,
                                  "--handover must be SYSTEM=A,B,C,D, "
                                  "not '%s'",
                                  v);
    snprintf(name, sizeof(name), "%.*s", (int)(eq - v), v);
    if (dh_sim_system_parse(name, &s))
        return dh_cli_usage_error(CMD,
                                  "--handover: unknown system '%s' "
                                  "(native, pool, datahelix)",
                                  name);
    if (parse_numbers(eq + 1, x, 4))
        return dh_cli_usage_error(CMD,
                                  "--handover %s= must be four "
                                  "non-negative numbers A,B,C,D, not '%s'",
                                  name, eq + 1);
    a->c.handover[s] = (struct dh_sim_handover){x[0], x[1], x[2], x[3]};
    return 0;
}

static int parse_opt(void *ctx, int c)
{
    struct args *a = ctx;
    struct dh_sim_config *k = &a->c;
    uint64_t seed;

    switch (c) {
    case 'r':
        return opt_u32("--ranks", 1, 1 << 20, &k->ranks);
    case 'l':
        a->have_local = 1;
        return opt_u32("--local", 1, 1 << 20, &k->local);
    case 'm':
        return opt_u32("--remote", 0, 1 << 20, &k->remote);
    case 'c':
        return opt_u32("--cores", 1, 4096, &k->cores);
    case 'b':
        return opt_u32("--batch-size", 1, 1 << 16, &k->batch);
    case 's':
        return opt_u32("--steps", 1, 1 << 20, &k->steps);
    case 'w':
        return opt_u32("--warmup", 0, 1 << 20, &k->warmup);
    case 'W':
        a->workload = optarg;
        return 0;
    case 'M':
        a->manifest = optarg;
        return 0;
    case 'o':
        if (dh_sim_model_parse(optarg, &a->model))
            return dh_cli_usage_error(CMD,
                                      "--model must be videomae, "
                                      "qwen-vl or dit, not '%s'",
                                      optarg);
        return 0;
    case 'S':
        return parse_systems(a, optarg);
    case 'e':
        if (dh_cli_parse_i64(optarg, 0, INT64_MAX, (int64_t *)&seed))
            return dh_cli_usage_error(CMD,
                                      "--seed must be a non-negative "
                                      "integer, not '%s'",
                                      optarg);
        k->seed = seed;
        return 0;
    case 'j':
        a->json = 1;
        return 0;
    case O_PREFETCH:
        return opt_u32("--prefetch", 1, 64, &k->prefetch);
    case O_GBPS:
        return opt_dbl("--link-gbps", 1e-3, 1e6, &k->link_gbps);
    case O_LAT:
        return opt_dbl("--link-latency-ms", 0, 1e6, &k->link_lat_ms);
    case O_DDL:
        return opt_dbl("--ddl-ms", 0, 1e9, &k->ddl_ms);
    case O_NOISE:
        return opt_dbl("--noise", 0, 3, &k->noise_sigma);
    case O_SCALE:
        return opt_dbl("--cpu-scale", 1e-3, 1e4, &k->cpu_scale);
    case O_AR:
        return opt_dbl("--allreduce-ms", 0, 1e6, &k->allreduce_ms);
    case O_GPU:
        return parse_gpu(a, optarg);
    case O_NATIVE:
        return opt_u32("--native-cores", 1, 1 << 20, &k->native_cores);
    case O_HANDOVER:
        return parse_handover(a, optarg);
    case O_REPLAY:
        k->replay_order = 1;
        return 0;
    case O_ESTERR:
        return opt_dbl("--est-error", 0, 3, &k->est_error);
    case O_TIER2:
        k->tier2 = 1;
        return 0;
    case O_T2ROUND:
        return opt_u32("--tier2-rounds", 1, 4096, &k->tier2_round);
    case O_T2MARGIN:
        return opt_dbl("--tier2-margin", 0, 1e6, &k->tier2_margin);
    }
    return dh_cli_usage_error(CMD, "bad option");
}

DH_CLI_CMD(CMD, ":h", long_opts, parse_opt, 0, usage);

static int parse_args(struct args *a, int argc, char **argv)
{
    int r;

    memset(a, 0, sizeof(*a));
    dh_sim_config_default(&a->c);
    a->nsys = DH_SIM_NSYSTEMS;
    for (int i = 0; i < DH_SIM_NSYSTEMS; i++)
        a->systems[i] = 1;
    if ((r = dh_cli_getopt(&cli_cmd, argc, argv, a, NULL)) != DH_CLI_RUN)
        return r;
    if (a->workload && a->manifest)
        return dh_cli_usage_error(CMD, "--workload and --manifest exclude "
                                       "each other");
    if (!a->have_local)
        a->c.local = a->c.ranks;
    if (a->c.local > a->c.ranks)
        return dh_cli_usage_error(CMD,
                                  "--local %u exceeds --ranks %u (one "
                                  "local DataServer per rank at most)",
                                  a->c.local, a->c.ranks);
    if (dh_sim_samples_needed(&a->c) > UINT32_MAX)
        return dh_cli_usage_error(CMD, "(steps + warmup) x ranks x batch "
                                       "must stay under 2^32");
    if (a->c.replay_order && !a->manifest)
        return dh_cli_usage_error(CMD, "--replay-order replays a --manifest's "
                                       "order (a profile mix has none)");
    if (!a->manifest && !a->workload)
        a->workload = "kinetics-mixed";
    return DH_CLI_RUN;
}

/* ---- running ---- */
struct result {
    char name[96];
    const char *model;
    int have[DH_SIM_NSYSTEMS];
    struct dh_sim_metrics m[DH_SIM_NSYSTEMS];
};

static int run_one(const struct args *a, struct dh_sim_workload *w,
                   struct result *res)
{
    struct dh_err e = {0};

    snprintf(res->name, sizeof(res->name), "%s", w->name);
    res->model = dh_sim_model_name(w->model);
    for (int s = 0; s < DH_SIM_NSYSTEMS; s++) {
        if (!a->systems[s])
            continue;
        if (dh_sim_run(&a->c, w, (enum dh_sim_system)s, &res->m[s], &e)) {
            dh_cli_error(CMD, "%s, %s: %s", w->name,
                         dh_sim_system_name((enum dh_sim_system)s), e.msg);
            return -1;
        }
        res->have[s] = 1;
    }
    return 0;
}

static int load(const struct args *a, const char *name, const char *mix,
                enum dh_sim_model model, struct dh_sim_workload *w)
{
    uint64_t n = dh_sim_samples_needed(&a->c);
    struct dh_err e = {0};
    int rc = a->manifest
                 ? dh_sim_workload_manifest(a->manifest, model, n, w, &e)
                 : dh_sim_workload_mix(mix, model, n, a->c.seed, w, &e);

    if (rc) {
        dh_cli_error(CMD, "%s", e.msg);
        return -1;
    }
    if (name)
        snprintf(w->name, sizeof(w->name), "%s", name);
    for (uint64_t i = 0; a->have_gpu && i < w->n; i++) {
        double t = w->s[i].tokens;

        w->s[i].gpu_ms = a->gpu[0] + a->gpu[1] * t + a->gpu[2] * t * t;
    }
    return 0;
}

/* ---- output ---- */
static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;

        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

/* Tier 2's rounds (only with --tier2, datahelix). */
static void json_tier2(const struct dh_sim_tier2 *t)
{
    printf(", \"tier2\": {\"rounds\": %" PRIu64 ", \"moved\": %" PRIu64
           ", \"kept\": %" PRIu64 ", \"unmeasured\": %" PRIu64
           ", \"balanced\": %" PRIu64 ", \"moved_samples\": %" PRIu64
           ", \"moved_bytes\": %" PRIu64 ", \"gain_ms\": %.6g, "
           "\"cost_ms\": %.6g, \"ratio_before\": %.6g, "
           "\"ratio_after\": %.6g}",
           t->rounds, t->moved, t->kept, t->unmeasured, t->balanced,
           t->moved_samples, t->moved_bytes, t->gain_ms, t->cost_ms,
           t->ratio_before, t->ratio_after);
}

/* extras: 1 adds the step times, 2 also Tier 2's rounds. */
static void json_metrics(const struct dh_sim_metrics *m, int extras)
{
    printf("{\"throughput\": %.6g, \"input_wait_p95_s\": %.6g, "
           "\"ready_p95_s\": %.6g, \"ddl_miss_rate\": %.6g, "
           "\"cross_ds_gb_per_100_steps\": %.6g",
           m->throughput, m->input_wait_p95_s, m->ready_p95_s, m->ddl_miss_rate,
           m->cross_ds_gb_per_100_steps);
    if (extras)
        printf(", \"step_p50_ms\": %.6g, \"step_p95_ms\": %.6g", m->step_p50_ms,
               m->step_p95_ms);
    if (extras > 1)
        json_tier2(&m->tier2);
    putchar('}');
}

static void json_systems(const int *have, const struct dh_sim_metrics *m,
                         int extras)
{
    int first = 1;

    putchar('{');
    for (int s = 0; s < DH_SIM_NSYSTEMS; s++) {
        if (!have[s])
            continue;
        printf("%s\"%s\": ", first ? "" : ", ",
               dh_sim_system_name((enum dh_sim_system)s));
        json_metrics(&m[s], extras && (extras == 1 || s != DH_SIM_DATAHELIX)
                                ? 1
                                : extras);
        first = 0;
    }
    putchar('}');
}

/* Table 2 aggregate: geometric mean of throughput, arithmetic means of the
 * rest. */
static void aggregate(const struct result *r, int n, int *have,
                      struct dh_sim_metrics *agg)
{
    for (int s = 0; s < DH_SIM_NSYSTEMS; s++) {
        struct dh_sim_metrics *g = &agg[s];
        double lg = 0;

        memset(g, 0, sizeof(*g));
        have[s] = n > 0 && r[0].have[s];
        if (!have[s])
            continue;
        for (int i = 0; i < n; i++) {
            lg += log(r[i].m[s].throughput);
            g->input_wait_p95_s += r[i].m[s].input_wait_p95_s / n;
            g->ready_p95_s += r[i].m[s].ready_p95_s / n;
            g->ddl_miss_rate += r[i].m[s].ddl_miss_rate / n;
            g->cross_ds_gb_per_100_steps +=
                r[i].m[s].cross_ds_gb_per_100_steps / n;
        }
        g->throughput = exp(lg / n);
    }
}

static void print_table(const char *title, const char *model, const int *have,
                        const struct dh_sim_metrics *m)
{
    double base = have[DH_SIM_NATIVE] ? m[DH_SIM_NATIVE].throughput : 0;

    if (model)
        printf("\nworkload %s (model %s)\n", title, model);
    else
        printf("\n%s\n", title);
    printf("  %-10s %11s %9s %12s %12s %9s %13s\n", "system", "samples/s",
           "vs native", "wait p95 s", "ready p95 s", "DDL miss",
           "cross GB/100");
    for (int s = 0; s < DH_SIM_NSYSTEMS; s++) {
        char ratio[16] = "-";

        if (!have[s])
            continue;
        if (base > 0)
            snprintf(ratio, sizeof(ratio), "%.2fx", m[s].throughput / base);
        printf("  %-10s %11.2f %9s %12.3f %12.3f %8.1f%% %13.2f\n",
               dh_sim_system_name((enum dh_sim_system)s), m[s].throughput,
               ratio, m[s].input_wait_p95_s, m[s].ready_p95_s,
               100 * m[s].ddl_miss_rate, m[s].cross_ds_gb_per_100_steps);
    }
}

static void print_steps(const struct dh_sim_config *c, const int *have,
                        const struct dh_sim_metrics *m)
{
    const struct dh_sim_tier2 *t = &m[DH_SIM_DATAHELIX].tier2;

    for (int s = 0; s < DH_SIM_NSYSTEMS; s++)
        if (have[s])
            printf("  %-10s step p50 %.1f ms, p95 %.1f ms\n",
                   dh_sim_system_name((enum dh_sim_system)s), m[s].step_p50_ms,
                   m[s].step_p95_ms);
    if (c->tier2 && have[DH_SIM_DATAHELIX])
        printf("  tier 2: %" PRIu64 " rounds of %u steps: %" PRIu64
               " moved, %" PRIu64 " kept, %" PRIu64 " balanced, %" PRIu64
               " unmeasured; %" PRIu64 " samples, %.3f GB moved; max/mean "
               "tokens %.3f -> %.3f\n",
               t->rounds, c->tier2_round, t->moved, t->kept, t->balanced,
               t->unmeasured, t->moved_samples, (double)t->moved_bytes / 1e9,
               t->ratio_before, t->ratio_after);
}

static void print_human(const struct args *a, const struct result *r, int n,
                        const int *have, const struct dh_sim_metrics *agg)
{
    const struct dh_sim_config *c = &a->c;

    printf("datahelix sim: %u ranks; %u local + %u remote DataServers x %u "
           "cores (native: %u cores over %u rank-local servers); batch %u; "
           "%u measured + %u warm-up steps; seed %" PRIu64 "\n",
           c->ranks, c->local, c->remote, c->cores,
           (c->local + c->remote) * c->cores, c->ranks, c->batch, c->steps,
           c->warmup, c->seed);
    for (int i = 0; i < n; i++) {
        print_table(r[i].name, r[i].model, r[i].have, r[i].m);
        if (c->tier2 || c->est_error > 0)
            print_steps(c, r[i].have, r[i].m);
    }
    if (n > 1)
        print_table("aggregate (geometric mean of throughput, arithmetic "
                    "means of the rest)",
                    NULL, have, agg);
}

static void print_json(const struct result *r, int n, const int *have,
                       const struct dh_sim_metrics *agg, int extras)
{
    printf("{\"workloads\": {");
    for (int i = 0; i < n; i++) {
        printf("%s", i ? ", " : "");
        json_str(r[i].name);
        printf(": ");
        json_systems(r[i].have, r[i].m, extras);
    }
    printf("}, \"aggregate\": ");
    json_systems(have, agg, 0);
    printf("}\n");
}

int dh_cmd_sim(int argc, char **argv)
{
    struct result res[DH_SIM_PAPER_N];
    struct dh_sim_metrics agg[DH_SIM_NSYSTEMS];
    int have[DH_SIM_NSYSTEMS];
    struct args a;
    int paper, n, rc = parse_args(&a, argc, argv);

    if (rc != DH_CLI_RUN)
        return rc;
    memset(res, 0, sizeof(res));
    paper = a.workload && !strcmp(a.workload, "paper");
    n = paper ? DH_SIM_PAPER_N : 1;
    for (int i = 0; i < n; i++) {
        struct dh_sim_workload w = {0};
        const char *name = NULL, *mix = a.workload;
        enum dh_sim_model model = a.model;

        if (paper)
            dh_sim_paper_entry(i, &name, &mix, &model);
        if (load(&a, name, mix, model, &w))
            return DH_EXIT_FAIL;
        rc = run_one(&a, &w, &res[i]);
        dh_sim_workload_fini(&w);
        if (rc)
            return DH_EXIT_FAIL;
    }
    aggregate(res, n, have, agg);
    if (a.json)
        print_json(res, n, have, agg,
                   a.c.tier2           ? 2
                   : a.c.est_error > 0 ? 1
                                       : 0);
    else
        print_human(&a, res, n, have, agg);
    return DH_EXIT_OK;
}
