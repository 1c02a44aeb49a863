/*
 * cmd_plan.c - `datahelix plan`: prints the Tier-1 plan of an epoch
 * (src/include/datahelix/plan.h, docs/planner.md) so that users can inspect
 * balance before training.
 *
 * Design: the manifest is a .dhx index (its est_tokens / profile columns
 * are used in place, mmap'ed) or a JSONL descriptor table, read into two
 * plain arrays with profile names interned to u16.  Human output: the
 * first steps and the balance summary, beside the same figures for a
 * random split (`none`) and per-step greedy (window 1).  --json: one object
 * per step, then a summary line (issue 6 item 5).
 * Locking: single-threaded.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "core/alloc.h"
#include "datahelix/index.h"
#include "datahelix/plan.h"
#include "datahelix/table.h"

#define CMD "plan"
#define SHOW_STEPS 4
#define SHOW_IDS 8

struct args {
    const char *manifest;
    struct dh_plan_opts o;
    int json, renumber, have_world, have_batch;
};

/* The planning columns, borrowed from an index or owned (JSONL). */
struct manifest {
    uint64_t n;
    const uint32_t *tokens;
    const uint16_t *profile;
    struct dh_index *ix;
    uint32_t *own_tokens;
    uint16_t *own_profile;
};

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: datahelix plan --manifest M --world-size W --batch-size B\n"
        "                      [--seed S] [--epoch E] [--balance MODE]\n"
        "                      [--window N] [--step-order ORDER]\n"
        "                      [--no-drop-last] [--json]\n"
        "                      [--renumber]\n\n"
        "Prints the Tier-1 plan of an epoch (docs/planner.md): per global\n"
        "step and rank the sample ids and their estimated tokens, and the\n"
        "balance (max/mean rank tokens per step, mean and worst).\n\n"
        "  --manifest M      a .dhx index or a .jsonl descriptor table\n"
        "  --world-size W    ranks (>= 1)\n"
        "  --batch-size B    samples per rank per step (>= 1)\n"
        "  --seed S          permutation seed (default 0)\n"
        "  --epoch E         epoch number (default 0)\n"
        "  --balance MODE    fixed (exactly B per rank, default), free\n"
        "                    (counts may differ), none (random split)\n"
        "  --window N        steps balanced together (default %u; 1 =\n"
        "                    per-step greedy, Algorithm 1)\n"
        "  --step-order ORDER alternate (heavy, light, ...; default) or\n"
        "                    sorted (heaviest to lightest, then back up;\n"
        "                    for a GPU step that follows tokens)\n"
        "  --no-drop-last    plan a partial last step instead of dropping\n"
        "                    the remainder\n"
        "  --json            one JSON object per step, then a summary line\n"
        "  --renumber        a .jsonl manifest whose ids are not dense (lines\n"
        "                    removed): number its samples 0..n-1 in file\n"
        "                    order, as `datahelix index --renumber` does\n"
        "  -h, --help        this text\n",
        DH_PLAN_WINDOW_DEFAULT);
}

static const struct option long_opts[] = {
    {"manifest", required_argument, NULL, 'm'},
    {"world-size", required_argument, NULL, 'w'},
    {"batch-size", required_argument, NULL, 'b'},
    {"seed", required_argument, NULL, 's'},
    {"epoch", required_argument, NULL, 'e'},
    {"balance", required_argument, NULL, 'B'},
    {"window", required_argument, NULL, 'W'},
    {"step-order", required_argument, NULL, 'O'},
    {"no-drop-last", no_argument, NULL, 'D'},
    {"json", no_argument, NULL, 'j'},
    {"renumber", no_argument, NULL, 'R'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int parse_balance(const char *s, int *out)
{
    static const char *names[] = {"fixed", "free", "none"};

    for (int i = 0; i < 3; i++)
        if (!strcmp(s, names[i])) {
            *out = i;
            return 0;
        }
    return dh_cli_usage_error(CMD,
                              "--balance must be fixed, free or none, "
                              "not '%s'",
                              s);
}

static int parse_opt(void *ctx, int c)
{
    struct args *a = ctx;
    int64_t v = 0;
    int r = 0;

    switch (c) {
    case 'm':
        a->manifest = optarg;
        break;
    case 'w':
        r = dh_cli_opt_i64(CMD, "--world-size", optarg, 1, DH_PLAN_WORLD_MAX,
                           &v);
        a->o.world_size = (uint32_t)v;
        a->have_world = 1;
        break;
    case 'b':
        r = dh_cli_opt_i64(CMD, "--batch-size", optarg, 1, DH_PLAN_BATCH_MAX,
                           &v);
        a->o.batch_size = (uint32_t)v;
        a->have_batch = 1;
        break;
    case 's':
        r = dh_cli_opt_i64(CMD, "--seed", optarg, 0, INT64_MAX, &v);
        a->o.seed = (uint64_t)v;
        break;
    case 'e':
        r = dh_cli_opt_i64(CMD, "--epoch", optarg, 0, INT64_MAX, &v);
        a->o.epoch = (uint64_t)v;
        break;
    case 'W':
        r = dh_cli_opt_i64(CMD, "--window", optarg, 1, DH_PLAN_WINDOW_MAX, &v);
        a->o.window = (uint32_t)v;
        break;
    case 'B':
        r = parse_balance(optarg, &a->o.balance);
        break;
    case 'O':
        if (!strcmp(optarg, "alternate"))
            a->o.order = DH_ORDER_ALTERNATE;
        else if (!strcmp(optarg, "sorted"))
            a->o.order = DH_ORDER_SORTED;
        else
            r = dh_cli_usage_error(CMD,
                                   "--step-order must be alternate or "
                                   "sorted, not '%s'",
                                   optarg);
        break;
    case 'D':
        a->o.drop_last = 0;
        break;
    case 'j':
        a->json = 1;
        break;
    case 'R':
        a->renumber = 1;
        break;
    default:
        r = dh_cli_usage_error(CMD, "bad option");
    }
    return r;
}

DH_CLI_CMD(CMD, ":h", long_opts, parse_opt, 0, usage);

static int parse_args(struct args *a, int argc, char **argv)
{
    int r;

    dh_plan_opts_init(&a->o);
    if ((r = dh_cli_getopt(&cli_cmd, argc, argv, a, NULL)) != DH_CLI_RUN)
        return r;
    if (!a->manifest || !*a->manifest)
        return dh_cli_usage_error(CMD, "--manifest M is required");
    if (!a->have_world || !a->have_batch)
        return dh_cli_usage_error(CMD, "--world-size and --batch-size are "
                                       "required");
    return DH_CLI_RUN;
}

/* ---- manifests ---- */
static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);

    return n >= k && !strcmp(s + n - k, suffix);
}

static int load_index(const char *path, struct manifest *m, struct dh_err *e)
{
    struct dh_index_columns c;
    unsigned np;
    int rc = dh_index_open(path, 0, &m->ix, e);

    if (rc)
        return rc;
    dh_index_columns(m->ix, &c);
    np = dh_index_profile_count(m->ix);
    for (uint64_t i = 0; i < c.count; i++)
        if (c.profile[i] >= np && np > 0)
            return dh_err_set(e, DH_EFORMAT,
                              "%s: sample %" PRIu64 " has "
                              "profile %u of %u",
                              path, i, c.profile[i], np);
    m->n = c.count;
    m->tokens = c.est_tokens;
    m->profile = c.profile;
    return 0;
}

/* Profile names interned to u16 (few distinct names: linear search with
 * the last hit first). */
struct interner {
    char (*names)[DH_PROFILE_MAX];
    uint32_t n, cap, last;
};

static int intern(struct interner *t, const char *name, uint16_t *out)
{
    if (t->n && !strcmp(t->names[t->last], name))
        goto found;
    for (t->last = 0; t->last < t->n; t->last++)
        if (!strcmp(t->names[t->last], name))
            goto found;
    if (t->n == DH_INDEX_PROFILE_MAX)
        return DH_ETOOBIG;
    if (t->n == t->cap) {
        uint32_t cap = t->cap ? 2 * t->cap : 16;
        void *p = dh__realloc(t->names, cap * sizeof(*t->names));

        if (!p)
            return DH_ENOMEM;
        t->names = p;
        t->cap = cap;
    }
    memcpy(t->names[t->n], name, DH_PROFILE_MAX);
    t->last = t->n++;
found:
    *out = (uint16_t)t->last;
    return 0;
}

/* Makes room for id `id` in the owned columns. */
static int grow(struct manifest *m, uint64_t *cap, uint64_t id)
{
    uint64_t nc = *cap ? *cap : 1024;
    void *t, *p;

    if (id < *cap)
        return 0;
    while (nc <= id)
        nc *= 2;
    t = dh__realloc(m->own_tokens, nc * sizeof(*m->own_tokens));
    if (t)
        m->own_tokens = t;
    p = dh__realloc(m->own_profile, nc * sizeof(*m->own_profile));
    if (p)
        m->own_profile = p;
    if (!t || !p)
        return DH_ENOMEM;
    *cap = nc;
    return 0;
}

static int read_rows(struct dh_table_reader *r, struct manifest *m,
                     struct interner *t, struct dh_err *e)
{
    struct dh_desc d;
    uint64_t cap = 0;
    int rc;

    dh_desc_init(&d);
    while ((rc = dh_table_reader_next(r, &d, e)) == 1) {
        uint64_t id = (uint64_t)d.id;
        int64_t tok = d.est_tokens;

        if ((rc = grow(m, &cap, id)) ||
            (rc = intern(t, d.profile, &m->own_profile[id]))) {
            dh_err_set(e, rc, "%s",
                       rc == DH_ENOMEM ? "out of memory"
                                       : "more than 65535 distinct profiles");
            break;
        }
        m->own_tokens[id] = tok < 0            ? 0
                            : tok > UINT32_MAX ? UINT32_MAX
                                               : (uint32_t)tok;
        m->n = id + 1 > m->n ? id + 1 : m->n;
    }
    dh_desc_fini(&d);
    return rc < 0 ? rc : 0;
}

static int load_table(const char *path, int renumber, struct manifest *m,
                      struct dh_err *e)
{
    struct dh_table_reader *r;
    struct interner t = {0};
    int rc = dh_table_reader_open(path, &r, e);

    if (rc)
        return rc;
    dh_table_reader_set_renumber(r, renumber);
    rc = read_rows(r, m, &t, e);
    dh_table_reader_destroy(r);
    dh__free(t.names);
    m->tokens = m->own_tokens;
    m->profile = m->own_profile;
    return rc;
}

static void manifest_fini(struct manifest *m)
{
    dh_index_close(m->ix);
    dh__free(m->own_tokens);
    dh__free(m->own_profile);
}

/* ---- output ---- */
static void print_json(const struct dh_plan *p)
{
    uint32_t w = dh_plan_world_size(p);
    double mean, worst;

    for (uint64_t g = 0; g < dh_plan_steps(p); g++) {
        printf("{\"step\": %" PRIu64 ", \"ranks\": [", g);
        for (uint32_t r = 0; r < w; r++) {
            uint64_t n;
            const uint64_t *ids = dh_plan_rank_ids(p, g, r, &n);

            printf("%s[", r ? ", " : "");
            for (uint64_t i = 0; i < n; i++)
                printf("%s%" PRIu64, i ? ", " : "", ids[i]);
            printf("]");
        }
        printf("], \"tokens\": [");
        for (uint32_t r = 0; r < w; r++)
            printf("%s%" PRIu64, r ? ", " : "", dh_plan_rank_tokens(p, g, r));
        printf("]}\n");
    }
    dh_plan_balance(p, &mean, &worst);
    printf("{\"summary\": {\"steps\": %" PRIu64 ", \"max_mean_avg\": %.17g, "
           "\"max_mean_worst\": %.17g}}\n",
           dh_plan_steps(p), mean, worst);
}

static void print_step(const struct dh_plan *p, uint64_t g)
{
    for (uint32_t r = 0; r < dh_plan_world_size(p); r++) {
        uint64_t n;
        const uint64_t *ids = dh_plan_rank_ids(p, g, r, &n);

        printf("%6" PRIu64 " %5u %8" PRIu64 " %12" PRIu64 "  ", g, r, n,
               dh_plan_rank_tokens(p, g, r));
        for (uint64_t i = 0; i < n && i < SHOW_IDS; i++)
            printf("%s%" PRIu64, i ? "," : "", ids[i]);
        printf("%s\n", n > SHOW_IDS ? ",..." : "");
    }
    printf("%6s %5s %8s %12s  max/mean %.3f\n", "", "", "", "",
           dh_plan_step_ratio(p, g));
}

/* Balance of the same epoch under other settings, for comparison. */
static int other_balance(const struct manifest *m,
                         const struct dh_plan_opts *base, int balance,
                         uint32_t window, double *mean, double *worst)
{
    struct dh_plan_opts o = *base;
    struct dh_plan *p;

    o.balance = balance;
    o.window = window;
    if (dh_plan_create(m->tokens, m->profile, m->n, &o, &p, NULL))
        return -1;
    dh_plan_balance(p, mean, worst);
    dh_plan_destroy(p);
    return 0;
}

static void print_human(const struct dh_plan *p, const struct manifest *m,
                        const struct args *a, double secs)
{
    static const char *names[] = {"fixed", "free", "none"};
    double mean, worst;

    printf("plan: %" PRIu64 " samples, %" PRIu64 " steps of %u ranks x %u, "
           "%" PRIu64 " kept; balance %s, window %u, seed %" PRIu64
           ", epoch %" PRIu64 " (%.3f s)\n\n",
           m->n, dh_plan_steps(p), a->o.world_size, a->o.batch_size,
           dh_plan_kept(p), names[a->o.balance], dh_plan_window(p), a->o.seed,
           a->o.epoch, secs);
    printf("%6s %5s %8s %12s  %s\n", "step", "rank", "samples", "tokens",
           "ids");
    for (uint64_t g = 0; g < dh_plan_steps(p) && g < SHOW_STEPS; g++)
        print_step(p, g);
    dh_plan_balance(p, &mean, &worst);
    printf("\nbalance (max/mean rank tokens per step):\n");
    printf("  %-28s mean %.3f  worst %.3f\n", "this plan", mean, worst);
    if (!other_balance(m, &a->o, DH_BALANCE_NONE, 1, &mean, &worst))
        printf("  %-28s mean %.3f  worst %.3f\n", "none (random split)", mean,
               worst);
    if (a->o.balance != DH_BALANCE_NONE &&
        !other_balance(m, &a->o, a->o.balance, 1, &mean, &worst))
        printf("  %-28s mean %.3f  worst %.3f\n", "per-step greedy (window 1)",
               mean, worst);
}

static int run(const struct args *a)
{
    struct manifest m = {0};
    struct dh_plan *p = NULL;
    struct dh_err e;
    double t0;
    int rc;

    dh_err_clear(&e);
    rc = ends_with(a->manifest, ".dhx")
             ? load_index(a->manifest, &m, &e)
             : load_table(a->manifest, a->renumber, &m, &e);
    if (rc) {
        dh_cli_error(CMD, "%s", e.msg);
        goto out_manifest;
    }
    t0 = dh_cli_now();
    if ((rc = dh_plan_create(m.tokens, m.profile, m.n, &a->o, &p, &e))) {
        dh_cli_error(CMD, "%s: %s", a->manifest, e.msg);
        goto out_manifest;
    }
    if (a->json)
        print_json(p);
    else
        print_human(p, &m, a, dh_cli_now() - t0);
    dh_plan_destroy(p);
out_manifest:
    manifest_fini(&m);
    return rc ? DH_EXIT_FAIL : DH_EXIT_OK;
}

int dh_cmd_plan(int argc, char **argv)
{
    struct args a = {0};
    int r = parse_args(&a, argc, argv);

    if (r != DH_CLI_RUN)
        return r;
    return run(&a);
}
