/*
 * index_reader.c - opens and reads a .dhx index (docs/index-format.md).
 *
 * Design: the file is mapped read-only and shared (MAP_SHARED) so every
 * process on a host reads the same page-cache pages.  Open validates the
 * header (magic, version, checksum, flags) and every section's offset, size
 * and alignment against the real file size, checks that the string table
 * ends with NUL and that each profile-name offset lies inside it - all O(1)
 * in the sample count except the optional body checksum (DH_INDEX_VERIFY).
 * Per-sample string offsets are checked lazily on access (offset < string
 * table size suffices, since the table's last byte is NUL).  After open the
 * object is immutable.
 *
 * Locking: none needed; readers may share one index across threads.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/hash.h"
#include "core/index_format.h"
#include "datahelix/index.h"

struct dh_index {
    const unsigned char *base;
    uint64_t size;
    int mapped;
    uint64_t count;
    uint32_t nprof;
    const unsigned char *sec[DHX_NSECTIONS];
    uint64_t slen; /* string table size */
    const char *header_json;
    char name[256];
};

#define FAIL(code, ...) dh_err_set(e, code, __VA_ARGS__)

static int check_ident(struct dh_index *ix, struct dh_err *e)
{
    const unsigned char *h = ix->base;
    uint32_t version;

    if (ix->size < DHX_HEADER_SIZE)
        return FAIL(DH_EFORMAT,
                    "%s: file too small for an index (%llu "
                    "bytes)",
                    ix->name, (unsigned long long)ix->size);
    if (memcmp(h, DHX_MAGIC, 8) != 0)
        return FAIL(DH_EFORMAT, "%s: not a datahelix index (bad magic)",
                    ix->name);
    version = dhx_get32(h + DHX_OFF_VERSION);
    if (version != DH_INDEX_FORMAT_VERSION)
        return FAIL(DH_EVERSION,
                    "%s: index format version %u, this build "
                    "reads %u",
                    ix->name, version, DH_INDEX_FORMAT_VERSION);
    if (dhx_get64(h + DHX_OFF_HEADER_SUM) !=
        dh__hash64(h, DHX_OFF_HEADER_SUM, DHX_SEED_HEADER))
        return FAIL(DH_ECHECKSUM, "%s: header checksum mismatch", ix->name);
    return 0;
}

static int check_fields(struct dh_index *ix, struct dh_err *e)
{
    const unsigned char *h = ix->base;
    uint64_t fsize = dhx_get64(h + DHX_OFF_FILE_SIZE);

    if (dhx_get64(h + DHX_OFF_FLAGS) != 0)
        return FAIL(DH_EVERSION, "%s: unknown required flags %#llx", ix->name,
                    (unsigned long long)dhx_get64(h + DHX_OFF_FLAGS));
    if (dhx_get32(h + DHX_OFF_HEADER_SIZE) != DHX_HEADER_SIZE ||
        dhx_get32(h + DHX_OFF_SECTION_COUNT) != DHX_NSECTIONS)
        return FAIL(DH_EFORMAT, "%s: bad header or section count", ix->name);
    if (fsize != ix->size)
        return FAIL(DH_EFORMAT,
                    "%s: file is %llu bytes, header says %llu "
                    "(truncated?)",
                    ix->name, (unsigned long long)ix->size,
                    (unsigned long long)fsize);
    ix->count = dhx_get64(h + DHX_OFF_COUNT);
    ix->nprof = dhx_get32(h + DHX_OFF_PROFILE_COUNT);
    if (ix->count > (uint64_t)DH_TABLE_ID_MAX ||
        ix->nprof > DH_INDEX_PROFILE_MAX)
        return FAIL(DH_EFORMAT, "%s: sample or profile count out of range",
                    ix->name);
    return 0;
}

static uint64_t expected_size(const struct dh_index *ix, unsigned s)
{
    if (s == DHX_S_PROFILE_NAMES)
        return (uint64_t)ix->nprof * 8;
    return ix->count * dhx_elem_size(s); /* count <= 2^32: no overflow */
}

/* Sections must be 8-aligned, in order, non-overlapping, inside the file. */
static int check_sections(struct dh_index *ix, struct dh_err *e)
{
    const unsigned char *t = ix->base + DHX_OFF_SECTIONS;
    uint64_t end = DHX_HEADER_SIZE;

    for (unsigned s = 0; s < DHX_NSECTIONS; s++) {
        uint64_t off = dhx_get64(t + 16 * s), sz = dhx_get64(t + 16 * s + 8);

        if (off % 8 || off < end || off > ix->size || sz > ix->size - off)
            return FAIL(DH_EFORMAT, "%s: section %u out of bounds", ix->name,
                        s);
        if (s != DHX_S_STRINGS && sz != expected_size(ix, s))
            return FAIL(DH_EFORMAT,
                        "%s: section %u has size %llu, expected "
                        "%llu",
                        ix->name, s, (unsigned long long)sz,
                        (unsigned long long)expected_size(ix, s));
        ix->sec[s] = ix->base + off;
        end = off + sz;
        if (s == DHX_S_STRINGS)
            ix->slen = sz;
    }
    return 0;
}

static int check_strings(struct dh_index *ix, struct dh_err *e)
{
    const uint64_t *po = (const uint64_t *)ix->sec[DHX_S_PROFILE_NAMES];
    uint64_t hoff = dhx_get64(ix->base + DHX_OFF_HEADER_JSON);

    if (ix->slen == 0 || ix->sec[DHX_S_STRINGS][ix->slen - 1] != '\0')
        return FAIL(DH_EFORMAT, "%s: string table not NUL-terminated",
                    ix->name);
    for (uint32_t p = 0; p < ix->nprof; p++)
        if (po[p] >= ix->slen)
            return FAIL(DH_EFORMAT, "%s: profile %u name out of bounds",
                        ix->name, p);
    if (hoff != DHX_NONE && hoff >= ix->slen)
        return FAIL(DH_EFORMAT, "%s: header record out of bounds", ix->name);
    if (hoff != DHX_NONE)
        ix->header_json = (const char *)ix->sec[DHX_S_STRINGS] + hoff;
    return 0;
}

static int check_body(struct dh_index *ix, struct dh_err *e)
{
    uint64_t want = dhx_get64(ix->base + DHX_OFF_BODY_SUM);

    if (dh__hash64(ix->base + DHX_HEADER_SIZE, ix->size - DHX_HEADER_SIZE,
                   DHX_SEED_BODY) != want)
        return FAIL(DH_ECHECKSUM, "%s: body checksum mismatch (corrupt file)",
                    ix->name);
    return 0;
}

static int validate(struct dh_index *ix, unsigned flags, struct dh_err *e)
{
    int rc;

    if ((rc = check_ident(ix, e)) || (rc = check_fields(ix, e)) ||
        (rc = check_sections(ix, e)) || (rc = check_strings(ix, e)))
        return rc;
    if (flags & DH_INDEX_VERIFY)
        return check_body(ix, e);
    return 0;
}

static struct dh_index *new_index(const char *name, struct dh_err *e)
{
    struct dh_index *ix = dh__calloc(1, sizeof(*ix));

    if (!ix) {
        dh_err_set(e, DH_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    snprintf(ix->name, sizeof(ix->name), "%s", name);
    return ix;
}

int dh_index_open_mem(const void *data, size_t size, unsigned flags,
                      struct dh_index **out, struct dh_err *e)
{
    struct dh_index *ix;
    int rc;

    if (!dhx_host_is_le())
        return FAIL(DH_EUNSUPPORTED, "index: big-endian host");
    if ((uintptr_t)data % 8)
        return FAIL(DH_EINVAL, "index: buffer not 8-byte aligned");
    if (!(ix = new_index("<memory>", e)))
        return DH_ENOMEM;
    ix->base = data;
    ix->size = size;
    if ((rc = validate(ix, flags, e)) != 0) {
        dh__free(ix);
        return rc;
    }
    *out = ix;
    return 0;
}

static int map_file(struct dh_index *ix, const char *path, struct dh_err *e)
{
    struct stat st;
    void *m;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return FAIL(errno == ENOENT ? DH_ENOTFOUND : DH_EIO,
                    "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return FAIL(DH_EIO, "%s: not a regular file", path);
    }
    ix->size = (uint64_t)st.st_size;
    if (ix->size < DHX_HEADER_SIZE) {
        close(fd);
        return check_ident(ix, e); /* reports "file too small" */
    }
    m = mmap(NULL, ix->size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return FAIL(DH_EIO, "%s: mmap failed: %s", path, strerror(errno));
    ix->base = m;
    ix->mapped = 1;
    return 0;
}

int dh_index_open(const char *path, unsigned flags, struct dh_index **out,
                  struct dh_err *e)
{
    struct dh_index *ix;
    int rc;

    if (!dhx_host_is_le())
        return FAIL(DH_EUNSUPPORTED, "index: big-endian host");
    if (!(ix = new_index(path, e)))
        return DH_ENOMEM;
    if ((rc = map_file(ix, path, e)) || (rc = validate(ix, flags, e))) {
        dh_index_close(ix);
        return rc;
    }
    *out = ix;
    return 0;
}

void dh_index_close(struct dh_index *ix)
{
    if (!ix)
        return;
    if (ix->mapped)
        munmap((void *)ix->base, ix->size);
    dh__free(ix);
}

uint64_t dh_index_count(const struct dh_index *ix)
{
    return ix->count;
}

uint64_t dh_index_size(const struct dh_index *ix)
{
    return ix->size;
}

void dh_index_columns(const struct dh_index *ix, struct dh_index_columns *c)
{
    c->count = ix->count;
    c->est_tokens = (const uint32_t *)ix->sec[DHX_S_EST_TOKENS];
    c->est_cpu_ms = (const float *)ix->sec[DHX_S_EST_CPU_MS];
    c->est_out_bytes = (const uint64_t *)ix->sec[DHX_S_EST_OUT_BYTES];
    c->profile = (const uint16_t *)ix->sec[DHX_S_PROFILE];
    c->frames = (const uint32_t *)ix->sec[DHX_S_FRAMES];
    c->width = (const uint16_t *)ix->sec[DHX_S_WIDTH];
    c->height = (const uint16_t *)ix->sec[DHX_S_HEIGHT];
    c->kind = ix->sec[DHX_S_KIND];
}

static const char *string_at(const struct dh_index *ix, unsigned s, uint64_t id)
{
    uint64_t off;

    if (id >= ix->count)
        return NULL;
    off = ((const uint64_t *)ix->sec[s])[id];
    if (off >= ix->slen) /* also DHX_NONE */
        return NULL;
    return (const char *)ix->sec[DHX_S_STRINGS] + off;
}

const char *dh_index_path(const struct dh_index *ix, uint64_t id)
{
    return string_at(ix, DHX_S_PATH_OFF, id);
}

const char *dh_index_text(const struct dh_index *ix, uint64_t id)
{
    return string_at(ix, DHX_S_TEXT_OFF, id);
}

static uint64_t row_mtime(const struct dh_index *ix, uint64_t id)
{
    return ((const uint64_t *)ix->sec[DHX_S_MTIME])[id];
}

int dh_index_source(const struct dh_index *ix, uint64_t id,
                    struct dh_source_ref *out)
{
    uint64_t moff;

    memset(out, 0, sizeof(*out));
    if (id >= ix->count || !(out->path = dh_index_path(ix, id)))
        return DH_EINVAL;
    out->size = (int64_t)(dh_index_bytes(ix, id) & INT64_MAX);
    out->mtime_ns = (int64_t)(row_mtime(ix, id) & INT64_MAX);
    moff = ((const uint64_t *)ix->sec[DHX_S_MEMBER_OFF])[id];
    if (moff == DHX_NONE)
        return 0;
    if (!(out->member = string_at(ix, DHX_S_MEMBER_OFF, id)))
        return DH_EFORMAT;
    out->offset = (int64_t)(((const uint64_t *)ix->sec[DHX_S_DATA_OFF])[id] &
                            INT64_MAX);
    return 0;
}

uint64_t dh_index_bytes(const struct dh_index *ix, uint64_t id)
{
    return id < ix->count ? ((const uint64_t *)ix->sec[DHX_S_BYTES])[id] : 0;
}

unsigned dh_index_profile_count(const struct dh_index *ix)
{
    return ix->nprof;
}

const char *dh_index_profile_name(const struct dh_index *ix, unsigned p)
{
    if (p >= ix->nprof)
        return NULL;
    return (const char *)ix->sec[DHX_S_STRINGS] +
           ((const uint64_t *)ix->sec[DHX_S_PROFILE_NAMES])[p];
}

const char *dh_index_header(const struct dh_index *ix)
{
    return ix->header_json;
}

/* Chained hashes of the columns and strings a plan and a delivered sample
 * depend on.  Profiles are hashed by name, row by row: the builder numbers
 * names in the order rows arrive, which is not part of the content.  Safe
 * on a corrupt body: bad offsets and profile values hash as "none". */
uint64_t dh_index_digest(const struct dh_index *ix)
{
    const uint16_t *prof = (const uint16_t *)ix->sec[DHX_S_PROFILE];
    uint64_t h = dh__mix64(ix->count ^ 0x6468782d64696731ull);

    h = dh__hash64(ix->sec[DHX_S_EST_TOKENS], 4 * ix->count, h);
    for (uint64_t i = 0; i < ix->count; i++) {
        const char *name = dh_index_profile_name(ix, prof[i]);
        const char *path = dh_index_path(ix, i);

        h = name ? dh__hash64(name, strlen(name) + 1, h) : dh__mix64(h ^ 2);
        h = path ? dh__hash64(path, strlen(path) + 1, h) : dh__mix64(h ^ 1);
        if (((const uint64_t *)ix->sec[DHX_S_MEMBER_OFF])[i] != DHX_NONE) {
            /* a shard member: which member, and where (a whole file's
             * digest is as it was before shards) */
            const char *mem = string_at(ix, DHX_S_MEMBER_OFF, i);
            uint64_t at = ((const uint64_t *)ix->sec[DHX_S_DATA_OFF])[i];

            h = mem ? dh__hash64(mem, strlen(mem) + 1, h) : dh__mix64(h ^ 3);
            h = dh__hash64(&at, sizeof(at), h);
        }
    }
    return h;
}

/* ---- whole-row access ---- */

static int row_strings(const struct dh_index *ix, uint64_t id,
                       struct dh_desc *d, struct dh_err *e)
{
    uint64_t poff = ((const uint64_t *)ix->sec[DHX_S_PATH_OFF])[id];
    uint64_t toff = ((const uint64_t *)ix->sec[DHX_S_TEXT_OFF])[id];
    uint64_t moff = ((const uint64_t *)ix->sec[DHX_S_MEMBER_OFF])[id];
    const char *path = dh_index_path(ix, id), *text = dh_index_text(ix, id);
    const char *member = string_at(ix, DHX_S_MEMBER_OFF, id);

    if ((poff != DHX_NONE && !path) || (toff != DHX_NONE && !text) ||
        (moff != DHX_NONE && (!member || !path)))
        return FAIL(DH_EFORMAT, "%s: sample %llu: string out of bounds",
                    ix->name, (unsigned long long)id);
    if ((path && !(d->path = dh__strdup(path))) ||
        (text && !(d->text = dh__strdup(text))) ||
        (member && !(d->member = dh__strdup(member))))
        return FAIL(DH_ENOMEM, "%s: out of memory", ix->name);
    if (member)
        d->offset = (int64_t)(((const uint64_t *)ix->sec[DHX_S_DATA_OFF])[id] &
                              INT64_MAX);
    d->bytes = (int64_t)(dh_index_bytes(ix, id) & INT64_MAX);
    d->mtime_ns = (int64_t)(row_mtime(ix, id) & INT64_MAX);
    return 0;
}

static int row_profile(const struct dh_index *ix, uint64_t id,
                       struct dh_desc *d, struct dh_err *e)
{
    const char *name = dh_index_profile_name(
        ix, ((const uint16_t *)ix->sec[DHX_S_PROFILE])[id]);
    uint8_t kind = ix->sec[DHX_S_KIND][id];

    if (!name || strlen(name) >= sizeof(d->profile) || !dh_kind_name(kind))
        return FAIL(DH_EFORMAT, "%s: sample %llu: bad profile or kind",
                    ix->name, (unsigned long long)id);
    memcpy(d->profile, name, strlen(name) + 1);
    d->kind = (enum dh_kind)kind;
    return 0;
}

int dh_index_get(const struct dh_index *ix, uint64_t id, struct dh_desc *d,
                 struct dh_err *e)
{
    struct dh_index_columns c;
    int rc;

    dh_desc_fini(d);
    if (id >= ix->count)
        return FAIL(DH_EINVAL, "%s: id %llu out of range", ix->name,
                    (unsigned long long)id);
    if ((rc = row_profile(ix, id, d, e)) || (rc = row_strings(ix, id, d, e))) {
        dh_desc_fini(d);
        return rc;
    }
    dh_index_columns(ix, &c);
    d->id = (int64_t)id;
    d->est_tokens = c.est_tokens[id];
    d->est_cpu_ms = c.est_cpu_ms[id];
    d->est_out_bytes = (int64_t)(c.est_out_bytes[id] & INT64_MAX);
    d->frames = c.frames[id];
    d->width = c.width[id];
    d->height = c.height[id];
    return 0;
}
