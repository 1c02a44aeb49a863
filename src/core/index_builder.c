/*
 * index_builder.c - builds the .dhx index (docs/index-format.md).
 *
 * Design: one growable array per fixed-width column, indexed by sample id so
 * rows can arrive in any order, plus a presence bitmap (duplicates, density),
 * one string table (paths, texts, profile names, header JSON; it starts with
 * a NUL so "" is offset 0) and a small open-addressing hash that interns
 * profile names.  finish() writes header placeholder + sections to
 * PATH.tmp.<pid>, maps the written body back to checksum it, patches the
 * header with pwrite, fsyncs and renames.  Memory is about the file size.
 *
 * Locking: none; one thread per builder.
 */
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/desc_json.h"
#include "core/hash.h"
#include "core/index_format.h"
#include "datahelix/index.h"

#define NCOLS (DHX_S_MTIME + 1) /* per-sample sections */

struct dh_index_builder {
    unsigned char *col[NCOLS];
    uint64_t *present; /* bitmap over cap rows */
    uint64_t cap, count;
    int64_t max_id;
    char *strs;
    uint64_t slen, scap;
    uint64_t *prof_off; /* string offsets of profile names */
    uint32_t nprof, prof_cap;
    uint32_t *slots; /* profile index + 1, 0 = empty */
    uint32_t nslots;
    uint64_t header_off;
    /* shard paths, each stored once: open addressing over their string
     * offsets (0 = empty; offset 0 is the table's leading "") */
    uint64_t *shard_slots;
    uint64_t nshard_slots, nshards;
};

int dh_index_builder_create(struct dh_index_builder **out, struct dh_err *e)
{
    struct dh_index_builder *b;

    dh__alloc_init();
    if (!dhx_host_is_le())
        return dh_err_set(e, DH_EUNSUPPORTED, "index: big-endian host");
    if (!(b = dh__calloc(1, sizeof(*b))))
        return dh_err_set(e, DH_ENOMEM, "index builder: out of memory");
    b->max_id = -1;
    b->header_off = DHX_NONE;
    if (!(b->strs = dh__malloc(4096))) {
        dh__free(b);
        return dh_err_set(e, DH_ENOMEM, "index builder: out of memory");
    }
    b->scap = 4096;
    b->strs[0] = '\0';
    b->slen = 1;
    *out = b;
    return 0;
}

void dh_index_builder_destroy(struct dh_index_builder *b)
{
    if (!b)
        return;
    for (unsigned s = 0; s < NCOLS; s++)
        dh__free(b->col[s]);
    dh__free(b->present);
    dh__free(b->strs);
    dh__free(b->prof_off);
    dh__free(b->slots);
    dh__free(b->shard_slots);
    dh__free(b);
}

uint64_t dh_index_builder_count(const struct dh_index_builder *b)
{
    return b->count;
}

/* ---- growth ---- */

static int grow_rows(struct dh_index_builder *b, uint64_t need)
{
    uint64_t cap = b->cap ? b->cap : 1024, words, old_words;
    void *p;

    while (cap < need)
        cap *= 2;
    for (unsigned s = 0; s < NCOLS; s++) {
        if (!(p = dh__realloc(b->col[s], cap * dhx_elem_size(s))))
            return DH_ENOMEM;
        b->col[s] = p; /* a larger block is harmless if a later one fails */
    }
    words = cap / 64;
    old_words = b->cap / 64;
    if (!(p = dh__realloc(b->present, words * sizeof(uint64_t))))
        return DH_ENOMEM;
    b->present = p;
    memset(b->present + old_words, 0, (words - old_words) * sizeof(uint64_t));
    b->cap = cap;
    return 0;
}

/* Appends `s` (with its NUL) to the string table; *off = its offset. */
static int add_string(struct dh_index_builder *b, const char *s, uint64_t *off)
{
    size_t n = strlen(s) + 1;

    if (b->slen + n > b->scap) {
        uint64_t cap = b->scap * 2;
        char *p;

        while (cap < b->slen + n)
            cap *= 2;
        if (!(p = dh__realloc(b->strs, cap)))
            return DH_ENOMEM;
        b->strs = p;
        b->scap = cap;
    }
    memcpy(b->strs + b->slen, s, n);
    *off = b->slen;
    b->slen += n;
    return 0;
}

/* ---- profile interning ---- */

static uint32_t *find_slot(struct dh_index_builder *b, const char *name)
{
    uint32_t mask = b->nslots - 1;
    uint32_t i = (uint32_t)dh__hash64(name, strlen(name), 0) & mask;

    while (b->slots[i] &&
           strcmp(b->strs + b->prof_off[b->slots[i] - 1], name) != 0)
        i = (i + 1) & mask;
    return &b->slots[i];
}

static int grow_profiles(struct dh_index_builder *b)
{
    uint32_t ncap = b->prof_cap ? b->prof_cap * 2 : 16;
    uint32_t *old = b->slots, oldn = b->nslots;
    uint64_t *po;

    if (!(po = dh__realloc(b->prof_off, ncap * sizeof(*po))))
        return DH_ENOMEM;
    b->prof_off = po;
    if (!(b->slots = dh__calloc(ncap * 2, sizeof(*b->slots)))) {
        b->slots = old;
        return DH_ENOMEM;
    }
    b->nslots = ncap * 2;
    b->prof_cap = ncap;
    for (uint32_t i = 0; i < oldn; i++)
        if (old[i])
            *find_slot(b, b->strs + b->prof_off[old[i] - 1]) = old[i];
    dh__free(old);
    return 0;
}

static int intern_profile(struct dh_index_builder *b, const char *name,
                          uint16_t *out, struct dh_err *e)
{
    uint32_t *slot;

    if (b->nprof == b->prof_cap && b->nprof < DH_INDEX_PROFILE_MAX &&
        grow_profiles(b) != 0)
        return dh_err_set(e, DH_ENOMEM, "index builder: out of memory");
    slot = find_slot(b, name);
    if (!*slot) {
        if (b->nprof >= DH_INDEX_PROFILE_MAX)
            return dh_err_set(e, DH_ETOOBIG, "index: more than %u profiles",
                              DH_INDEX_PROFILE_MAX);
        if (add_string(b, name, &b->prof_off[b->nprof]) != 0)
            return dh_err_set(e, DH_ENOMEM, "index builder: out of memory");
        *slot = ++b->nprof;
    }
    *out = (uint16_t)(*slot - 1);
    return 0;
}

/* ---- shard paths ---- */

static uint64_t *find_shard(const struct dh_index_builder *b, const char *path)
{
    uint64_t mask = b->nshard_slots - 1;
    uint64_t i = dh__hash64(path, strlen(path), 1) & mask;

    while (b->shard_slots[i] && strcmp(b->strs + b->shard_slots[i], path))
        i = (i + 1) & mask;
    return &b->shard_slots[i];
}

static int grow_shards(struct dh_index_builder *b)
{
    uint64_t *old = b->shard_slots, oldn = b->nshard_slots;
    uint64_t n = oldn ? oldn * 2 : 64;

    if (!(b->shard_slots = dh__calloc(n, sizeof(*old)))) {
        b->shard_slots = old;
        return DH_ENOMEM;
    }
    b->nshard_slots = n;
    for (uint64_t i = 0; i < oldn; i++)
        if (old[i])
            *find_shard(b, b->strs + old[i]) = old[i];
    dh__free(old);
    return 0;
}

/* The string offset of shard path `path`, added on its first row. */
static int intern_shard(struct dh_index_builder *b, const char *path,
                        uint64_t *off)
{
    uint64_t *slot;

    if (2 * (b->nshards + 1) > b->nshard_slots && grow_shards(b))
        return DH_ENOMEM;
    slot = find_shard(b, path);
    if (!*slot) {
        if (add_string(b, path, off))
            return DH_ENOMEM;
        *slot = *off;
        b->nshards++;
    }
    *off = *slot;
    return 0;
}

/* ---- adding rows ---- */

static uint32_t sat_u32(int64_t v)
{
    return v < 0 ? 0 : v > (int64_t)UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

static uint16_t sat_u16(int32_t v)
{
    return v < 0 ? 0 : v > (int32_t)UINT16_MAX ? UINT16_MAX : (uint16_t)v;
}

static float to_f32(double v)
{
    return v > FLT_MAX ? FLT_MAX : v < -FLT_MAX ? -FLT_MAX : (float)v;
}

static void store_row(struct dh_index_builder *b, const struct dh_desc *d,
                      uint16_t prof, uint64_t poff, uint64_t toff,
                      uint64_t moff)
{
    uint64_t i = (uint64_t)d->id;
    uint64_t outb = d->est_out_bytes < 0 ? 0 : (uint64_t)d->est_out_bytes;

    ((uint32_t *)b->col[DHX_S_EST_TOKENS])[i] = sat_u32(d->est_tokens);
    ((float *)b->col[DHX_S_EST_CPU_MS])[i] = to_f32(d->est_cpu_ms);
    ((uint64_t *)b->col[DHX_S_EST_OUT_BYTES])[i] = outb;
    ((uint16_t *)b->col[DHX_S_PROFILE])[i] = prof;
    ((uint32_t *)b->col[DHX_S_FRAMES])[i] = sat_u32(d->frames);
    ((uint16_t *)b->col[DHX_S_WIDTH])[i] = sat_u16(d->width);
    ((uint16_t *)b->col[DHX_S_HEIGHT])[i] = sat_u16(d->height);
    b->col[DHX_S_KIND][i] = (uint8_t)d->kind;
    ((uint64_t *)b->col[DHX_S_PATH_OFF])[i] = poff;
    ((uint64_t *)b->col[DHX_S_TEXT_OFF])[i] = toff;
    ((uint64_t *)b->col[DHX_S_MEMBER_OFF])[i] = moff;
    ((uint64_t *)b->col[DHX_S_DATA_OFF])[i] = d->member && d->offset > 0
                                                  ? (uint64_t)d->offset
                                                  : 0;
    ((uint64_t *)b->col[DHX_S_BYTES])[i] = d->bytes > 0 ? (uint64_t)d->bytes
                                                        : 0;
    ((uint64_t *)b->col[DHX_S_MTIME])[i] = d->mtime_ns > 0
                                               ? (uint64_t)d->mtime_ns
                                               : 0;
    b->present[i / 64] |= (uint64_t)1 << (i % 64);
    b->count++;
    if (d->id > b->max_id)
        b->max_id = d->id;
}

/* A value the fixed-width columns cannot hold is an error, not a silent
 * clip: the planner would balance on numbers the table does not say. */
static int check_fits(const struct dh_desc *d, struct dh_err *e)
{
    const char *field = NULL;
    int64_t v = 0, max = 0;

    if (d->est_tokens < 0 || d->est_tokens > (int64_t)UINT32_MAX)
        field = "est_tokens", v = d->est_tokens, max = UINT32_MAX;
    else if (d->frames < 0 || d->frames > (int64_t)UINT32_MAX)
        field = "frames", v = d->frames, max = UINT32_MAX;
    else if (d->width < 0 || d->width > (int32_t)UINT16_MAX)
        field = "width", v = d->width, max = UINT16_MAX;
    else if (d->height < 0 || d->height > (int32_t)UINT16_MAX)
        field = "height", v = d->height, max = UINT16_MAX;
    if (!field)
        return 0;
    return dh_err_set(e, DH_ETOOBIG,
                      "index: sample %lld: field '%s' %lld "
                      "does not fit the index (0..%lld)",
                      (long long)d->id, field, (long long)v, (long long)max);
}

static int check_row(struct dh_index_builder *b, const struct dh_desc *d,
                     struct dh_err *e)
{
    uint64_t i = (uint64_t)d->id;
    int rc;

    if (d->id < 0 || d->id >= DH_TABLE_ID_MAX || !dh_kind_name(d->kind) ||
        !memchr(d->profile, 0, sizeof(d->profile)))
        return dh_err_set(e, DH_EINVAL,
                          "index: sample %lld: invalid "
                          "descriptor",
                          (long long)d->id);
    if ((rc = check_fits(d, e)))
        return rc;
    if (i < b->cap && (b->present[i / 64] >> (i % 64) & 1))
        return dh_err_set(e, DH_EDUP, "index: duplicate id %lld",
                          (long long)d->id);
    if (i >= b->cap && grow_rows(b, i + 1) != 0)
        return dh_err_set(e, DH_ENOMEM, "index builder: out of memory");
    return 0;
}

int dh_index_builder_add(struct dh_index_builder *b, const struct dh_desc *d,
                         struct dh_err *e)
{
    uint64_t poff = DHX_NONE, toff = DHX_NONE, moff = DHX_NONE;
    uint64_t saved = b->slen;
    uint16_t prof = 0;
    int rc;

    if ((rc = check_row(b, d, e)) != 0)
        return rc;
    if (d->member && !d->path)
        return dh_err_set(e, DH_EINVAL,
                          "index: sample %lld: a member without its shard",
                          (long long)d->id);
    /* A shard's path once for all its members (kept even if the row
     * fails below: other rows may share it); a file's as it comes. */
    if (d->member && intern_shard(b, d->path, &poff) != 0)
        return dh_err_set(e, DH_ENOMEM, "index builder: out of memory");
    saved = b->slen;
    if ((d->path && !d->member && add_string(b, d->path, &poff) != 0) ||
        (d->member && add_string(b, d->member, &moff) != 0) ||
        (d->text && add_string(b, d->text, &toff) != 0)) {
        b->slen = saved;
        return dh_err_set(e, DH_ENOMEM, "index builder: out of memory");
    }
    if ((rc = intern_profile(b, d->profile, &prof, e)) != 0) {
        b->slen = saved;
        return rc;
    }
    store_row(b, d, prof, poff, toff, moff);
    return 0;
}

int dh_index_builder_set_header(struct dh_index_builder *b,
                                const char *header_json, struct dh_err *e)
{
    json_error_t je;
    json_t *h = json_loads(header_json, 0, &je);
    int ok = json_is_object(h);

    json_decref(h);
    if (!h && dh__json_error_is_oom(&je))
        return dh_err_set(e, DH_ENOMEM, "index builder: out of memory");
    if (!ok)
        return dh_err_set(e, DH_EINVAL, "index: header is not a JSON object");
    if (add_string(b, header_json, &b->header_off) != 0)
        return dh_err_set(e, DH_ENOMEM, "index builder: out of memory");
    return 0;
}

/* ---- writing ---- */

struct layout {
    uint64_t off[DHX_NSECTIONS], size[DHX_NSECTIONS];
    uint64_t file_size;
};

static void plan_layout(const struct dh_index_builder *b, struct layout *l)
{
    uint64_t off = DHX_HEADER_SIZE;

    for (unsigned s = 0; s < DHX_NSECTIONS; s++) {
        if (s < NCOLS)
            l->size[s] = b->count * dhx_elem_size(s);
        else if (s == DHX_S_PROFILE_NAMES)
            l->size[s] = (uint64_t)b->nprof * 8;
        else
            l->size[s] = b->slen;
        off = (off + 7) & ~(uint64_t)7;
        l->off[s] = off;
        off += l->size[s];
    }
    l->file_size = off;
}

static const void *section_data(const struct dh_index_builder *b, unsigned s)
{
    if (s < NCOLS)
        return b->col[s];
    return s == DHX_S_PROFILE_NAMES ? (const void *)b->prof_off
                                    : (const void *)b->strs;
}

static int write_body(int fd, const struct dh_index_builder *b,
                      const struct layout *l)
{
    static const char zeros[DHX_HEADER_SIZE];
    uint64_t pos = DHX_HEADER_SIZE;

    if (dh__write_all(fd, zeros, DHX_HEADER_SIZE) != 0)
        return -1;
    for (unsigned s = 0; s < DHX_NSECTIONS; s++) {
        if (dh__write_all(fd, zeros, l->off[s] - pos) != 0 ||
            dh__write_all(fd, section_data(b, s), l->size[s]) != 0)
            return -1;
        pos = l->off[s] + l->size[s];
    }
    return 0;
}

static int body_checksum(int fd, uint64_t file_size, uint64_t *sum)
{
    unsigned char *m = mmap(NULL, file_size, PROT_READ, MAP_SHARED, fd, 0);

    if (m == MAP_FAILED)
        return -1;
    *sum = dh__hash64(m + DHX_HEADER_SIZE, file_size - DHX_HEADER_SIZE,
                      DHX_SEED_BODY);
    munmap(m, file_size);
    return 0;
}

static void fill_header(unsigned char *h, const struct dh_index_builder *b,
                        const struct layout *l, uint64_t body_sum)
{
    memset(h, 0, DHX_HEADER_SIZE);
    memcpy(h, DHX_MAGIC, 8);
    dhx_put32(h + DHX_OFF_VERSION, DH_INDEX_FORMAT_VERSION);
    dhx_put32(h + DHX_OFF_HEADER_SIZE, DHX_HEADER_SIZE);
    dhx_put64(h + DHX_OFF_COUNT, b->count);
    dhx_put64(h + DHX_OFF_FILE_SIZE, l->file_size);
    dhx_put32(h + DHX_OFF_PROFILE_COUNT, b->nprof);
    dhx_put32(h + DHX_OFF_SECTION_COUNT, DHX_NSECTIONS);
    dhx_put64(h + DHX_OFF_HEADER_JSON, b->header_off);
    dhx_put64(h + DHX_OFF_BODY_SUM, body_sum);
    for (unsigned s = 0; s < DHX_NSECTIONS; s++) {
        dhx_put64(h + DHX_OFF_SECTIONS + 16 * s, l->off[s]);
        dhx_put64(h + DHX_OFF_SECTIONS + 16 * s + 8, l->size[s]);
    }
    dhx_put64(h + DHX_OFF_HEADER_SUM,
              dh__hash64(h, DHX_OFF_HEADER_SUM, DHX_SEED_HEADER));
}

static int check_dense(const struct dh_index_builder *b, struct dh_err *e)
{
    uint64_t i = 0;

    if (b->count == (uint64_t)(b->max_id + 1))
        return 0;
    while (b->present[i / 64] >> (i % 64) & 1)
        i++;
    return dh_err_set(e, DH_EFORMAT,
                      "index: ids are not dense: id %llu is "
                      "missing",
                      (unsigned long long)i);
}

static int write_file(int fd, const struct dh_index_builder *b, const char *tmp,
                      struct dh_err *e)
{
    unsigned char hdr[DHX_HEADER_SIZE];
    struct layout l;
    uint64_t sum;

    plan_layout(b, &l);
    if (write_body(fd, b, &l) != 0 || body_checksum(fd, l.file_size, &sum))
        return dh_err_set(e, DH_EIO, "%s: write failed: %s", tmp,
                          strerror(errno));
    fill_header(hdr, b, &l, sum);
    if (pwrite(fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr) ||
        fsync(fd) != 0)
        return dh_err_set(e, DH_EIO, "%s: write failed: %s", tmp,
                          strerror(errno));
    return 0;
}

static char *tmp_name(const char *path)
{
    char suffix[32];
    size_t n = strlen(path), k;
    char *t;

    k = (size_t)snprintf(suffix, sizeof(suffix), ".tmp.%ld", (long)getpid());
    if (!(t = dh__malloc(n + k + 1)))
        return NULL;
    memcpy(t, path, n);
    memcpy(t + n, suffix, k + 1);
    return t;
}

int dh_index_builder_finish(struct dh_index_builder *b, const char *path,
                            struct dh_err *e)
{
    char *tmp;
    int fd, rc;
    struct stat st;

    if ((rc = check_dense(b, e)) != 0)
        return rc;
    /* Renaming over a device or folder would replace it: refuse. */
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return dh_err_set(e, DH_EINVAL,
                          "%s: exists and is not a regular "
                          "file",
                          path);
    if (!(tmp = tmp_name(path)))
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", path);
    fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = dh_err_set(e, DH_EIO,
                        "%s: cannot create its temporary file "
                        "%s: %s",
                        path, tmp, strerror(errno));
        goto out_free_tmp;
    }
    rc = write_file(fd, b, tmp, e);
    if (close(fd) != 0 && !rc)
        rc = dh_err_set(e, DH_EIO, "%s: close failed: %s", tmp,
                        strerror(errno));
    if (!rc && rename(tmp, path) != 0)
        rc = dh_err_set(e, DH_EIO, "%s: rename failed: %s", path,
                        strerror(errno));
    if (rc)
        unlink(tmp);
out_free_tmp:
    dh__free(tmp);
    return rc;
}

/* ---- convenience ---- */

static int add_all(struct dh_table_reader *r, struct dh_index_builder *b,
                   struct dh_err *e)
{
    struct dh_desc d;
    int rc;

    dh_desc_init(&d);
    while ((rc = dh_table_reader_next(r, &d, e)) == 1) {
        if ((rc = dh_index_builder_add(b, &d, e)) != 0)
            break;
    }
    dh_desc_fini(&d);
    return rc;
}

int dh_index_build_from_table(const char *jsonl_path, const char *dhx_path,
                              struct dh_err *e)
{
    return dh_index_build(jsonl_path, dhx_path, 0, NULL, e);
}

int dh_index_build(const char *jsonl_path, const char *dhx_path, unsigned flags,
                   struct dh_index_build_info *info, struct dh_err *e)
{
    struct dh_table_reader *r;
    struct dh_index_builder *b;
    int rc;

    if ((rc = dh_table_reader_open(jsonl_path, &r, e)) != 0)
        return rc;
    dh_table_reader_set_renumber(r, (flags & DH_INDEX_BUILD_RENUMBER) != 0);
    if ((rc = dh_index_builder_create(&b, e)) != 0)
        goto out_close_reader;
    if ((rc = add_all(r, b, e)) != 0)
        goto out_destroy_builder;
    if (dh_table_reader_header(r) &&
        (rc = dh_index_builder_set_header(b, dh_table_reader_header(r), e)))
        goto out_destroy_builder;
    rc = dh_index_builder_finish(b, dhx_path, e);
    if (rc == 0 && info) {
        info->samples = dh_index_builder_count(b);
        info->renumbered = dh_table_reader_renumbered(r);
    }
out_destroy_builder:
    dh_index_builder_destroy(b);
out_close_reader:
    dh_table_reader_destroy(r);
    return rc;
}
