/*
 * tokens.c - visual-token estimates per model family (DESIGN 4.2
 * est_tokens).  The GPU cost of a sample grows with these, so Tier-1
 * planning balances ranks by them (paper Sec. 3.4).  Pure.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/estimate.h"

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* Qwen2-VL's smart_resize rounds each side to the nearest multiple of 28. */
static int64_t round28(int32_t side)
{
    int64_t r = (side + 14) / 28;
    return r < 1 ? 1 : r;
}

int64_t dh_token_model_count(const struct dh_token_model *m, int64_t frames,
                             int32_t width, int32_t height)
{
    if (frames <= 0 || width <= 0 || height <= 0)
        return 0;
    switch (m->family) {
    case DH_TOKENS_QWEN_VL:
        return ceil_div(frames, 2) * round28(width) * round28(height);
    case DH_TOKENS_VIDEOMAE:
        return ceil_div(frames, 2) * ceil_div(width, 16) * ceil_div(height, 16);
    case DH_TOKENS_DIT:
        /* Causal video VAE: the first frame alone, then groups of 4. */
        return (1 + ceil_div(frames - 1, 4)) * ceil_div(width, 16) *
               ceil_div(height, 16);
    case DH_TOKENS_PATCH:
        return ceil_div(frames, m->tpatch) * ceil_div(width, m->patch) *
               ceil_div(height, m->patch);
    }
    return 0;
}

int64_t dh_text_tokens(int64_t bytes)
{
    return bytes > 0 ? ceil_div(bytes, 4) : 0;
}

int dh_audio_tokens_parse(const char *spec, struct dh_audio_tokens *t,
                          struct dh_err *e)
{
    char *end = NULL;
    double v;

    if (!strcmp(spec, "none"))
        v = 0;
    else if (!strcmp(spec, "whisper"))
        v = 50;
    else if (!strcmp(spec, "qwen-audio"))
        v = 25;
    else {
        errno = 0;
        v = strtod(spec, &end);
        if (!*spec || *end || errno || !(v > 0 && v <= 10000))
            return dh_err_set(e, DH_EINVAL,
                              "audio tokens '%s': whisper (50/s), "
                              "qwen-audio (25/s), none, or tokens per "
                              "second in (0, 10000]",
                              spec);
    }
    t->per_s = v;
    snprintf(t->name, sizeof(t->name), "%s", spec);
    return 0;
}

static void set(struct dh_token_model *m, enum dh_token_family f, int patch,
                int tpatch, const char *name)
{
    m->family = f;
    m->patch = patch;
    m->tpatch = tpatch;
    snprintf(m->name, sizeof(m->name), "%s", name);
}

static int parse_custom(const char *spec, struct dh_token_model *m)
{
    long p, t = 1;
    char *end;

    if (strncmp(spec, "patch=", 6))
        return -1;
    p = strtol(spec + 6, &end, 10);
    if (end == spec + 6 || p <= 0 || p > 4096)
        return -1;
    if (*end == ',') {
        const char *ts = end + 1;
        if (strncmp(ts, "tpatch=", 7))
            return -1;
        t = strtol(ts + 7, &end, 10);
        if (end == ts + 7 || t <= 0 || t > 4096)
            return -1;
    }
    if (*end)
        return -1;
    set(m, DH_TOKENS_PATCH, (int)p, (int)t, "");
    snprintf(m->name, sizeof(m->name), "patch=%ld,tpatch=%ld", p, t);
    return 0;
}

int dh_token_model_parse(const char *spec, struct dh_token_model *m,
                         struct dh_err *e)
{
    if (!strcmp(spec, "qwen-vl"))
        set(m, DH_TOKENS_QWEN_VL, 28, 2, spec);
    else if (!strcmp(spec, "videomae"))
        set(m, DH_TOKENS_VIDEOMAE, 16, 2, spec);
    else if (!strcmp(spec, "dit"))
        set(m, DH_TOKENS_DIT, 16, 4, spec);
    else if (parse_custom(spec, m))
        return dh_err_set(e, DH_EINVAL,
                          "token model '%s': expected qwen-vl, videomae, dit "
                          "or patch=P,tpatch=T",
                          spec);
    return 0;
}
