/*
 * desc.c - the descriptor record (DESIGN 4.2): init/fini, JSON <-> struct.
 *
 * Design: one table of known fields (name, type, offset, range) drives both
 * parsing and validation, so a field's contract lives in one place.  Parsing
 * walks the object once in its key order; unknown keys are moved into a side
 * object that is dumped compactly into `extra_json`.  Doubles are written
 * with the shortest of 15 or 17 significant digits that round-trips every
 * real in the record, so output stays readable and reads back bit-exact.
 *
 * Locking: none; pure functions on caller-owned records.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/desc_json.h"
#include "datahelix/table.h"

enum ftype { F_INT, F_REAL, F_STR, F_BUF, F_KIND };

struct field {
    const char *name;
    enum ftype type;
    size_t off;
    size_t size; /* int width (4/8) or buffer size */
    double lo, hi;
};

#define DESC_OFF(m) offsetof(struct dh_desc, m)
#define DESC_SZ(m) sizeof(((struct dh_desc *)0)->m)
#define I64MAX 9223372036854775807.0

/* Order here is the order fields are written in. */
static const struct field fields[] = {
    {"id", F_INT, DESC_OFF(id), 8, 0, (double)(DH_TABLE_ID_MAX - 1)},
    {"path", F_STR, DESC_OFF(path), 0, 0, 0},
    {"member", F_STR, DESC_OFF(member), 0, 0, 0},
    {"offset", F_INT, DESC_OFF(offset), 8, 0, I64MAX},
    {"kind", F_KIND, DESC_OFF(kind), 0, 0, 0},
    {"bytes", F_INT, DESC_OFF(bytes), 8, 0, I64MAX},
    {"mtime_ns", F_INT, DESC_OFF(mtime_ns), 8, 0, I64MAX},
    {"codec", F_BUF, DESC_OFF(codec), DH_CODEC_MAX, 0, 0},
    {"width", F_INT, DESC_OFF(width), 4, 0, 2147483647.0},
    {"height", F_INT, DESC_OFF(height), 4, 0, 2147483647.0},
    {"rotation", F_INT, DESC_OFF(rotation), 4, -360, 360},
    {"fps", F_REAL, DESC_OFF(fps), 0, 0, HUGE_VAL},
    {"duration_s", F_REAL, DESC_OFF(duration_s), 0, 0, HUGE_VAL},
    {"frames", F_INT, DESC_OFF(frames), 8, 0, I64MAX},
    {"text", F_STR, DESC_OFF(text), 0, 0, 0},
    {"profile", F_BUF, DESC_OFF(profile), DH_PROFILE_MAX, 0, 0},
    {"est_cpu_ms", F_REAL, DESC_OFF(est_cpu_ms), 0, 0, HUGE_VAL},
    {"est_out_bytes", F_INT, DESC_OFF(est_out_bytes), 8, 0, I64MAX},
    {"est_tokens", F_INT, DESC_OFF(est_tokens), 8, 0, I64MAX},
    {"audio_codec", F_BUF, DESC_OFF(audio_codec), DH_CODEC_MAX, 0, 0},
    {"audio_rate", F_INT, DESC_OFF(audio_rate), 4, 0, 2147483647.0},
    {"audio_channels", F_INT, DESC_OFF(audio_channels), 4, 0, 2147483647.0},
    {"audio_duration_s", F_REAL, DESC_OFF(audio_duration_s), 0, 0, HUGE_VAL},
    {"audio_start_s", F_REAL, DESC_OFF(audio_start_s), 0, -HUGE_VAL, HUGE_VAL},
};
#define NFIELDS (sizeof(fields) / sizeof(fields[0]))

static const char *const kind_names[] = {"video", "image", "text", "audio"};

const char *dh_kind_name(enum dh_kind k)
{
    if ((unsigned)k >= sizeof(kind_names) / sizeof(kind_names[0]))
        return NULL;
    return kind_names[k];
}

int dh_kind_parse(const char *s, enum dh_kind *out)
{
    for (unsigned i = 0; s && i < sizeof(kind_names) / sizeof(kind_names[0]);
         i++) {
        if (strcmp(s, kind_names[i]) == 0) {
            *out = (enum dh_kind)i;
            return 0;
        }
    }
    return DH_EINVAL;
}

void dh_desc_source(const struct dh_desc *d, struct dh_source_ref *out)
{
    out->path = d->path;
    out->member = d->member;
    out->offset = d->member ? d->offset : 0;
    out->size = d->bytes > 0 ? d->bytes : 0;
    out->mtime_ns = d->mtime_ns > 0 ? d->mtime_ns : 0;
}

void dh_desc_init(struct dh_desc *d)
{
    memset(d, 0, sizeof(*d));
}

void dh_desc_fini(struct dh_desc *d)
{
    if (!d)
        return;
    dh__free(d->path);
    dh__free(d->member);
    dh__free(d->text);
    dh__free(d->extra_json);
    dh_desc_init(d);
}

static const struct field *find_field(const char *name)
{
    for (size_t i = 0; i < NFIELDS; i++)
        if (strcmp(fields[i].name, name) == 0)
            return &fields[i];
    return NULL;
}

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "object";
    case JSON_ARRAY:
        return "array";
    case JSON_STRING:
        return "string";
    case JSON_INTEGER:
        return "integer";
    case JSON_REAL:
        return "real";
    case JSON_TRUE:
    case JSON_FALSE:
        return "boolean";
    default:
        return "null";
    }
}

static int type_error(const struct field *f, const char *want, const json_t *v,
                      struct dh_err *e)
{
    return dh_err_set(e, DH_EFORMAT, "field '%s': expected %s, got %s", f->name,
                      want, type_name(v));
}

static int range_error(const struct field *f, struct dh_err *e)
{
    return dh_err_set(e, DH_EFORMAT, "field '%s': value out of range", f->name);
}

static int parse_int(const struct field *f, const json_t *v, char *slot,
                     struct dh_err *e)
{
    json_int_t x;

    if (!json_is_integer(v))
        return type_error(f, "integer", v, e);
    x = json_integer_value(v);
    if ((double)x < f->lo || (double)x > f->hi)
        return range_error(f, e);
    if (f->size == 8) {
        int64_t w = (int64_t)x;
        memcpy(slot, &w, sizeof(w));
    } else {
        int32_t w = (int32_t)x;
        memcpy(slot, &w, sizeof(w));
    }
    return 0;
}

static int parse_real(const struct field *f, const json_t *v, char *slot,
                      struct dh_err *e)
{
    double x;

    if (!json_is_number(v))
        return type_error(f, "number", v, e);
    x = json_number_value(v);
    if (!isfinite(x) || x < f->lo || x > f->hi)
        return range_error(f, e);
    memcpy(slot, &x, sizeof(x));
    return 0;
}

static int parse_str(const struct field *f, const json_t *v, char *slot,
                     struct dh_err *e)
{
    char *s;

    if (!json_is_string(v))
        return type_error(f, "string", v, e);
    if ((f->off == DESC_OFF(path) || f->off == DESC_OFF(member)) &&
        json_string_length(v) == 0)
        return dh_err_set(e, DH_EFORMAT, "field '%s': empty string", f->name);
    s = dh__strndup(json_string_value(v), json_string_length(v));
    if (!s)
        return dh_err_set(e, DH_ENOMEM, "field '%s': out of memory", f->name);
    memcpy(slot, &s, sizeof(s));
    return 0;
}

static int parse_buf(const struct field *f, const json_t *v, char *slot,
                     struct dh_err *e)
{
    size_t n;

    if (!json_is_string(v))
        return type_error(f, "string", v, e);
    n = json_string_length(v);
    if (n >= f->size)
        return dh_err_set(e, DH_EFORMAT,
                          "field '%s': string longer than %zu bytes", f->name,
                          f->size - 1);
    memcpy(slot, json_string_value(v), n + 1);
    return 0;
}

static int parse_kind(const struct field *f, const json_t *v, struct dh_desc *d,
                      struct dh_err *e)
{
    if (!json_is_string(v))
        return type_error(f, "string", v, e);
    if (dh_kind_parse(json_string_value(v), &d->kind) != 0)
        return dh_err_set(e, DH_EFORMAT,
                          "field 'kind': expected video, image, text or "
                          "audio");
    return 0;
}

static int parse_field(const struct field *f, const json_t *v,
                       struct dh_desc *d, struct dh_err *e)
{
    char *slot = (char *)d + f->off;

    switch (f->type) {
    case F_INT:
        return parse_int(f, v, slot, e);
    case F_REAL:
        return parse_real(f, v, slot, e);
    case F_STR:
        return parse_str(f, v, slot, e);
    case F_BUF:
        return parse_buf(f, v, slot, e);
    default:
        return parse_kind(f, v, d, e);
    }
}

static int check_required(const struct dh_desc *d, unsigned seen,
                          struct dh_err *e)
{
    if (!(seen & 1u))
        return dh_err_set(e, DH_EFORMAT, "missing field 'id'");
    if (!(seen & 2u))
        return dh_err_set(e, DH_EFORMAT, "missing field 'kind'");
    if (!d->path && !(d->kind == DH_KIND_TEXT && d->text))
        return dh_err_set(e, DH_EFORMAT, "missing field 'path'");
    if (d->member && !d->path)
        return dh_err_set(e, DH_EFORMAT,
                          "field 'member' without the shard's 'path'");
    if (d->member && d->bytes <= 0)
        return dh_err_set(e, DH_EFORMAT,
                          "field 'member' needs the member's size in "
                          "'bytes' (re-run `datahelix probe` on the shard)");
    if (!d->member && d->offset)
        return dh_err_set(e, DH_EFORMAT,
                          "field 'offset' without a shard 'member'");
    return 0;
}

/* Moves an unknown key into `*extra` (created on first use). */
static int keep_unknown(json_t **extra, const char *key, json_t *v,
                        struct dh_err *e)
{
    if (!*extra && !(*extra = json_object()))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    if (json_object_set(*extra, key, v) != 0)
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    return 0;
}

static int dump_extra(json_t *extra, struct dh_desc *d, struct dh_err *e)
{
    if (!extra)
        return 0;
    d->extra_json = json_dumps(extra, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!d->extra_json)
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    return 0;
}

int dh__desc_from_object(json_t *obj, struct dh_desc *d, struct dh_err *e)
{
    json_t *extra = NULL, *v;
    const char *key;
    unsigned seen = 0;
    int rc = 0;

    dh_desc_fini(d);
    if (!json_is_object(obj))
        return dh_err_set(e, DH_EFORMAT, "expected a JSON object, got %s",
                          type_name(obj));
    json_object_foreach(obj, key, v)
    {
        const struct field *f = find_field(key);

        /* the table's header record is keyed so; as a descriptor's extra
         * field it could not be written back (add_extra refuses it) */
        if (!f && strcmp(key, "datahelix_header") == 0) {
            rc = dh_err_set(e, DH_EFORMAT,
                            "field 'datahelix_header' is reserved for the "
                            "table's header record");
            goto out_free;
        }
        rc = f ? parse_field(f, v, d, e) : keep_unknown(&extra, key, v, e);
        if (rc)
            goto out_free;
        seen |= (f && f->off == DESC_OFF(id)) ? 1u : 0u;
        seen |= (f && f->type == F_KIND) ? 2u : 0u;
    }
    rc = check_required(d, seen, e);
    if (!rc)
        rc = dump_extra(extra, d, e);
out_free:
    json_decref(extra);
    if (rc)
        dh_desc_fini(d);
    return rc;
}

int dh__json_error_is_oom(const json_error_t *je)
{
    void *probe;

    if (json_error_code(je) == json_error_out_of_memory || !je->text[0])
        return 1; /* empty: jansson could not even set up its lexer */
    probe = dh__malloc(4096);
    dh__free(probe);
    return probe == NULL;
}

int dh__json_load_error(const json_error_t *je, struct dh_err *e)
{
    if (dh__json_error_is_oom(je))
        return dh_err_set(e, DH_ENOMEM, "out of memory while parsing JSON");
    return dh_err_set(e, DH_EFORMAT, "bad JSON at column %d: %s", je->column,
                      je->text);
}

int dh_desc_from_json(const char *line, size_t len, struct dh_desc *d,
                      struct dh_err *e)
{
    json_error_t je;
    json_t *obj;
    int rc;

    dh__alloc_init();
    dh_desc_fini(d);
    obj = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
    if (!obj)
        return dh__json_load_error(&je, e);
    rc = dh__desc_from_object(obj, d, e);
    json_decref(obj);
    return rc;
}

/* ---- writing ---- */

static int reals_need_17(const struct dh_desc *d)
{
    const double v[] = {d->fps, d->duration_s, d->est_cpu_ms};
    char buf[64];

    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        snprintf(buf, sizeof(buf), "%.15g", v[i]);
        if (strtod(buf, NULL) != v[i])
            return 1;
    }
    return 0;
}

static json_t *field_value(const struct field *f, const struct dh_desc *d)
{
    const char *slot = (const char *)d + f->off;
    int64_t i64;
    int32_t i32;
    double x;
    char *s;

    switch (f->type) {
    case F_INT:
        if (f->size == 8) {
            memcpy(&i64, slot, sizeof(i64));
            return json_integer(i64);
        }
        memcpy(&i32, slot, sizeof(i32));
        return json_integer(i32);
    case F_REAL:
        memcpy(&x, slot, sizeof(x));
        return json_real(x);
    case F_STR:
        memcpy(&s, slot, sizeof(s));
        return json_string(s);
    case F_BUF:
        return json_stringn(slot, strnlen(slot, f->size));
    default:
        return json_string(dh_kind_name(d->kind));
    }
}

/* Fields that are omitted when empty. */
static int skip_field(const struct field *f, const struct dh_desc *d)
{
    if (f->off == DESC_OFF(rotation))
        return d->rotation == 0;
    if (f->off == DESC_OFF(mtime_ns))
        return d->mtime_ns <= 0;
    if (f->off >= DESC_OFF(audio_codec) && f->off <= DESC_OFF(audio_start_s))
        return d->audio_codec[0] == 0; /* no audio stream */
    if (f->off == DESC_OFF(text))
        return d->text == NULL;
    if (f->off == DESC_OFF(path))
        return d->path == NULL;
    if (f->off == DESC_OFF(member) || f->off == DESC_OFF(offset))
        return d->member == NULL;
    return 0;
}

static int validate_out(const struct dh_desc *d)
{
    if (d->id < 0 || d->id >= DH_TABLE_ID_MAX || !dh_kind_name(d->kind))
        return DH_EINVAL;
    if (!d->path && !(d->kind == DH_KIND_TEXT && d->text))
        return DH_EINVAL;
    if (d->path && !d->path[0])
        return DH_EINVAL;
    if (d->member && (!d->member[0] || !d->path || d->offset < 0))
        return DH_EINVAL;
    if (!memchr(d->codec, 0, sizeof(d->codec)) ||
        !memchr(d->profile, 0, sizeof(d->profile)))
        return DH_EINVAL;
    return 0;
}

/* Why field_value() gave NULL: a bad value (DH_EINVAL) or no memory. */
static int value_error(const struct field *f, const struct dh_desc *d)
{
    const char *slot = (const char *)d + f->off;
    json_t *probe;
    double x;

    if (f->type == F_REAL) {
        memcpy(&x, slot, sizeof(x));
        return isfinite(x) ? DH_ENOMEM : DH_EINVAL;
    }
    if (f->type != F_STR && f->type != F_BUF)
        return DH_ENOMEM;
    /* jansson refuses invalid UTF-8; the unchecked variant does not, so
     * if it succeeds the text was the problem. */
    probe = json_string_nocheck("");
    json_decref(probe);
    return probe ? DH_EINVAL : DH_ENOMEM;
}

static int add_known(json_t *obj, const struct dh_desc *d)
{
    for (size_t i = 0; i < NFIELDS; i++) {
        json_t *v;

        if (skip_field(&fields[i], d))
            continue;
        v = field_value(&fields[i], d);
        if (!v)
            return value_error(&fields[i], d);
        if (json_object_set_new_nocheck(obj, fields[i].name, v) != 0)
            return DH_ENOMEM;
    }
    return 0;
}

static int add_extra(json_t *obj, const char *extra_json)
{
    json_error_t je;
    json_t *extra, *v;
    const char *key;
    int rc = 0;

    if (!extra_json)
        return 0;
    extra = json_loads(extra_json, JSON_REJECT_DUPLICATES, &je);
    if (!extra)
        return dh__json_error_is_oom(&je) ? DH_ENOMEM : DH_EINVAL;
    if (!json_is_object(extra))
        rc = DH_EINVAL;
    json_object_foreach(extra, key, v)
    {
        if (rc)
            break;
        if (find_field(key) || strcmp(key, "datahelix_header") == 0)
            rc = DH_EINVAL; /* would shadow a known field */
        else if (json_object_set(obj, key, v) != 0)
            rc = DH_ENOMEM;
    }
    json_decref(extra);
    return rc;
}

int dh_desc_to_json(const struct dh_desc *d, char **out)
{
    size_t flags = JSON_COMPACT | JSON_PRESERVE_ORDER;
    json_t *obj;
    int rc;

    dh__alloc_init();
    if ((rc = validate_out(d)) != 0)
        return rc;
    if (!(obj = json_object()))
        return DH_ENOMEM;
    rc = add_known(obj, d);
    if (!rc)
        rc = add_extra(obj, d->extra_json);
    if (!rc) {
        /* extra reals were stored with 17 digits: keep them exact */
        flags |= JSON_REAL_PRECISION(d->extra_json || reals_need_17(d) ? 17
                                                                       : 15);
        *out = json_dumps(obj, flags);
        rc = *out ? 0 : DH_ENOMEM;
    }
    json_decref(obj);
    return rc;
}
