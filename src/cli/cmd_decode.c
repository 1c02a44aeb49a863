/*
 * cmd_decode.c - `datahelix decode`: runs the media pipeline (media.h) on
 * files, optionally writes the raw tensors, and reports per-file cost.
 *
 * Design: one struct dh_media and one output buffer serve every file, as a
 * worker would use them, so the numbers include the reuse the library is
 * built for.  The buffer only grows.  --repeat R decodes each file R times
 * (open to decode, the part a training sample pays) and reports the median,
 * which is what bench/bench_decode.py reads.  --size native resolves the
 * plan per file (dh_media_plan_resolve): each file at its own size.  A file that fails is reported
 * and skipped; the exit status says whether any did.
 *
 * Locking: single-threaded.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "cli/cli.h"
#include "core/alloc.h"
#include "datahelix/audio.h"
#include "datahelix/media.h"
#include "datahelix/media_reuse.h"
#include "datahelix/probe.h"
#include "media/shard_walk.h"

#define MAX_REPEAT 1000

struct decode_opts {
    struct dh_media_plan plan;
    int64_t *indices; /* owned; plan.indices points here */
    int64_t nindices;
    int frames_given;
    int64_t threads;
    int64_t repeat;
    const char *out;
    int json;
    int no_reuse; /* --no-decoder-reuse */
    int native;   /* --size native: DH_GEOM_NATIVE after all options */
    int audio;    /* --audio: each file's sound over its frames' span too */
    int64_t audio_rate, audio_channels;
};

/* Per-run state: the reused pipeline, buffer and output stream. */
struct decode_run {
    const struct decode_opts *o;
    struct dh_media *m;
    unsigned char *buf;
    size_t cap;
    FILE *out;
    struct dh_media_plan cur; /* the plan of the current file, resolved */
    double *ms;               /* repeat timings of the current file */
    double *open_ms;          /* ... and of its open part */
    int64_t files, failed, frames;
    double seconds;
    int64_t audio_n;   /* the current file's sound: samples per channel, */
    int audio_missing; /* or none (no audio stream) */
    double audio_t0, audio_t1;
};

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: datahelix decode [options] PATH...\n"
        "\n"
        "Decodes the frames a sampling plan picks from each file, scaled into one\n"
        "tensor per file (see docs/media.md), and reports what it cost.\n"
        "\n"
        "  -n, --frames N        frames per clip (fps: a cap, 0 = none)          [16]\n"
        "  -p, --plan PLAN       uniform | fps:F | jitter | all | indices:I,J,K\n"
        "                                                                [uniform]\n"
        "      --seed S          seed for jitter and random-crop                  [0]\n"
        "  -s, --size WxH        output size, or native: each file at its own\n"
        "                        size (then --max-side, --max-area, --patch)\n"
        "                                                                [224x224]\n"
        "      --max-side N      native: the longer side at most N            [0]\n"
        "      --max-area N      native: width x height of a frame at most N  [0]\n"
        "      --patch N         native: each side a multiple of N (28: Qwen-VL)\n"
        "                                                                     [0]\n"
        "      --geometry G      crop | stretch | random-crop                  [crop]\n"
        "      --layout L        thwc | tchw                                   [thwc]\n"
        "      --dtype D         uint8 | float32 (ImageNet mean/std)          [uint8]\n"
        "      --pad P           repeat | zero: frames past a short clip's end\n"
        "                                                                 [repeat]\n"
        "      --snap M          exact | ref | key: take the nearest reference frame\n"
        "                        or keyframe instead of the exact one       [exact]\n"
        "      --snap-tol F      snap tolerance in frames (0: half the stride)    [0]\n"
        "      --max-pixels N    cap on frames x width x height of one file's output;\n"
        "                        a plan over it is refused before decoding [268435456]\n"
        "  -t, --threads T       decoder threads per file (0: FFmpeg's choice)    [1]\n"
        "  -r, --repeat R        decode each file R times, report the median ms   [1]\n"
        "  -o, --out FILE        write the raw tensors, one after another, to FILE\n"
        "                        (- for stdout; exactly the tensor bytes, no header)\n"
        "      --no-decoder-reuse  open a decoder for every file (by default a file\n"
        "                        takes over the previous file's decoder when their\n"
        "                        codec parameters are the same; docs/media.md)\n"
        "      --cache-dir DIR   keep chunks of s3:// and http(s):// inputs in DIR\n"
        "      --cache-bytes N   the cache's bound             [10737418240]\n"
        "      --ca-bundle FILE  the CAs that https:// inputs are checked against\n"
        "                        (PEM; default: the system's)\n"
        "      --audio           also decode each file's sound over the span its\n"
        "                        frames cover, and report its sample count\n"
        "      --audio-rate R    the sound's rate, Hz                        [16000]\n"
        "      --audio-channels C  1 or 2                                        [1]\n"
        "      --json            one JSON object per file and a total, on stdout\n"
        "  -h, --help            this text\n"
        "\n"
        "Exit status: 0 when every file decoded, 1 when any failed (each failure\n"
        "is one line on stderr), 2 for bad usage.\n");
}

enum {
    OPT_SEED = 256,
    OPT_GEOM,
    OPT_LAYOUT,
    OPT_DTYPE,
    OPT_PAD,
    OPT_SNAP,
    OPT_SNAPTOL,
    OPT_JSON,
    OPT_NOREUSE,
    OPT_MAXPX,
    OPT_MAXSIDE,
    OPT_MAXAREA,
    OPT_PATCH,
    OPT_CA,
    OPT_CACHE_DIR,
    OPT_CACHE_BYTES,
    OPT_AUDIO,
    OPT_AUDIO_RATE,
    OPT_AUDIO_CH
};

static const struct option longopts[] = {
    {"frames", required_argument, NULL, 'n'},
    {"plan", required_argument, NULL, 'p'},
    {"seed", required_argument, NULL, OPT_SEED},
    {"size", required_argument, NULL, 's'},
    {"geometry", required_argument, NULL, OPT_GEOM},
    {"layout", required_argument, NULL, OPT_LAYOUT},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"pad", required_argument, NULL, OPT_PAD},
    {"snap", required_argument, NULL, OPT_SNAP},
    {"snap-tol", required_argument, NULL, OPT_SNAPTOL},
    {"max-pixels", required_argument, NULL, OPT_MAXPX},
    {"max-side", required_argument, NULL, OPT_MAXSIDE},
    {"max-area", required_argument, NULL, OPT_MAXAREA},
    {"patch", required_argument, NULL, OPT_PATCH},
    {"threads", required_argument, NULL, 't'},
    {"repeat", required_argument, NULL, 'r'},
    {"out", required_argument, NULL, 'o'},
    {"json", no_argument, NULL, OPT_JSON},
    {"no-decoder-reuse", no_argument, NULL, OPT_NOREUSE},
    {"ca-bundle", required_argument, NULL, OPT_CA},
    {"cache-dir", required_argument, NULL, OPT_CACHE_DIR},
    {"cache-bytes", required_argument, NULL, OPT_CACHE_BYTES},
    {"audio", no_argument, NULL, OPT_AUDIO},
    {"audio-rate", required_argument, NULL, OPT_AUDIO_RATE},
    {"audio-channels", required_argument, NULL, OPT_AUDIO_CH},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* ---- option values ---- */

struct name_val {
    const char *name;
    int val;
};

/* Looks `s` up in a NULL-terminated table; -1 when absent. */
static int lookup(const struct name_val *t, const char *s)
{
    for (; t->name; t++)
        if (!strcmp(t->name, s))
            return t->val;
    return -1;
}

static const struct name_val geometries[] = {
    {"crop", DH_GEOM_CROP},
    {"stretch", DH_GEOM_STRETCH},
    {"random-crop", DH_GEOM_RANDOM_CROP},
    {NULL, 0}};
static const struct name_val layouts[] = {
    {"thwc", DH_LAYOUT_THWC}, {"tchw", DH_LAYOUT_TCHW}, {NULL, 0}};
static const struct name_val dtypes[] = {
    {"uint8", DH_DTYPE_U8}, {"float32", DH_DTYPE_F32}, {NULL, 0}};
static const struct name_val pads[] = {
    {"repeat", DH_PAD_REPEAT}, {"zero", DH_PAD_ZERO}, {NULL, 0}};
static const struct name_val snaps[] = {{"exact", DH_SNAP_EXACT},
                                        {"ref", DH_SNAP_REF},
                                        {"key", DH_SNAP_KEY},
                                        {NULL, 0}};

/* "I,J,K" -> o->indices; each a non-negative integer, at most the cap. */
static int parse_indices(const char *s, struct decode_opts *o)
{
    int64_t n = 0;
    char *end;

    dh__free(o->indices);
    o->indices = dh__malloc(DH_MEDIA_MAX_FRAMES * sizeof(*o->indices));
    if (!o->indices)
        return -1;
    for (;;) {
        long long v;

        if (*s < '0' || *s > '9' || n == DH_MEDIA_MAX_FRAMES)
            return -1; /* also rejects signs, spaces and empty items */
        errno = 0;
        v = strtoll(s, &end, 10);
        if (errno)
            return -1;
        o->indices[n++] = v;
        if (*end == '\0')
            break;
        if (*end != ',')
            return -1;
        s = end + 1;
    }
    o->plan.indices = o->indices;
    o->nindices = n;
    return 0;
}

static int parse_plan(const char *s, struct decode_opts *o)
{
    struct dh_media_plan *p = &o->plan;

    if (!strcmp(s, "uniform")) {
        p->kind = DH_PLAN_UNIFORM;
    } else if (!strcmp(s, "jitter")) {
        p->kind = DH_PLAN_JITTER;
    } else if (!strcmp(s, "all")) {
        p->kind = DH_PLAN_ALL;
    } else if (!strncmp(s, "fps:", 4)) {
        p->kind = DH_PLAN_FPS;
        if (dh_cli_parse_double(s + 4, 1e-6, 1e6, &p->fps))
            return dh_cli_usage_error("decode",
                                      "--plan '%s': expected "
                                      "fps:F with F > 0",
                                      s);
    } else if (!strncmp(s, "indices:", 8)) {
        p->kind = DH_PLAN_INDICES;
        if (parse_indices(s + 8, o))
            return dh_cli_usage_error("decode",
                                      "--plan '%s': expected "
                                      "indices:I,J,K (1..%d indices >= 0)",
                                      s, DH_MEDIA_MAX_FRAMES);
    } else {
        return dh_cli_usage_error("decode",
                                  "--plan '%s': expected uniform, "
                                  "fps:F, jitter, all or indices:I,J,K",
                                  s);
    }
    return 0;
}

/* An enum option: table lookup or a usage error naming the choices. */
static int parse_enum(const struct name_val *t, const char *opt,
                      const char *choices, int *out)
{
    int v = lookup(t, optarg);

    if (v < 0)
        return dh_cli_usage_error("decode", "--%s '%s': expected %s", opt,
                                  optarg, choices);
    *out = v;
    return 0;
}

static int parse_number(int c, struct decode_opts *o)
{
    struct dh_media_plan *p = &o->plan;
    int64_t v;

    switch (c) {
    case 'n':
        if (dh_cli_parse_i64(optarg, 0, DH_MEDIA_MAX_FRAMES, &p->frames))
            return dh_cli_usage_error("decode",
                                      "--frames '%s': expected "
                                      "0..%d",
                                      optarg, DH_MEDIA_MAX_FRAMES);
        o->frames_given = 1;
        return 0;
    case OPT_SEED:
        if (dh_cli_parse_i64(optarg, 0, INT64_MAX, &v))
            return dh_cli_usage_error("decode",
                                      "--seed '%s': expected a "
                                      "non-negative integer",
                                      optarg);
        p->seed = (uint64_t)v;
        return 0;
    case OPT_MAXPX:
        if (dh_cli_parse_i64(optarg, 1, INT64_MAX, &p->max_pixels))
            return dh_cli_usage_error("decode",
                                      "--max-pixels '%s': "
                                      "expected a positive integer",
                                      optarg);
        return 0;
    case OPT_MAXSIDE:
        if (dh_cli_parse_i64(optarg, 0, 16384, &v))
            return dh_cli_usage_error(
                "decode", "--max-side '%s': expected 0..16384", optarg);
        p->max_side = (int32_t)v;
        return 0;
    case OPT_MAXAREA:
        if (dh_cli_parse_i64(optarg, 0, DH_MEDIA_MAX_PIXELS, &p->max_area))
            return dh_cli_usage_error("decode",
                                      "--max-area '%s': expected 0..%" PRId64,
                                      optarg, DH_MEDIA_MAX_PIXELS);
        return 0;
    case OPT_PATCH:
        if (dh_cli_parse_i64(optarg, 0, DH_MEDIA_MAX_PATCH, &v))
            return dh_cli_usage_error("decode", "--patch '%s': expected 0..%d",
                                      optarg, DH_MEDIA_MAX_PATCH);
        p->patch = (int32_t)v;
        return 0;
    case OPT_SNAPTOL:
        if (dh_cli_parse_double(optarg, 0, 1e9, &p->snap_tol))
            return dh_cli_usage_error("decode",
                                      "--snap-tol '%s': expected "
                                      "a number >= 0",
                                      optarg);
        return 0;
    case OPT_AUDIO_RATE:
        return dh_cli_opt_i64("decode", "audio-rate", optarg, DH_AUDIO_MIN_RATE,
                              DH_AUDIO_MAX_RATE, &o->audio_rate);
    case OPT_AUDIO_CH:
        return dh_cli_opt_i64("decode", "audio-channels", optarg, 1, 2,
                              &o->audio_channels);
    case 't':
        if (dh_cli_parse_i64(optarg, 0, 256, &o->threads))
            return dh_cli_usage_error("decode",
                                      "--threads '%s': expected "
                                      "0..256",
                                      optarg);
        return 0;
    default: /* 'r' */
        if (dh_cli_parse_i64(optarg, 1, MAX_REPEAT, &o->repeat))
            return dh_cli_usage_error("decode",
                                      "--repeat '%s': expected "
                                      "1..%d",
                                      optarg, MAX_REPEAT);
        return 0;
    }
}

static int parse_opt(void *ctx, int c)
{
    struct decode_opts *o = ctx;
    struct dh_media_plan *p = &o->plan;
    int v = 0, rc = 0;

    switch (c) {
    case 'p':
        return parse_plan(optarg, o);
    case 's':
        o->native = !strcmp(optarg, "native");
        return o->native ? 0 : dh_cli_opt_size("decode", optarg, p);
    case 'o':
        o->out = optarg;
        return 0;
    case OPT_JSON:
        o->json = 1;
        return 0;
    case OPT_CA:
        return dh_cli_opt_ca_bundle("decode", optarg);
    case OPT_CACHE_DIR:
        return dh_cli_opt_cache_dir("decode", optarg);
    case OPT_CACHE_BYTES:
        return dh_cli_opt_cache_bytes("decode", optarg);
    case OPT_NOREUSE:
        o->no_reuse = 1;
        return 0;
    case OPT_AUDIO:
        o->audio = 1;
        return 0;
    case OPT_GEOM:
        if (!(rc = parse_enum(geometries, "geometry",
                              "crop, stretch or random-crop", &v)))
            p->geometry = (enum dh_geometry)v;
        return rc;
    case OPT_LAYOUT:
        if (!(rc = parse_enum(layouts, "layout", "thwc or tchw", &v)))
            p->layout = (enum dh_layout)v;
        return rc;
    case OPT_DTYPE:
        if (!(rc = parse_enum(dtypes, "dtype", "uint8 or float32", &v)))
            p->dtype = (enum dh_dtype)v;
        return rc;
    case OPT_PAD:
        if (!(rc = parse_enum(pads, "pad", "repeat or zero", &v)))
            p->pad = (enum dh_pad)v;
        return rc;
    case OPT_SNAP:
        if (!(rc = parse_enum(snaps, "snap", "exact, ref or key", &v)))
            p->snap = (enum dh_snap)v;
        return rc;
    default:
        return parse_number(c, o);
    }
}

/* Cross-option rules, then the library's own plan check. */
static int check_opts(struct decode_opts *o, int npaths)
{
    struct dh_err e;

    if (npaths < 1)
        return dh_cli_usage_error("decode", "no PATH given");
    if (o->json && o->out && !strcmp(o->out, "-"))
        return dh_cli_usage_error("decode", "--json and --out - both want "
                                            "stdout");
    /* An fps plan is capped only when asked: its frame count is the
     * clip's duration times F, not the uniform default of 16. */
    if (o->plan.kind == DH_PLAN_FPS && !o->frames_given)
        o->plan.frames = 0;
    /* The list sets the count, whatever order --frames came in. */
    if (o->plan.kind == DH_PLAN_INDICES)
        o->plan.frames = o->nindices;
    if (o->native)
        o->plan.geometry = DH_GEOM_NATIVE;
    dh_err_clear(&e);
    if (dh_media_plan_check(&o->plan, &e))
        return dh_cli_usage_error("decode", "%s", e.msg);
    return 0;
}

DH_CLI_CMD("decode", ":n:p:s:t:r:o:h", longopts, parse_opt, -1, usage);

static int parse_args(int argc, char **argv, struct decode_opts *o)
{
    int rc;

    memset(o, 0, sizeof(*o));
    dh_media_plan_init(&o->plan);
    o->threads = 1;
    o->repeat = 1;
    o->audio_rate = 16000;
    o->audio_channels = 1;
    /* -1 tells the caller --help was shown */
    if ((rc = dh_cli_getopt(&cli_cmd, argc, argv, o, NULL)) != DH_CLI_RUN)
        return rc == DH_EXIT_OK ? -1 : rc;
    return check_opts(o, argc - optind);
}

/* ---- decoding ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* Median of v[0..n) (sorts v); n >= 1. */
static double median(double *v, int64_t n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Grows the reused buffer to `need` bytes; its contents are not kept,
 * so growing is a free and a malloc rather than a copying realloc. */
static int ensure_buf(struct decode_run *r, size_t need, const char *path,
                      struct dh_err *e)
{
    if (need <= r->cap)
        return 0;
    dh__free(r->buf);
    r->cap = 0;
    r->buf = dh__malloc(need);
    if (!r->buf)
        return dh_err_set(e, DH_ENOMEM,
                          "%s: out of memory for a %zu-byte "
                          "tensor",
                          path, need);
    r->cap = need;
    return 0;
}

/* --audio: the sound of the span the decoded frames cover, as a loader's
 * batch row holds it (its samples counted; a file without sound has
 * none, which is not a failure). */
static int decode_sound(struct decode_run *r, const struct dh_source_ref *ref,
                        const char *path, struct dh_err *e)
{
    struct dh_audio_opts ao = {.rate = (int)r->o->audio_rate,
                               .channels = (int)r->o->audio_channels};
    struct dh_audio a;
    int rc;

    r->audio_n = 0;
    r->audio_missing = 0;
    if (dh__media_span(r->m, &r->cur, &ao.start_s, &ao.end_s))
        return dh_err_set(e, DH_EMEDIA, "%s: no frame to time the sound by",
                          path);
    r->audio_t0 = ao.start_s;
    r->audio_t1 = ao.end_s;
    rc = dh_audio_decode(ref, &ao, &a, e);
    if (rc && (r->audio_missing = a.missing)) {
        dh_err_clear(e);
        return 0;
    }
    if (rc)
        return rc;
    r->audio_n = a.n;
    dh_audio_free(&a);
    return 0;
}

/* One open + select + decode of `path` (what a training sample pays);
 * *ms is its wall time, *open_ms the open's part of it (container, frame
 * table, decoder: what reusing them across files could save).  The file
 * stays open for the report. */
static int decode_once(struct decode_run *r, const struct dh_source_ref *ref,
                       const char *path, struct dh_media_result *res,
                       double *ms, double *open_ms, struct dh_err *e)
{
    const struct dh_media_plan *p = &r->cur;
    struct dh_media_info info;
    double t0 = dh_cli_now();
    int64_t frames;
    size_t bytes;
    int rc;

    if ((rc = dh_media_open_ref(r->m, ref, e)))
        return rc;
    *open_ms = (dh_cli_now() - t0) * 1e3;
    if ((rc = dh_media_info(r->m, &info)))
        return dh_err_set(e, rc, "%s: no stream information", path);
    if ((rc = dh_media_plan_resolve(&r->o->plan, &info, &r->cur, e)) ||
        (rc = dh_media_select(r->m, p, &frames, e)))
        return rc;
    bytes = dh_media_plan_bytes(p, frames);
    if (bytes > SIZE_MAX - DH_MEDIA_DST_PAD)
        return dh_err_set(e, DH_ETOOBIG,
                          "%s: %" PRId64 " frames of %dx%d "
                          "do not fit in memory",
                          path, frames, p->width, p->height);
    if ((rc = ensure_buf(r, bytes + DH_MEDIA_DST_PAD, path, e)))
        return rc;
    rc = dh_media_decode(r->m, p, r->buf, r->cap, res, e);
    if (!rc && r->o->audio)
        rc = decode_sound(r, ref, path, e);
    *ms = (dh_cli_now() - t0) * 1e3;
    return rc;
}

/* ---- reporting ---- */

/* A JSON string for a path that may not be UTF-8 (then bytes >= 0x80
 * become '?', so the line stays valid JSON). */
static json_t *path_json(const char *path)
{
    json_t *s = json_string(path);
    char *copy;

    if (s || !(copy = dh__strdup(path)))
        return s;
    for (char *c = copy; *c; c++)
        if ((unsigned char)*c >= 0x80)
            *c = '?';
    s = json_string(copy);
    dh__free(copy);
    return s;
}

static json_t *indices_json(const struct dh_media *m, int64_t n)
{
    const int64_t *idx = dh_media_indices(m);
    json_t *a = json_array();

    for (int64_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_integer(idx ? idx[i] : -1));
    return a;
}

/* Prints one compact JSON object as a line; consumes `o`. */
static void print_json(json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER |
                                    JSON_REAL_PRECISION(6))
                : NULL;

    if (s)
        puts(s);
    else
        dh_cli_error("decode", "out of memory formatting JSON");
    free(s);
    json_decref(o);
}

/* reused: decoders the file's repeats took over from a previous file. */
static void report_file(struct decode_run *r, const char *path,
                        const struct dh_media_result *res, double ms,
                        double open_ms, int64_t reused)
{
    const struct dh_media_plan *p = &r->cur;
    json_t *o;

    if (!r->o->json) {
        fprintf(stderr,
                "decode: %s: %" PRId64 " frames %dx%d (%" PRId64
                " valid), %.2f ms (open %.2f), %" PRId64 " decoded, %" PRId64
                " seeks, decoder reused %" PRId64 "/%" PRId64,
                path, res->frames, p->width, p->height, res->valid_frames, ms,
                open_ms, res->decoded_frames, res->seeks, reused, r->o->repeat);
        if (p->snap != DH_SNAP_EXACT)
            fprintf(stderr, ", mean shift %.2f", res->mean_abs_shift);
        if (res->seek_fallbacks)
            fputs(", a seek missed: decoded forward from the start", stderr);
        if (r->o->audio && r->audio_missing)
            fputs(", audio: none (no audio stream)", stderr);
        else if (r->o->audio)
            fprintf(stderr,
                    ", audio %" PRId64 " samples x %d ch at %d Hz "
                    "(%.3f..%.3f s)",
                    r->audio_n, (int)r->o->audio_channels,
                    (int)r->o->audio_rate, r->audio_t0, r->audio_t1);
        fputc('\n', stderr);
        return;
    }
    o = json_pack("{s:o, s:I, s:i, s:i, s:I, s:f, s:f, s:I, s:I, s:I, s:o}",
                  "path", path_json(path), "frames", (json_int_t)res->frames,
                  "height", (int)p->height, "width", (int)p->width,
                  "valid_frames", (json_int_t)res->valid_frames, "decode_ms",
                  ms, "open_ms", open_ms, "decoded_frames",
                  (json_int_t)res->decoded_frames, "seeks",
                  (json_int_t)res->seeks, "seek_fallbacks",
                  (json_int_t)res->seek_fallbacks, "indices",
                  indices_json(r->m, res->frames));
    if (o)
        json_object_set_new(o, "decoder_reused", json_integer(reused));
    if (o && p->snap != DH_SNAP_EXACT)
        json_object_set_new(o, "mean_abs_shift",
                            json_real(res->mean_abs_shift));
    if (o && r->o->audio) {
        json_object_set_new(o, "audio_samples", json_integer(r->audio_n));
        json_object_set_new(o, "audio_start_s", json_real(r->audio_t0));
        json_object_set_new(o, "audio_end_s", json_real(r->audio_t1));
        json_object_set_new(o, "audio_stream", json_boolean(!r->audio_missing));
    }
    print_json(o);
}

static void report_total(const struct decode_run *r)
{
    double fps = r->seconds > 0 ? (double)r->frames / r->seconds : 0;
    int64_t opens, reuses;

    dh__media_decoder_counts(r->m, &opens, &reuses);
    if (r->o->json) {
        print_json(
            json_pack("{s:I, s:I, s:I, s:f, s:f, s:I, s:I}", "files",
                      (json_int_t)r->files, "failed", (json_int_t)r->failed,
                      "frames", (json_int_t)r->frames, "seconds", r->seconds,
                      "frames_per_s", fps, "decoder_opens", (json_int_t)opens,
                      "decoder_reuses", (json_int_t)reuses));
        return;
    }
    fprintf(stderr,
            "decode: %" PRId64 " files, %" PRId64 " failed, %" PRId64
            " frames in %.3f s (%.0f frames/s); %" PRId64
            " decoders opened, %" PRId64 " taken over\n",
            r->files, r->failed, r->frames, r->seconds, fps, opens, reuses);
}

/* ---- per file ---- */

/* Appends the tensor (exactly the plan's bytes: the pad is not output).
 * A write error ends the run: every later file would fail the same way. */
static int write_tensor(struct decode_run *r, int64_t frames)
{
    size_t n = dh_media_plan_bytes(&r->cur, frames);

    if (!r->out || fwrite(r->buf, 1, n, r->out) == n)
        return 0;
    dh_cli_error("decode", "%s: write failed: %s", r->o->out, strerror(errno));
    return -1;
}

/* Decodes one file --repeat times.  Returns -1 only for a fatal error;
 * a file that fails to decode is reported and counted. */
static int decode_file(struct decode_run *r, const struct dh_source_ref *ref,
                       const char *path)
{
    struct dh_media_result res;
    struct dh_err e;
    int64_t opens, reuses0, reuses;
    double ms;
    int rc = 0;

    dh__media_decoder_counts(r->m, &opens, &reuses0);
    for (int64_t i = 0; i < r->o->repeat; i++) {
        dh_err_clear(&e);
        memset(&res, 0, sizeof(res));
        if (decode_once(r, ref, path, &res, &r->ms[i], &r->open_ms[i], &e)) {
            dh_cli_error("decode", "%s", e.msg[0] ? e.msg : path);
            r->failed++;
            goto out_close;
        }
    }
    ms = median(r->ms, r->o->repeat);
    dh__media_decoder_counts(r->m, &opens, &reuses);
    report_file(r, path, &res, ms, median(r->open_ms, r->o->repeat),
                reuses - reuses0);
    r->files++;
    r->frames += res.frames;
    r->seconds += ms / 1e3;
    rc = write_tensor(r, res.frames);
out_close:
    dh_media_close(r->m);
    return rc;
}

/* A tar shard or a table (.jsonl: its rows' files and shard members) is
 * decoded item by item; any other PATH as one file. */
static int decode_input(struct decode_run *r, const char *path)
{
    struct dh_source_ref one = {.path = path};
    struct dh_probe_list l;
    struct dh_err e;
    size_t n = strlen(path);
    int rc = 0;

    if (!(n > 4 && !strcasecmp(path + n - 4, ".tar")) &&
        !(n > 6 && !strcasecmp(path + n - 6, ".jsonl")) &&
        !dh__shard_sniff(path))
        return decode_file(r, &one, path);
    dh_probe_list_init(&l);
    dh_err_clear(&e);
    if (dh_probe_list_add_input(&l, path, &e)) {
        dh_cli_error("decode", "%s", e.msg);
        r->failed++;
    }
    for (size_t i = 0; i < l.nproblems; i++) {
        dh_cli_error("decode", "%s", l.problems[i]);
        r->failed++;
    }
    for (size_t i = 0; i < l.count && !rc; i++) {
        const struct dh_probe_item *it = &l.items[i];
        struct dh_source_ref ref = {it->path, it->member, it->offset,
                                    it->member ? it->size : it->row_size,
                                    it->member ? 0 : it->row_mtime_ns};

        rc = decode_file(r, &ref, dh_probe_item_name(it));
    }
    dh_probe_list_fini(&l);
    return rc;
}

/* ---- entry ---- */

static int open_out(struct decode_run *r, const char *path)
{
    if (!path)
        return 0;
    if (!strcmp(path, "-")) {
        r->out = stdout;
        return 0;
    }
    r->out = fopen(path, "wb");
    if (r->out)
        return 0;
    dh_cli_error("decode", "%s: cannot open for writing: %s", path,
                 strerror(errno));
    return -1;
}

static int close_out(struct decode_run *r)
{
    int bad;

    if (!r->out)
        return 0;
    bad = r->out == stdout ? fflush(stdout) : fclose(r->out);
    r->out = NULL;
    if (!bad)
        return 0;
    dh_cli_error("decode", "%s: write failed: %s", r->o->out, strerror(errno));
    return -1;
}

static int run(struct decode_run *r, int npaths, char **paths)
{
    struct dh_err e;
    int rc = 0;

    dh_err_clear(&e);
    r->ms = dh__malloc((size_t)r->o->repeat * sizeof(*r->ms));
    r->open_ms = dh__malloc((size_t)r->o->repeat * sizeof(*r->open_ms));
    if (!r->ms || !r->open_ms) {
        dh_cli_error("decode", "out of memory");
        return -1;
    }
    if (dh_media_create(&r->m, &e)) {
        dh_cli_error("decode", "%s", e.msg);
        return -1;
    }
    dh_media_set_threads(r->m, (int)r->o->threads);
    dh__media_set_decoder_reuse(r->m, !r->o->no_reuse);
    for (int i = 0; i < npaths && !rc; i++)
        rc = decode_input(r, paths[i]);
    if (!rc)
        report_total(r);
    return rc;
}

int dh_cmd_decode(int argc, char **argv)
{
    struct decode_opts o;
    struct decode_run r;
    int rc;

    dh__alloc_init();
    rc = parse_args(argc, argv, &o);
    if (rc)
        goto out_free_opts;
    memset(&r, 0, sizeof(r));
    r.o = &o;
    rc = open_out(&r, o.out) ? -1 : run(&r, argc - optind, argv + optind);
    if (close_out(&r))
        rc = -1;
    dh_media_destroy(r.m);
    dh__free(r.buf);
    dh__free(r.ms);
    dh__free(r.open_ms);
    rc = rc || r.failed ? DH_EXIT_FAIL : DH_EXIT_OK;
out_free_opts:
    dh__free(o.indices);
    return rc < 0 ? DH_EXIT_OK : rc;
}
