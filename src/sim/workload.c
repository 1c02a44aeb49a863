/*
 * workload.c - what the simulated samples cost: the profile mixes of the
 * paper's workloads (Sec. 5.1, Table 1) and probed manifests, turned into
 * (est_cpu_ms, est_out_bytes, est_tokens, GPU ms) per sample.
 *
 * Design: a profile is (frames, source short side, output short side), 16:9.
 * CPU ms comes from the project's default cost model (estimate.h) on the
 * source a profile implies (8 fps sampling, so duration = frames / 8 s, a
 * 30 fps source, 0.023 MB of H.264 per source megapixel); tokens from the
 * project's token models; GPU ms is calibrated so that one mid sample
 * (32 x 336p) costs 150 ms on every model (docs/sim.md states why).
 * Pure: no clock; the only I/O is the table reader of the manifest path.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "datahelix/estimate.h"
#include "datahelix/table.h"
#include "sim/sim.h"
#include "core/hash.h"

#define MID_GPU_MS 150.0 /* one 32 x 336p sample, every model */
#define SRC_FPS 30.0
#define SAMPLE_FPS 8.0
#define MB_PER_SRC_MPX 0.023 /* ~0.18 bit/pixel: web H.264 */
#define QWEN_ATTN_SHARE 0.5  /* attention = 1/3 of a mid sample's time */

struct profile {
    int64_t frames;
    int32_t src_side, out_side;
};

struct mix {
    const char *name;
    int n;
    struct profile p[4];
    double w[4]; /* weights; a negative first weight: cycle by sample */
};

static const struct mix mixes[] = {
    {"kinetics-s", 1, {{16, 224, 224}}, {1}},
    {"kinetics-m", 1, {{32, 336, 336}}, {1}},
    {"kinetics-l", 1, {{64, 448, 448}}, {1}},
    /* the paper: "mixed alternates 16-frame 224p, 32-frame 336p and
     * 64-frame 448p samples" */
    {"kinetics-mixed",
     3,
     {{16, 224, 224}, {32, 336, 336}, {64, 448, 448}},
     {-1, 1, 1}},
    /* OpenVid-1M: mostly 720p/1080p sources of 2-8 s, resized to 480p */
    {"openvid-mixed",
     4,
     {{32, 720, 480}, {64, 720, 480}, {32, 1080, 480}, {64, 1080, 480}},
     {0.4, 0.3, 0.2, 0.1}},
};
#define N_MIXES (sizeof(mixes) / sizeof(mixes[0]))

static const struct {
    const char *name, *mix;
    enum dh_sim_model model;
} paper[DH_SIM_PAPER_N] = {
    {"kinetics-s/videomae", "kinetics-s", DH_SIM_VIDEOMAE},
    {"kinetics-m/videomae", "kinetics-m", DH_SIM_VIDEOMAE},
    {"kinetics-l/videomae", "kinetics-l", DH_SIM_VIDEOMAE},
    {"kinetics-mixed/videomae", "kinetics-mixed", DH_SIM_VIDEOMAE},
    {"kinetics-s/qwen-vl", "kinetics-s", DH_SIM_QWEN_VL},
    {"kinetics-m/qwen-vl", "kinetics-m", DH_SIM_QWEN_VL},
    {"kinetics-l/qwen-vl", "kinetics-l", DH_SIM_QWEN_VL},
    {"kinetics-mixed/qwen-vl", "kinetics-mixed", DH_SIM_QWEN_VL},
    {"openvid-mixed/videomae", "openvid-mixed", DH_SIM_VIDEOMAE},
    {"openvid-mixed/qwen-vl", "openvid-mixed", DH_SIM_QWEN_VL},
    {"openvid-mixed/wan-dit", "openvid-mixed", DH_SIM_DIT},
};

void dh_sim_paper_entry(int i, const char **name, const char **mix,
                        enum dh_sim_model *model)
{
    *name = paper[i].name;
    *mix = paper[i].mix;
    *model = paper[i].model;
}

static const char *model_names[] = {"videomae", "qwen-vl", "dit"};

const char *dh_sim_model_name(enum dh_sim_model m)
{
    return model_names[m];
}

int dh_sim_model_parse(const char *s, enum dh_sim_model *out)
{
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, model_names[i])) {
            *out = (enum dh_sim_model)i;
            return 0;
        }
    return DH_EINVAL;
}

static int32_t wide(int32_t side)
{
    return (int32_t)(2 * lround(side * 16.0 / 9.0 / 2));
}

static void token_model(enum dh_sim_model m, struct dh_token_model *tm)
{
    int rc = dh_token_model_parse(model_names[m], tm, NULL);

    (void)rc; /* the three names are the token models' own */
}

/* GPU cost units of `tokens`; qwen-vl adds the quadratic attention term. */
static double gpu_units(enum dh_sim_model m, double tokens, double mid)
{
    if (m == DH_SIM_QWEN_VL)
        return tokens + QWEN_ATTN_SHARE * tokens * tokens / mid;
    return tokens;
}

static double mid_tokens(enum dh_sim_model m)
{
    struct dh_token_model tm;

    token_model(m, &tm);
    return (double)dh_token_model_count(&tm, 32, wide(336), 336);
}

static double gpu_ms(enum dh_sim_model m, double tokens)
{
    double mid = mid_tokens(m);

    return MID_GPU_MS * gpu_units(m, tokens, mid) / gpu_units(m, mid, mid);
}

static void profile_sample(const struct profile *p, enum dh_sim_model m,
                           struct dh_sim_sample *s)
{
    struct dh_cost_model cm;
    struct dh_token_model tm;
    struct dh_cost_features f = {0};
    int32_t ow = wide(p->out_side), oh = p->out_side;
    double src_frames = (double)p->frames / SAMPLE_FPS * SRC_FPS;

    dh_cost_model_default(&cm);
    f.src_mpx = src_frames * wide(p->src_side) * p->src_side / 1e6;
    f.in_mb = f.src_mpx * MB_PER_SRC_MPX;
    f.out_mpx = (double)p->frames * ow * oh / 1e6;
    s->cpu_ms = dh_cost_model_predict(&cm, &f);
    s->out_bytes = (double)p->frames * ow * oh * 3;
    token_model(m, &tm);
    s->tokens = (uint32_t)dh_token_model_count(&tm, p->frames, ow, oh);
    s->gpu_ms = gpu_ms(m, s->tokens);
}

static int pick(const struct mix *x, uint64_t seed, uint64_t k)
{
    double u, acc = 0, tot = 0;

    if (x->w[0] < 0)
        return (int)(k % (uint64_t)x->n);
    for (int i = 0; i < x->n; i++)
        tot += x->w[i];
    u = (double)(dh__mix64(seed * 0x9e3779b97f4a7c15ull + k) >> 11) * 0x1p-53;
    for (int i = 0; i < x->n; i++) {
        acc += x->w[i] / tot;
        if (u < acc)
            return i;
    }
    return x->n - 1;
}

static int alloc_samples(struct dh_sim_workload *w, uint64_t n,
                         struct dh_err *e)
{
    if (n == 0)
        return dh_err_set(e, DH_EINVAL, "workload: no samples");
    w->s = dh__calloc(n, sizeof(*w->s));
    if (!w->s)
        return dh_err_set(e, DH_ENOMEM,
                          "workload: out of memory for %llu "
                          "samples",
                          (unsigned long long)n);
    w->n = n;
    return 0;
}

int dh_sim_workload_mix(const char *name, enum dh_sim_model model, uint64_t n,
                        uint64_t seed, struct dh_sim_workload *w,
                        struct dh_err *e)
{
    struct dh_sim_sample proto[4];
    const struct mix *x = NULL;
    int rc;

    for (size_t i = 0; i < N_MIXES; i++)
        if (!strcmp(name, mixes[i].name))
            x = &mixes[i];
    if (!x)
        return dh_err_set(e, DH_EINVAL,
                          "unknown workload '%s' (kinetics-s, "
                          "kinetics-m, kinetics-l, kinetics-mixed, "
                          "openvid-mixed, paper)",
                          name);
    memset(w, 0, sizeof(*w));
    if ((rc = alloc_samples(w, n, e)) != 0)
        return rc;
    for (int i = 0; i < x->n; i++) {
        profile_sample(&x->p[i], model, &proto[i]);
        proto[i].profile = (uint16_t)i;
    }
    for (uint64_t k = 0; k < n; k++)
        w->s[k] = proto[pick(x, seed, k)];
    snprintf(w->name, sizeof(w->name), "%s", name);
    w->model = model;
    return 0;
}

/* Profile names interned to small ids (few distinct: linear search). */
static uint16_t intern(char (*names)[DH_PROFILE_MAX], uint32_t *n,
                       const char *p)
{
    for (uint32_t i = 0; i < *n; i++)
        if (!strcmp(names[i], p))
            return (uint16_t)i;
    if (*n == 256)
        return 255; /* more buckets than the planner needs: share one */
    snprintf(names[*n], DH_PROFILE_MAX, "%s", p);
    return (uint16_t)(*n)++;
}

static int read_manifest(struct dh_table_reader *r, struct dh_sim_workload *w,
                         char (*names)[DH_PROFILE_MAX], uint64_t *rows,
                         struct dh_err *e)
{
    uint32_t nnames = 0;
    struct dh_desc d;
    int rc;

    dh_desc_init(&d);
    *rows = 0;
    while ((rc = dh_table_reader_next(r, &d, e)) == 1) {
        struct dh_sim_sample *s;

        if (*rows == w->n)
            break; /* more rows than the run consumes */
        s = &w->s[(*rows)++];
        s->cpu_ms = d.est_cpu_ms > 0 ? d.est_cpu_ms : 0;
        s->out_bytes = d.est_out_bytes > 0 ? (double)d.est_out_bytes : 0;
        s->tokens = d.est_tokens <= 0           ? 0
                    : d.est_tokens > UINT32_MAX ? UINT32_MAX
                                                : (uint32_t)d.est_tokens;
        s->gpu_ms = gpu_ms(w->model, s->tokens);
        s->profile = intern(names, &nnames, d.profile);
    }
    dh_desc_fini(&d);
    return rc < 0 ? rc : 0;
}

int dh_sim_workload_manifest(const char *path, enum dh_sim_model model,
                             uint64_t n, struct dh_sim_workload *w,
                             struct dh_err *e)
{
    char(*names)[DH_PROFILE_MAX] = NULL;
    struct dh_table_reader *r;
    uint64_t rows = 0;
    int rc;

    memset(w, 0, sizeof(*w));
    w->model = model;
    if ((rc = alloc_samples(w, n, e)) != 0)
        return rc;
    names = dh__calloc(256, sizeof(*names));
    if (!names) {
        rc = dh_err_set(e, DH_ENOMEM, "workload: out of memory");
        goto out_free;
    }
    if ((rc = dh_table_reader_open(path, &r, e)) != 0)
        goto out_free;
    /* Rows are taken in file order and their ids never used, so a table
     * with lines removed (ids not dense) simulates as what it holds. */
    dh_table_reader_set_renumber(r, 1);
    rc = read_manifest(r, w, names, &rows, e);
    dh_table_reader_destroy(r);
    if (rc == 0 && rows == 0)
        rc = dh_err_set(e, DH_EEMPTY, "%s: no samples", path);
    if (rc)
        goto out_free;
    for (uint64_t k = rows; k < n; k++) /* cycle the table */
        w->s[k] = w->s[k % rows];
    snprintf(w->name, sizeof(w->name), "%s", path);
    dh__free(names);
    return 0;
out_free:
    dh__free(names);
    dh_sim_workload_fini(w);
    return rc;
}

void dh_sim_workload_fini(struct dh_sim_workload *w)
{
    if (!w)
        return;
    dh__free(w->s);
    w->s = NULL;
    w->n = 0;
}
