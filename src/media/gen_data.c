/*
 * gen_data.c - the `gen-data` driver: profiles, file names, durations,
 * captions, and the temp-then-rename protocol (see datahelix/gendata.h).
 *
 * Design: file i of a set gets profile list[i % n], a length jittered +-20%
 * from (seed, i), content seed mix(seed, i), and the name NNNNNN_<P>.mp4.
 * Everything is integer arithmetic on SplitMix64 hashes, so a set is
 * byte-identical across runs and machines with the same FFmpeg/x264.
 * Each file is encoded to ".<name>.<pid>.tmp" in the same directory and
 * renamed over the final name only when complete: a killed run leaves at
 * most a hidden temp file, never a truncated NNNNNN_<P>.mp4.  captions.jsonl
 * is written the same way after all videos.
 *
 * Locking: none; no shared mutable state (the profile table is const).
 */
#include "datahelix/gendata.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "core/alloc.h"
#include "media/gen_content.h"
#include "media/gen_encode.h"
#include "core/hash.h"

/* Paper's Kinetics mixes: 16x224, 32x336, 64x448 at 8 fps; XL is extra. */
static const struct dh_gen_profile profiles[] = {
    {"S", 400, 224, 2.0},
    {"M", 600, 336, 4.0},
    {"L", 800, 448, 8.0},
    {"XL", 1280, 720, 8.0},
};
#define N_PROFILES (sizeof(profiles) / sizeof(profiles[0]))
#define NAME_MAX_LEN 32 /* "NNNNNN_XL.mp4" and the temp decorations fit */

const struct dh_gen_profile *dh_gen_profile_find(const char *name)
{
    for (size_t i = 0; i < N_PROFILES; i++)
        if (!strcasecmp(name, profiles[i].name))
            return &profiles[i];
    return NULL;
}

static int list_add(struct dh_gen_profile_list *l,
                    const struct dh_gen_profile *p, struct dh_err *e)
{
    if (l->n >= DH_GEN_MAX_LIST)
        return dh_err_set(e, DH_ETOOBIG, "profile list longer than %d entries",
                          DH_GEN_MAX_LIST);
    l->p[l->n++] = p;
    return 0;
}

static int parse_item(const char *item, size_t len,
                      struct dh_gen_profile_list *l, struct dh_err *e)
{
    char name[16];
    const struct dh_gen_profile *p;
    int r = 0;

    if (len == 0)
        return dh_err_set(e, DH_EINVAL, "empty profile name in list");
    if (len >= sizeof(name))
        return dh_err_set(e, DH_EINVAL,
                          "unknown profile '%.*s' (known: S, "
                          "M, L, XL, mixed)",
                          (int)len, item);
    memcpy(name, item, len);
    name[len] = '\0';
    if (!strcasecmp(name, "mixed")) {
        for (size_t i = 0; i < 3 && r == 0; i++)
            r = list_add(l, &profiles[i], e);
        return r;
    }
    p = dh_gen_profile_find(name);
    if (!p)
        return dh_err_set(e, DH_EINVAL,
                          "unknown profile '%s' (known: S, M, "
                          "L, XL, mixed)",
                          name);
    return list_add(l, p, e);
}

int dh_gen_profiles_parse(const char *spec, struct dh_gen_profile_list *out,
                          struct dh_err *e)
{
    struct dh_gen_profile_list l = {0};
    const char *s = spec ? spec : "mixed";
    int r;

    for (;;) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);

        r = parse_item(s, len, &l, e);
        if (r < 0)
            return r;
        if (!comma)
            break;
        s = comma + 1;
    }
    *out = l;
    return 0;
}

int64_t dh_gen_file_frames(const struct dh_gen_profile *p, uint64_t seed,
                           int64_t index)
{
    int64_t nominal = (int64_t)(p->seconds * DH_GEN_FPS + 0.5);
    uint64_t r = dh__mix64(dh__mix64(seed ^ 0x6A69747465720000ull) ^
                           (uint64_t)index);
    int64_t permille = 800 + (int64_t)(r % 401); /* 0.800 .. 1.200 */
    int64_t n = (nominal * permille + 500) / 1000;

    return n < 1 ? 1 : n;
}

static uint64_t clip_seed(uint64_t seed, int64_t index)
{
    return dh__mix64(dh__mix64(seed) + (uint64_t)index);
}

/* ---- directories and names ---- */

static int mkdir_one(const char *path, struct dh_err *e)
{
    struct stat sb;

    if (mkdir(path, 0777) == 0)
        return 0;
    if (errno != EEXIST)
        return dh_err_set(e, DH_EIO, "%s: cannot create directory: %s", path,
                          strerror(errno));
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return dh_err_set(e, DH_EIO, "%s: exists and is not a directory", path);
    return 0;
}

/* mkdir -p, then checks that the directory can take new files. */
static int make_dirs(const char *dir, struct dh_err *e)
{
    char *buf = dh__strdup(dir);
    int r = 0;

    if (!buf)
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", dir);
    for (char *p = buf + 1; *p && r == 0; p++) {
        if (*p != '/' || p[-1] == '/')
            continue;
        *p = '\0';
        r = mkdir_one(buf, e);
        *p = '/';
    }
    if (r == 0)
        r = mkdir_one(buf, e);
    dh__free(buf);
    if (r == 0 && access(dir, W_OK | X_OK) != 0)
        r = dh_err_set(e, DH_EIO, "%s: not writable: %s", dir, strerror(errno));
    return r;
}

/* Final and temporary paths of one output file, owned by the caller. */
struct out_paths {
    char *final_path;
    char *tmp_path;
    char name[NAME_MAX_LEN];
};

static int paths_init(struct out_paths *op, const char *dir, const char *name,
                      struct dh_err *e)
{
    size_t cap = strlen(dir) + 2 * NAME_MAX_LEN + 32;

    snprintf(op->name, sizeof(op->name), "%s", name);
    op->final_path = dh__malloc(cap);
    op->tmp_path = dh__malloc(cap);
    if (!op->final_path || !op->tmp_path)
        return dh_err_set(e, DH_ENOMEM, "%s/%s: out of memory", dir, name);
    snprintf(op->final_path, cap, "%s/%s", dir, name);
    snprintf(op->tmp_path, cap, "%s/.%s.%ld.tmp", dir, name, (long)getpid());
    return 0;
}

static void paths_fini(struct out_paths *op)
{
    dh__free(op->final_path);
    dh__free(op->tmp_path);
}

static void video_name(char *buf, size_t cap, int64_t i,
                       const struct dh_gen_profile *p)
{
    snprintf(buf, cap, "%06lld_%s.mp4", (long long)i, p->name);
}

/* Renames tmp over final; on failure removes tmp. */
static int commit_file(const struct out_paths *op, struct dh_err *e)
{
    if (rename(op->tmp_path, op->final_path) == 0)
        return 0;
    dh_err_set(e, DH_EIO, "%s: cannot rename into place: %s", op->final_path,
               strerror(errno));
    remove(op->tmp_path);
    return DH_EIO;
}

/* ---- videos ---- */

static int write_video(const struct dh_gen_opts *o,
                       const struct dh_gen_profile *p, int64_t i,
                       struct dh_gen_stats *st, struct dh_err *e)
{
    struct out_paths op = {0};
    struct dh__gen_clip clip;
    char name[NAME_MAX_LEN];
    struct stat sb;
    int r;

    video_name(name, sizeof(name), i, p);
    r = paths_init(&op, o->out_dir, name, e);
    if (r < 0)
        goto out_paths;
    clip = (struct dh__gen_clip){op.tmp_path,
                                 p->width,
                                 p->height,
                                 dh_gen_file_frames(p, o->seed, i),
                                 clip_seed(o->seed, i),
                                 o->stamp};
    r = dh__gen_encode_clip(&clip, e);
    if (r < 0) {
        remove(op.tmp_path); /* never leave a hidden half file behind */
        goto out_paths;
    }
    r = commit_file(&op, e);
    if (r < 0)
        goto out_paths;
    st->files++;
    st->frames += clip.frames;
    if (stat(op.final_path, &sb) == 0)
        st->bytes += (uint64_t)sb.st_size;
out_paths:
    paths_fini(&op);
    return r;
}

/* ---- captions ---- */

static const char *const w_det[] = {"a", "the", "one", "another", "this"};
static const char *const w_adj[] = {
    "red",    "small",  "bright", "striped", "blue",   "tall",   "quick",
    "green",  "square", "old",    "shiny",   "yellow", "narrow", "wooden",
    "purple", "heavy",  "quiet",  "distant", "orange", "gentle"};
static const char *const w_noun[] = {
    "box",    "person", "dog",     "car",    "ball",   "tile",    "pattern",
    "window", "street", "kitchen", "field",  "river",  "bicycle", "camera",
    "child",  "guitar", "table",   "door",   "wave",   "texture", "crowd",
    "dancer", "horse",  "garden",  "screen", "shadow", "bridge",  "stage"};
static const char *const w_verb[] = {
    "moves", "bounces", "slides",  "rotates", "drifts",  "jumps",
    "turns", "crosses", "follows", "circles", "passes",  "shakes",
    "spins", "waves",   "rolls",   "climbs",  "appears", "flickers"};
static const char *const w_prep[] = {"across", "over",   "past",  "toward",
                                     "behind", "around", "under", "beside",
                                     "along",  "through"};
static const char *const w_adv[] = {"slowly",   "quickly", "again",   "away",
                                    "sideways", "twice",   "briefly", "upward"};

struct word_class {
    const char *const *w;
    size_t n;
};
#define WC(a)                                                                  \
    {                                                                          \
        a, sizeof(a) / sizeof(a[0])                                            \
    }
enum { DET, ADJ, NOUN, VERB, PREP, ADV };
static const struct word_class classes[] = {WC(w_det),  WC(w_adj),  WC(w_noun),
                                            WC(w_verb), WC(w_prep), WC(w_adv)};

/* Sentence shapes of 4..8 words ("the red dog jumps quickly", ...). */
#define SENT_MIN 4
#define SENT_MAX 8
static const uint8_t shapes[5][SENT_MAX] = {
    {DET, NOUN, VERB, ADV},
    {DET, ADJ, NOUN, VERB, ADV},
    {DET, NOUN, VERB, PREP, DET, NOUN},
    {DET, ADJ, NOUN, VERB, PREP, DET, NOUN},
    {DET, ADJ, NOUN, VERB, PREP, DET, ADJ, NOUN}};
#define CAPTION_MAX 2048 /* 120 words of <= 8 letters plus separators */

struct caption {
    char buf[CAPTION_MAX];
    size_t len;
    uint64_t r; /* word-choice state */
};

static void cap_append(struct caption *c, const char *s)
{
    size_t n = strlen(s);

    if (c->len + n + 1 > CAPTION_MAX)
        return;
    memcpy(c->buf + c->len, s, n);
    c->len += n;
    c->buf[c->len] = '\0';
}

static void cap_sentence(struct caption *c, int words)
{
    const uint8_t *shape = shapes[words - SENT_MIN];
    size_t start = c->len + (c->len > 0);

    for (int k = 0; k < words; k++) {
        const struct word_class *wc = &classes[shape[k]];

        c->r = dh__mix64(c->r);
        if (c->len > 0)
            cap_append(c, " ");
        cap_append(c, wc->w[c->r % wc->n]);
    }
    cap_append(c, ".");
    if (start < c->len && c->buf[start] >= 'a' && c->buf[start] <= 'z')
        c->buf[start] = (char)(c->buf[start] - 'a' + 'A');
}

/*
 * 5..120 words (short captions more common: quadratic skew) in sentences of
 * 5..8 words, the last one 4..8; the word count is exact.
 */
static void caption_text(struct caption *c, uint64_t seed, int64_t i)
{
    uint64_t q;
    int left;

    c->r = dh__mix64(dh__mix64(seed ^ 0x63617074ull) ^ (uint64_t)i);
    q = c->r % 1000;
    left = 5 + (int)(116 * q * q / 1000000);
    c->len = 0;
    c->buf[0] = '\0';
    while (left > 0) {
        int n = 5 + (int)((c->r >> 40) % 4);

        if (left <= SENT_MAX)
            n = left;
        else if (left - n < SENT_MIN)
            n = left - SENT_MIN;
        cap_sentence(c, n);
        left -= n;
    }
}

static int caption_line(FILE *f, const struct dh_gen_opts *o,
                        const struct dh_gen_profile_list *l, int64_t i,
                        struct dh_err *e)
{
    char name[NAME_MAX_LEN];
    struct caption cap;
    json_t *obj;
    int r;

    video_name(name, sizeof(name), i, l->p[i % l->n]);
    caption_text(&cap, o->seed, i);
    obj = json_pack("{s:s, s:s}", "path", name, "text", cap.buf);
    if (!obj)
        return dh_err_set(e, DH_ENOMEM, "captions.jsonl: out of memory");
    r = json_dumpf(obj, f, JSON_PRESERVE_ORDER);
    json_decref(obj);
    if (r != 0 || fputc('\n', f) == EOF)
        return dh_err_set(e, DH_EIO, "captions.jsonl: write failed: %s",
                          strerror(errno));
    return 0;
}

static int write_caption_lines(const char *tmp, const struct dh_gen_opts *o,
                               const struct dh_gen_profile_list *l,
                               struct dh_err *e)
{
    FILE *f = fopen(tmp, "w");
    int r = 0;

    if (!f)
        return dh_err_set(e, DH_EIO, "%s: cannot create: %s", tmp,
                          strerror(errno));
    for (int64_t i = 0; i < o->count && r == 0; i++)
        r = caption_line(f, o, l, i, e);
    if (fclose(f) != 0 && r == 0)
        r = dh_err_set(e, DH_EIO, "%s: write failed: %s", tmp, strerror(errno));
    if (r < 0)
        remove(tmp);
    return r;
}

static int write_captions(const struct dh_gen_opts *o,
                          const struct dh_gen_profile_list *l, struct dh_err *e)
{
    struct out_paths op = {0};
    int r;

    r = paths_init(&op, o->out_dir, "captions.jsonl", e);
    if (r < 0)
        goto out_paths;
    r = write_caption_lines(op.tmp_path, o, l, e);
    if (r < 0)
        goto out_paths;
    r = commit_file(&op, e);
out_paths:
    paths_fini(&op);
    return r;
}

/* ---- driver ---- */

static int check_opts(const struct dh_gen_opts *o, struct dh_err *e)
{
    if (!o->out_dir || !*o->out_dir)
        return dh_err_set(e, DH_EINVAL, "no output directory given");
    if (o->count < 1 || o->count > DH_GEN_MAX_COUNT)
        return dh_err_set(e, DH_EINVAL, "count %lld out of range 1..%d",
                          (long long)o->count, DH_GEN_MAX_COUNT);
    return 0;
}

int dh_gen_data(const struct dh_gen_opts *o, struct dh_gen_stats *st,
                struct dh_err *e)
{
    struct dh_gen_stats local = {0};
    struct dh_gen_profile_list l = {0};
    int r;

    if (!st)
        st = &local;
    *st = (struct dh_gen_stats){0};
    st->encoder = dh__gen_encoder_name();
    dh__alloc_init();
    r = check_opts(o, e);
    if (r == 0)
        r = dh_gen_profiles_parse(o->profiles, &l, e);
    if (r == 0)
        r = make_dirs(o->out_dir, e);
    for (int64_t i = 0; r == 0 && i < o->count; i++) {
        r = write_video(o, l.p[i % l.n], i, st, e);
        if (r == 0 && o->progress)
            o->progress(o->progress_ctx, i + 1, o->count);
    }
    if (r == 0 && o->captions)
        r = write_captions(o, &l, e);
    return r;
}
