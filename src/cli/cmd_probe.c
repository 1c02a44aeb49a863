/*
 * cmd_probe.c - `datahelix probe`: INPUTs -> descriptor table (DESIGN 4.1,
 * 4.2).  Expands inputs, probes files on --jobs threads (results kept in
 * input order so ids are reproducible), optionally calibrates the cost
 * model by decoding K files per profile, then estimates and writes.
 * --verify adds a full decode of every file between probing and
 * calibrating (probe_verify.c) and leaves out the files that fail.
 *
 * Locking: workers claim items through an atomic counter and write only
 * their own result slot; one mutex serialises error lines on stderr.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/probe_verify.h"
#include "core/alloc.h"
#include "datahelix/estimate.h"
#include "datahelix/index.h"
#include "datahelix/probe.h"

#define MAX_JOBS DH_CLI_MAX_THREADS

struct probe_opts {
    const char *out;
    const char *index_out;
    int64_t jobs;
    int64_t calibrate;
    int keep_going;
    int quiet;
    int summary;
    int verify;
    struct dh_estimator est;
};

struct probe_run {
    const struct probe_opts *o;
    struct dh_probe_list list;
    struct dh_desc *descs;
    int *ok;
    atomic_size_t next;
    atomic_size_t done;
    atomic_size_t failed;
    atomic_size_t unchecked; /* probed, but not checkable for truncation */
    atomic_int stop;
    pthread_mutex_t err_lock;
    struct probe_verify_stats vst; /* --verify */
};

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: datahelix probe [options] --out M.jsonl INPUT...\n"
        "\n"
        "Scans media into a descriptor table, one JSON object per sample (DESIGN 4.2).\n"
        "INPUT: a file, a folder (walked recursively, media/text extensions only),\n"
        "or a .jsonl list of {\"path\": ..., \"text\": caption} (paths relative to it).\n"
        "A WebDataset tar shard (.tar, or a file that starts with a tar header)\n"
        "is read in place: one row per key (KEY.mp4 + KEY.txt/.json caption) with\n"
        "path = the shard, member, offset, bytes (docs/shards.md).\n"
        "\n"
        "  -o, --out FILE        table to write (- for stdout)                [required]\n"
        "      --index FILE.dhx  also write the compact binary index\n"
        "  -j, --jobs N          probe threads                    [default: CPU count]\n"
        "      --calibrate K     fit the CPU-cost model by decoding K files per profile\n"
        "      --tokens MODEL    qwen-vl | videomae | dit | patch=P,tpatch=T [qwen-vl]\n"
        "      --audio-tokens A  a clip's sound in est_tokens: whisper (50/s),\n"
        "                        qwen-audio (25/s) or N per second, over the span\n"
        "                        its sampled frames cover                    [none]\n"
        "      --frames SPEC     sampling plan frames: N | fps:F | all        [fps:8]\n"
        "      --max-frames N    cap on frames derived from fps (0: none)      [256]\n"
        "      --size SPEC       sampling plan size: WxH | native            [native]\n"
        "      --max-side N      with native size, shrink the longer side to N    [0]\n"
        "      --verify          decode every video and image in full and leave out\n"
        "                        the files that fail (each on stderr); the header\n"
        "                        records it.  Resumable: verdicts go to OUT.verify.jsonl\n"
        "                        as files finish, and a re-run decodes only files\n"
        "                        not in it or changed since (size, mtime).  Progress\n"
        "                        is a line every $DATAHELIX_PROGRESS_S s (10) when\n"
        "                        stderr is not a terminal\n"
        "      --keep-going      report unreadable files and go on          [default]\n"
        "      --fail-fast       stop at the first unreadable file (exit 1)\n"
        "      --summary         print a per-profile summary of the table\n"
        "                        (stdout; stderr when the table goes to stdout)\n"
        "      --ca-bundle FILE  the CAs that https:// inputs are checked against\n"
        "                        (PEM; default: the system's)\n"
        "  -q, --quiet           no closing line on stderr\n"
        "  -h, --help            this text\n"
        "\n"
        "Exit status: 0 when at least one file was probed (unreadable files are\n"
        "listed on stderr and left out), 1 otherwise or with --fail-fast on error.\n");
}

enum {
    OPT_INDEX = 256,
    OPT_CAL,
    OPT_TOKENS,
    OPT_AUDIO_TOKENS,
    OPT_FRAMES,
    OPT_MAXF,
    OPT_SIZE,
    OPT_MAXSIDE,
    OPT_KEEP,
    OPT_FAILFAST,
    OPT_SUMMARY,
    OPT_VERIFY,
    OPT_CA
};

static const struct option longopts[] = {
    {"out", required_argument, NULL, 'o'},
    {"index", required_argument, NULL, OPT_INDEX},
    {"jobs", required_argument, NULL, 'j'},
    {"calibrate", required_argument, NULL, OPT_CAL},
    {"tokens", required_argument, NULL, OPT_TOKENS},
    {"audio-tokens", required_argument, NULL, OPT_AUDIO_TOKENS},
    {"frames", required_argument, NULL, OPT_FRAMES},
    {"max-frames", required_argument, NULL, OPT_MAXF},
    {"size", required_argument, NULL, OPT_SIZE},
    {"max-side", required_argument, NULL, OPT_MAXSIDE},
    {"keep-going", no_argument, NULL, OPT_KEEP},
    {"fail-fast", no_argument, NULL, OPT_FAILFAST},
    {"summary", no_argument, NULL, OPT_SUMMARY},
    {"verify", no_argument, NULL, OPT_VERIFY},
    {"quiet", no_argument, NULL, 'q'},
    {"ca-bundle", required_argument, NULL, OPT_CA},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int parse_opt(void *ctx, int c)
{
    struct probe_opts *o = ctx;
    struct dh_err e;
    int64_t v;

    dh_err_clear(&e);
    switch (c) {
    case 'o':
        o->out = optarg;
        return 0;
    case OPT_INDEX:
        o->index_out = optarg;
        return 0;
    case 'q':
        o->quiet = 1;
        return 0;
    case OPT_SUMMARY:
        o->summary = 1;
        return 0;
    case OPT_VERIFY:
        o->verify = 1;
        return 0;
    case OPT_CA:
        return dh_cli_opt_ca_bundle("probe", optarg);
    case OPT_KEEP:
        o->keep_going = 1;
        return 0;
    case OPT_FAILFAST:
        o->keep_going = 0;
        return 0;
    case 'j':
        if (dh_cli_parse_i64(optarg, 1, MAX_JOBS, &o->jobs))
            return dh_cli_usage_error("probe", "--jobs '%s': expected 1..%d",
                                      optarg, MAX_JOBS);
        return 0;
    case OPT_CAL:
        if (dh_cli_parse_i64(optarg, 0, 10000, &o->calibrate))
            return dh_cli_usage_error("probe",
                                      "--calibrate '%s': expected "
                                      "0..10000 files per profile",
                                      optarg);
        return 0;
    case OPT_MAXF:
    case OPT_MAXSIDE:
        if (dh_cli_parse_i64(optarg, 0, 1000000, &v))
            return dh_cli_usage_error("probe",
                                      "--%s '%s': expected a "
                                      "non-negative integer",
                                      c == OPT_MAXF ? "max-frames" : "max-side",
                                      optarg);
        if (c == OPT_MAXF)
            o->est.plan.max_frames = v;
        else
            o->est.plan.max_side = (int32_t)v;
        return 0;
    case OPT_TOKENS:
        if (dh_token_model_parse(optarg, &o->est.tokens, &e))
            return dh_cli_usage_error("probe", "%s", e.msg);
        return 0;
    case OPT_AUDIO_TOKENS:
        if (dh_audio_tokens_parse(optarg, &o->est.audio, &e))
            return dh_cli_usage_error("probe", "%s", e.msg);
        return 0;
    case OPT_FRAMES:
        if (dh_sample_plan_parse_frames(optarg, &o->est.plan, &e))
            return dh_cli_usage_error("probe", "--%s", e.msg);
        return 0;
    case OPT_SIZE:
        if (dh_sample_plan_parse_size(optarg, &o->est.plan, &e))
            return dh_cli_usage_error("probe", "--%s", e.msg);
        return 0;
    default:
        return dh_cli_usage_error("probe", "unknown option");
    }
}

/* Fails before any work when an output cannot be written: probing and
 * calibrating can take hours. */
static int check_output(const char *path)
{
    struct stat st;
    char *dir, *slash;
    int ok;

    if (!strcmp(path, "-"))
        return 0;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return dh_cli_usage_error("probe", "%s: is a folder", path);
    dir = dh__strdup(path);
    if (!dir)
        return DH_EXIT_FAIL;
    slash = strrchr(dir, '/');
    if (slash)
        slash[slash == dir ? 1 : 0] = '\0';
    ok = access(slash ? dir : ".", W_OK | X_OK) == 0;
    if (!ok)
        dh_cli_error("probe", "cannot write %s: %s: %s", path,
                     slash ? dir : ".", strerror(errno));
    dh__free(dir);
    return ok ? 0 : DH_EXIT_FAIL;
}

DH_CLI_CMD("probe", ":o:j:qh", longopts, parse_opt, -1, usage);

static int parse_args(int argc, char **argv, struct probe_opts *o)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    struct dh_err e;
    int rc;

    memset(o, 0, sizeof(*o));
    o->keep_going = 1;
    o->jobs = ncpu > 0 ? (ncpu > MAX_JOBS ? MAX_JOBS : ncpu) : 1;
    dh_sample_plan_default(&o->est.plan);
    if (dh_token_model_parse("qwen-vl", &o->est.tokens, &e))
        return DH_EXIT_FAIL;
    dh_cost_model_default(&o->est.cost);
    /* -1 tells the caller --help was shown */
    if ((rc = dh_cli_getopt(&cli_cmd, argc, argv, o, NULL)) != DH_CLI_RUN)
        return rc == DH_EXIT_OK ? -1 : rc;
    if (!o->out)
        return dh_cli_usage_error("probe", "--out is required");
    if (optind >= argc)
        return dh_cli_usage_error("probe", "no INPUT given");
    if (o->index_out && !strcmp(o->out, "-"))
        return dh_cli_usage_error("probe", "--index needs --out to name a "
                                           "file");
    if ((rc = check_output(o->out)))
        return rc;
    return o->index_out ? check_output(o->index_out) : 0;
}

static void report(struct probe_run *r, const char *msg)
{
    pthread_mutex_lock(&r->err_lock);
    dh_cli_error_line("probe", "%s", msg);
    pthread_mutex_unlock(&r->err_lock);
}

/* A shard key's KEY.wav (or .flac, .mp3, .m4a) is its clip's sound: the
 * row's audio_* fields say what it holds.  A member FFmpeg cannot read
 * costs the row its audio fields only, said on stderr. */
static void probe_audio_member(struct probe_run *r,
                               const struct dh_probe_item *it,
                               struct dh_desc *d)
{
    struct dh_source_ref a = {it->path, it->audio_member, it->audio_offset,
                              it->audio_size};
    struct dh_err e;

    if (!it->audio_member || d->audio_codec[0])
        return;
    dh_err_clear(&e);
    if (dh_probe_audio_ref(&a, d, &e) == 0)
        return;
    memset(d->audio_codec, 0, sizeof(d->audio_codec));
    d->audio_rate = d->audio_channels = 0;
    d->audio_duration_s = d->audio_start_s = 0;
    pthread_mutex_lock(&r->err_lock);
    dh_cli_error_line("probe", "%s: the sample is kept, without its sound",
                      e.msg);
    pthread_mutex_unlock(&r->err_lock);
}

static void *probe_worker(void *arg)
{
    struct probe_run *r = arg;
    struct dh_err e;
    size_t i;

    while (!atomic_load(&r->stop) &&
           (i = atomic_fetch_add(&r->next, 1)) < r->list.count) {
        const struct dh_probe_item *it = &r->list.items[i];
        struct dh_source_ref ref = {it->path, it->member, it->offset, it->size};
        struct dh_probe_notes notes;

        dh_err_clear(&e);
        if (dh_probe_ref_notes(&ref, &r->descs[i], &notes, &e) == 0) {
            r->ok[i] = 1;
            probe_audio_member(r, it, &r->descs[i]);
            if (notes.unchecked)
                atomic_fetch_add(&r->unchecked, 1);
        } else {
            report(r, e.msg);
            atomic_fetch_add(&r->failed, 1);
            if (!r->o->keep_going)
                atomic_store(&r->stop, 1);
        }
        atomic_fetch_add(&r->done, 1);
    }
    return NULL;
}

static void wait_workers(void *arg)
{
    struct probe_run *r = arg;
    struct dh_progress p;
    struct timespec ts = {0, 50 * 1000 * 1000};

    dh_progress_start(&p, "probe", r->list.count);
    while (atomic_load(&r->done) < r->list.count && !atomic_load(&r->stop)) {
        pthread_mutex_lock(&r->err_lock);
        dh_progress_update(&p, atomic_load(&r->done), atomic_load(&r->failed));
        pthread_mutex_unlock(&r->err_lock);
        nanosleep(&ts, NULL);
    }
    dh_progress_finish(&p);
}

static int run_workers(struct probe_run *r)
{
    int64_t n = r->o->jobs;

    if ((size_t)n > r->list.count)
        n = (int64_t)r->list.count;
    dh_cli_run_threads(n, probe_worker, wait_workers, r);
    return 0;
}

/* ---- calibration: decode K files per profile, fit the cost model ---- */

struct cal_set {
    struct dh_cost_features *f;
    double *ms;
    size_t n;
};

static int cal_pick(const struct probe_run *r, size_t i, char (*seen)[32],
                    int64_t *taken, size_t *nseen)
{
    const struct dh_desc *d = &r->descs[i];
    size_t p;

    if (!r->ok[i] || d->kind == DH_KIND_TEXT)
        return 0;
    for (p = 0; p < *nseen; p++)
        if (!strcmp(seen[p], d->profile))
            break;
    if (p == *nseen) {
        if (*nseen == 256)
            return 0;
        snprintf(seen[p], sizeof(seen[p]), "%s", d->profile);
        taken[p] = 0;
        (*nseen)++;
    }
    if (taken[p] >= r->o->calibrate)
        return 0;
    taken[p]++;
    return 1;
}

static void cal_measure(struct probe_run *r, size_t i, struct cal_set *cs)
{
    const struct dh_sample_plan *plan = &r->o->est.plan;
    struct dh_desc *d = &r->descs[i];
    struct dh_err e;
    int64_t frames;
    int32_t w, h;
    double ms;

    dh_sample_plan_output(plan, d, &frames, &w, &h);
    dh_err_clear(&e);
    if (dh_calibrate_decode(d, plan, &ms, &e)) {
        report(r, e.msg);
        return;
    }
    dh_cost_features_of(d, frames, w, h, &cs->f[cs->n]);
    cs->ms[cs->n++] = ms;
}

static int calibrate(struct probe_run *r, struct dh_cost_model *m)
{
    char seen[256][32];
    int64_t taken[256];
    size_t nseen = 0, count = r->list.count;
    struct cal_set cs = {dh__calloc(count, sizeof(*cs.f)),
                         dh__calloc(count, sizeof(double)), 0};
    struct dh_progress p;
    struct dh_err e;
    int rc = 0;

    if (!cs.f || !cs.ms) {
        rc = -1;
        dh_cli_error("probe", "calibration: out of memory");
        goto out_free;
    }
    for (size_t i = 0; i < count; i++) /* profile of every sample first */
        if (r->ok[i])
            dh_estimate(&r->o->est, &r->descs[i]);
    dh_progress_start(&p, "calibrate", count);
    for (size_t i = 0; i < count; i++) {
        if (cal_pick(r, i, seen, taken, &nseen))
            cal_measure(r, i, &cs);
        dh_progress_update(&p, i + 1, 0);
    }
    dh_progress_finish(&p);
    dh_err_clear(&e);
    if (dh_cost_model_fit(cs.f, cs.ms, cs.n, m, &e)) {
        dh_cli_error("probe", "calibration kept the default cost model: %s",
                     e.msg);
        goto out_free;
    }
    if (!r->o->quiet)
        fprintf(stderr,
                "probe: cost model from %zu decodes: %.3f ms + "
                "%.3f ms/src-Mpx + %.3f ms/input-MB + %.3f ms/out-Mpx "
                "(rmse %.2f ms)\n",
                cs.n, m->base_ms, m->ms_per_src_mpx, m->ms_per_in_mb,
                m->ms_per_out_mpx, m->fit_rmse_ms);
out_free:
    dh__free(cs.f);
    dh__free(cs.ms);
    return rc;
}

/* ---- output ---- */

/* Only what every run over the same files writes alike: no timings and no
 * cache counts, so a resumed run's table equals an uninterrupted one's. */
static int add_verified(json_t *h, const struct probe_verify_stats *v)
{
    return json_object_set_new(h, "verified", json_true()) ||
           json_object_set_new(h, "verify",
                               json_pack("{s:I, s:I}", "files",
                                         (json_int_t)v->files, "left_out",
                                         (json_int_t)v->left_out));
}

static char *header_json(const struct dh_estimator *est,
                         const struct probe_verify_stats *verified)
{
    char frames[32], size[32];
    const struct dh_cost_model *c = &est->cost;
    json_t *h;
    char *s;

    dh_sample_plan_format_frames(&est->plan, frames, sizeof(frames));
    dh_sample_plan_format_size(&est->plan, size, sizeof(size));
    h = json_pack("{s:i, s:s, s:{s:s, s:I, s:s, s:i}, s:s, s:{s:f, s:f, s:f, "
                  "s:f, s:f, s:b, s:I, s:f}}",
                  "version", 1, "tool", "datahelix probe", "plan", "frames",
                  frames, "max_frames", (json_int_t)est->plan.max_frames,
                  "size", size, "max_side", (int)est->plan.max_side, "tokens",
                  est->tokens.name, "cost_model", "base_ms", c->base_ms,
                  "ms_per_src_mpx", c->ms_per_src_mpx, "ms_per_in_mb",
                  c->ms_per_in_mb, "ms_per_out_mpx", c->ms_per_out_mpx,
                  "ms_per_audio_s", c->ms_per_audio_s, "calibrated",
                  c->calibrated, "fit_samples", (json_int_t)c->fit_samples,
                  "fit_rmse_ms", c->fit_rmse_ms);
    if (!h)
        return NULL;
    /* what the est_tokens hold of each clip's sound (absent: nothing) */
    if (est->audio.per_s > 0 &&
        json_object_set_new(h, "audio_tokens_per_s",
                            json_real(est->audio.per_s))) {
        json_decref(h);
        return NULL;
    }
    if (verified && add_verified(h, verified)) {
        json_decref(h);
        return NULL;
    }
    s = json_dumps(h,
                   JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(h);
    return s;
}

static int write_table(struct probe_run *r, size_t *written)
{
    struct dh_table_writer *w = NULL;
    struct dh_err e;
    char *hdr = header_json(&r->o->est, r->o->verify ? &r->vst : NULL);
    int64_t id = 0;
    int rc;

    dh_err_clear(&e);
    if (!hdr) {
        dh_cli_error("probe", "out of memory");
        return DH_EXIT_FAIL;
    }
    rc = dh_table_writer_open(r->o->out, hdr, &w, &e);
    dh__free(hdr);
    for (size_t i = 0; !rc && i < r->list.count; i++) {
        struct dh_desc *d = &r->descs[i];
        if (!r->ok[i])
            continue;
        d->id = id++;
        if (r->list.items[i].text && !d->text) {
            d->text = r->list.items[i].text; /* moved: list item gives it up */
            r->list.items[i].text = NULL;
        }
        if (r->list.items[i].extra_json && !d->extra_json) {
            d->extra_json = r->list.items[i].extra_json; /* moved */
            r->list.items[i].extra_json = NULL;
        }
        dh_estimate(&r->o->est, d);
        rc = dh_table_writer_write(w, d, &e);
    }
    if (rc)
        dh_table_writer_abort(w);
    else
        rc = dh_table_writer_close(w, &e);
    if (rc) {
        dh_cli_error("probe", "%s", e.msg);
        return DH_EXIT_FAIL;
    }
    *written = (size_t)id;
    return 0;
}

static int write_index(const struct probe_opts *o)
{
    struct dh_err e;

    dh_err_clear(&e);
    if (!o->index_out)
        return 0;
    if (!strcmp(o->out, "-")) {
        dh_cli_error("probe", "--index needs --out to name a file");
        return DH_EXIT_USAGE;
    }
    if (dh_index_build_from_table(o->out, o->index_out, &e)) {
        dh_cli_error("probe", "%s", e.msg);
        return DH_EXIT_FAIL;
    }
    return 0;
}

static int expand_inputs(struct probe_run *r, int argc, char **argv)
{
    struct dh_err e;

    for (int i = 0; i < argc; i++) {
        dh_err_clear(&e);
        if (dh_probe_list_add_input(&r->list, argv[i], &e)) {
            dh_cli_error("probe", "%s", e.msg);
            return DH_EXIT_FAIL;
        }
    }
    /* What shards held that is not a sample, or where one is damaged:
     * reported as failures, as a file that cannot be probed is. */
    for (size_t i = 0; i < r->list.nproblems; i++)
        dh_cli_error_line("probe", "%s", r->list.problems[i]);
    atomic_fetch_add(&r->failed, r->list.nproblems);
    if (r->list.count == 0) {
        dh_cli_error("probe", r->list.nproblems ? "no sample could be read "
                                                  "from the inputs"
                                                : "no input files");
        return DH_EXIT_FAIL;
    }
    if (r->list.nproblems && !r->o->keep_going) {
        dh_cli_error("probe", "%zu problems in the shards; no table written",
                     r->list.nproblems);
        return DH_EXIT_FAIL;
    }
    return 0;
}

/* The cache lives beside the table, so a re-run with the same --out finds
 * it; a table on stdout has no place for one. */
static char *cache_path(const char *out)
{
    size_t n = strlen(out);
    char *p;

    if (!strcmp(out, "-") || !(p = dh__malloc(n + sizeof(".verify.jsonl"))))
        return NULL;
    memcpy(p, out, n);
    memcpy(p + n, ".verify.jsonl", sizeof(".verify.jsonl"));
    return p;
}

static int verify_all(struct probe_run *r)
{
    char *cache = cache_path(r->o->out);
    struct probe_verify_opts vo = {r->o->jobs, r->o->keep_going, r->o->quiet,
                                   cache};
    size_t kept = 0;
    int rc;

    if (!cache && strcmp(r->o->out, "-")) {
        dh_cli_error("probe", "out of memory");
        return DH_EXIT_FAIL;
    }
    rc = dh_cli_probe_verify(&r->list, r->descs, r->ok, &vo, &r->vst);
    dh__free(cache);
    for (size_t i = 0; i < r->list.count; i++)
        kept += r->ok[i] != 0;
    if (!rc && (r->vst.stopped || kept == 0)) {
        dh_cli_error("probe",
                     "%zu of %zu files failed to probe or verify; "
                     "no table written",
                     r->list.count - kept, r->list.count);
        rc = DH_EXIT_FAIL;
    }
    return rc;
}

static int probe_all(struct probe_run *r, struct probe_opts *o)
{
    size_t n = r->list.count, written = 0;
    double t0 = dh_cli_now();
    int rc;

    r->descs = dh__calloc(n, sizeof(*r->descs));
    r->ok = dh__calloc(n, sizeof(*r->ok));
    if (!r->descs || !r->ok) {
        dh_cli_error("probe", "out of memory for %zu descriptors", n);
        return DH_EXIT_FAIL;
    }
    run_workers(r);
    if (atomic_load(&r->failed) == n + r->list.nproblems ||
        (!o->keep_going && atomic_load(&r->failed))) {
        dh_cli_error("probe",
                     "%zu of %zu files could not be probed; no "
                     "table written",
                     (size_t)atomic_load(&r->failed), n + r->list.nproblems);
        return DH_EXIT_FAIL;
    }
    if (o->verify && (rc = verify_all(r)))
        return rc;
    if (o->calibrate > 0 && calibrate(r, &o->est.cost))
        return DH_EXIT_FAIL;
    if ((rc = write_table(r, &written)) || (rc = write_index(o)))
        return rc;
    if (o->summary)
        dh_cli_print_profile_summary(strcmp(o->out, "-") ? stdout : stderr,
                                     r->descs, r->ok, n);
    if (!o->quiet) {
        double s = dh_cli_now() - t0;
        fprintf(stderr, "probe: %zu probed, %zu failed", written,
                (size_t)atomic_load(&r->failed));
        if (o->verify)
            fprintf(stderr, ", %zu left out by --verify", r->vst.left_out);
        else if (atomic_load(&r->unchecked))
            fprintf(stderr,
                    ", %zu unchecked for truncation (nothing in "
                    "them to check against: --verify decodes them)",
                    (size_t)atomic_load(&r->unchecked));
        fprintf(stderr, ", %.2f s (%.0f files/s) -> %s\n", s,
                s > 0 ? (double)n / s : 0.0, o->out);
    }
    return 0;
}

int dh_cmd_probe(int argc, char **argv)
{
    struct probe_opts o;
    struct probe_run r;
    int rc = parse_args(argc, argv, &o);

    if (rc)
        return rc < 0 ? DH_EXIT_OK : rc;
    dh__alloc_init();
    memset(&r, 0, sizeof(r));
    r.o = &o;
    dh_probe_list_init(&r.list);
    pthread_mutex_init(&r.err_lock, NULL);
    rc = expand_inputs(&r, argc - optind, argv + optind);
    if (!rc)
        rc = probe_all(&r, &o);
    for (size_t i = 0; r.descs && i < r.list.count; i++)
        dh_desc_fini(&r.descs[i]);
    dh__free(r.descs);
    dh__free(r.ok);
    dh_probe_list_fini(&r.list);
    pthread_mutex_destroy(&r.err_lock);
    return rc;
}
