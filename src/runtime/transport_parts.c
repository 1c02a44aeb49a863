/*
 * transport_parts.c - striped payloads, the pure half (transport.h
 * "Striped payloads", docs/wire-protocol.md "Payload parts"): the part
 * frame's format, how a payload of `length` bytes is cut into `count`
 * parts, and the receiver's reassembly table.
 *
 * Design notes:
 *   - Why parts at all: with CURVE, libzmq boxes and unboxes a connection's
 *     messages on that connection's one I/O thread, so one connection moves
 *     at most one core's cipher rate.  A sender cuts a large payload into
 *     parts, one per connection of its link (transport.c), each connection
 *     on its own I/O thread at both ends; this file puts them back together.
 *   - Format: a part is the whole payload message with one frame in front,
 *     [part frame][ResultNotice envelope][data], the part frame being 16
 *     bytes: 0xff 'D' 'H' 'P', version 1, three zero bytes, index and count
 *     as little-endian u32.  No Envelope can start with 0xff (a protobuf
 *     tag of wire type 7 does not exist), so a receiver tells a part from a
 *     whole payload ([envelope][data frames...]) by its first frame alone.
 *   - Cuts are fixed by (length, count): part i holds length / count bytes,
 *     one more for i < length % count, in index order.  A receiver knows
 *     each part's exact size, so a short, long or misplaced part is refused
 *     before it is kept.
 *   - Reassembly keeps ZeroMQ's frames (no copy) in a bounded table of sets
 *     keyed by task id.  A set belongs to the first part's sender (its
 *     server id and the connection's peer host): a part claiming another
 *     sender is refused and the set goes on; the sender's own inconsistent
 *     part (another count or length, a header differing by one byte, a
 *     wrong size, an index seen before) drops the whole set, since the
 *     payload can no longer be trusted.  A set that sees no new part for
 *     timeout_ms is dropped by dh__tp_asm_expire().  Every drop is the
 *     caller's to count and log; nothing here does I/O.
 *   - Bounds: max_sets sets and max_bytes of kept data frames; a part that
 *     would pass either is refused (the set it would start, or the set it
 *     belongs to, is dropped: its sender times out and the Coordinator
 *     re-routes).
 *
 * Locking: none; a table is used by its owner's thread only.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/le.h"
#include "runtime/transport.h"

/* ---- the part frame ---- */

static const uint8_t part_magic[5] = {0xff, 'D', 'H', 'P', 1};

void dh__tp_part_encode(uint8_t out[DH_TP_PART_HDR], uint32_t index,
                        uint32_t count)
{
    memset(out, 0, DH_TP_PART_HDR);
    memcpy(out, part_magic, sizeof(part_magic));
    dh__put_le32(out + 8, index);
    dh__put_le32(out + 12, count);
}

int dh__tp_part_decode(const void *buf, size_t len, uint32_t *index,
                       uint32_t *count, struct dh_err *e)
{
    const uint8_t *p = buf;

    if (len == 0 || p[0] != 0xff)
        return 0; /* not a part frame: an envelope, or garbage for it */
    if (len != DH_TP_PART_HDR || memcmp(p, part_magic, sizeof(part_magic)) ||
        p[5] || p[6] || p[7])
        return dh_err_set(e, DH_EPROTO,
                          "a part frame of %zu bytes is not version 1's %d",
                          len, DH_TP_PART_HDR);
    *index = dh__get_le32(p + 8);
    *count = dh__get_le32(p + 12);
    return 1;
}

uint32_t dh__tp_part_count(uint64_t length, uint32_t stripes)
{
    if (stripes < 2 || length < DH_TP_STRIPE_MIN)
        return 1;
    return stripes > DH_TP_MAX_PARTS ? DH_TP_MAX_PARTS : stripes;
}

int dh__tp_part_span(uint64_t length, uint32_t count, uint32_t index,
                     uint64_t *off, uint64_t *len)
{
    uint64_t base, rem;

    if (count < 1 || count > DH_TP_MAX_PARTS || index >= count ||
        length < count)
        return DH_EINVAL;
    base = length / count;
    rem = length % count;
    *off = (uint64_t)index * base + (index < rem ? index : rem);
    *len = base + (index < rem ? 1 : 0);
    return 0;
}

/* ---- reassembly ---- */

struct tp_set {
    int used;
    uint64_t task;
    uint32_t server, count, have;
    uint64_t length, bytes, deadline_ms;
    uint32_t seen; /* bit i: part i is kept (DH_TP_MAX_PARTS <= 32) */
    char host[sizeof(((struct dh_tp_from *)0)->addr)];
    zmq_msg_t hdr;                   /* the first part's envelope */
    zmq_msg_t data[DH_TP_MAX_PARTS]; /* by index, valid where seen */
};

struct dh_tp_asm {
    struct dh_tp_asm_opts o;
    struct tp_set *sets;
    uint64_t bytes; /* data frames kept, all sets */
};

int dh__tp_asm_create(const struct dh_tp_asm_opts *o, struct dh_tp_asm **out,
                      struct dh_err *e)
{
    struct dh_tp_asm *a;

    if (o->max_sets < 1 || o->max_bytes < 1 || o->timeout_ms < 1)
        return dh_err_set(e, DH_EINVAL,
                          "payload reassembly: max_sets, max_bytes and "
                          "timeout_ms must be >= 1");
    if (!(a = dh__calloc(1, sizeof(*a))) ||
        !(a->sets = dh__calloc(o->max_sets, sizeof(*a->sets)))) {
        dh__free(a);
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    }
    a->o = *o;
    *out = a;
    return 0;
}

static void set_drop(struct dh_tp_asm *a, struct tp_set *s)
{
    zmq_msg_close(&s->hdr);
    for (uint32_t i = 0; i < s->count; i++)
        if (s->seen & (1u << i))
            zmq_msg_close(&s->data[i]);
    a->bytes -= s->bytes;
    memset(s, 0, sizeof(*s));
}

void dh__tp_asm_destroy(struct dh_tp_asm *a)
{
    if (!a)
        return;
    for (unsigned i = 0; i < a->o.max_sets; i++)
        if (a->sets[i].used)
            set_drop(a, &a->sets[i]);
    dh__free(a->sets);
    dh__free(a);
}

unsigned dh__tp_asm_open(const struct dh_tp_asm *a)
{
    unsigned n = 0;

    for (unsigned i = 0; i < a->o.max_sets; i++)
        n += a->sets[i].used ? 1 : 0;
    return n;
}

static struct tp_set *set_find(struct dh_tp_asm *a, uint64_t task)
{
    for (unsigned i = 0; i < a->o.max_sets; i++)
        if (a->sets[i].used && a->sets[i].task == task)
            return &a->sets[i];
    return NULL;
}

static struct tp_set *set_free_slot(struct dh_tp_asm *a)
{
    for (unsigned i = 0; i < a->o.max_sets; i++)
        if (!a->sets[i].used)
            return &a->sets[i];
    return NULL;
}

/* The part on its own: index, count and size agree with its header. */
static int check_part(const struct dh_tp_part *p, struct dh_err *e)
{
    uint64_t off, len;
    size_t got = zmq_msg_size(p->data);

    if (p->count < 2 || p->count > DH_TP_MAX_PARTS || p->index >= p->count)
        return dh_err_set(e, DH_EPROTO,
                          "task %llu: part %u of %u (a payload is cut into "
                          "2..%d parts)",
                          (unsigned long long)p->task, p->index, p->count,
                          DH_TP_MAX_PARTS);
    if (dh__tp_part_span(p->length, p->count, p->index, &off, &len) < 0)
        return dh_err_set(e, DH_EPROTO,
                          "task %llu: %llu bytes cannot be cut into %u parts",
                          (unsigned long long)p->task,
                          (unsigned long long)p->length, p->count);
    if (got != len)
        return dh_err_set(e, DH_EPROTO,
                          "task %llu: part %u of %u holds %zu bytes, its cut "
                          "of %llu is %llu",
                          (unsigned long long)p->task, p->index, p->count, got,
                          (unsigned long long)p->length,
                          (unsigned long long)len);
    return 0;
}

static int same_header(struct tp_set *s, const zmq_msg_t *hdr)
{
    zmq_msg_t *h = (zmq_msg_t *)hdr; /* zmq_msg_data() takes no const */

    return zmq_msg_size(&s->hdr) == zmq_msg_size(h) &&
           !memcmp(zmq_msg_data(&s->hdr), zmq_msg_data(h), zmq_msg_size(h));
}

/* A part from the set's own sender that contradicts the set: 0 if it fits,
 * else the reason (the caller drops the set). */
static int contradicts(struct tp_set *s, const struct dh_tp_part *p,
                       struct dh_err *e)
{
    if (p->count != s->count || p->length != s->length)
        return dh_err_set(e, DH_EPROTO,
                          "part %u says %u parts of %llu bytes, the first "
                          "said %u of %llu",
                          p->index, p->count, (unsigned long long)p->length,
                          s->count, (unsigned long long)s->length);
    if (s->seen & (1u << p->index))
        return dh_err_set(e, DH_EPROTO, "part %u of %u came twice", p->index,
                          p->count);
    if (!same_header(s, p->hdr))
        return dh_err_set(e, DH_EPROTO,
                          "part %u's header differs from the first part's",
                          p->index);
    return check_part(p, e);
}

/* Appends " from server S (host): the payload is dropped" to e. */
static int dropped(struct dh_tp_asm *a, struct tp_set *s, struct dh_err *e)
{
    size_t n = strlen(e->msg);

    snprintf(e->msg + n, sizeof(e->msg) - n,
             "; task %llu from server %u: its %u of %u parts are dropped",
             (unsigned long long)s->task, s->server, s->have, s->count);
    set_drop(a, s);
    return DH_EPROTO;
}

/* Room for `len` more bytes; 0 or the refusal. */
static int room(struct dh_tp_asm *a, const struct dh_tp_part *p,
                struct dh_err *e)
{
    uint64_t len = zmq_msg_size(p->data);

    if (a->bytes + len > a->o.max_bytes)
        return dh_err_set(e, DH_EPROTO,
                          "task %llu: part %u of %u: payloads being "
                          "assembled already hold %llu bytes (cap %llu)",
                          (unsigned long long)p->task, p->index, p->count,
                          (unsigned long long)a->bytes,
                          (unsigned long long)a->o.max_bytes);
    return 0;
}

static struct tp_set *set_start(struct dh_tp_asm *a, const struct dh_tp_part *p,
                                struct dh_err *e)
{
    struct tp_set *s;

    if (check_part(p, e) < 0 || room(a, p, e) < 0)
        return NULL;
    if (!(s = set_free_slot(a))) {
        dh_err_set(e, DH_EPROTO,
                   "task %llu: %u payloads are being assembled already (the "
                   "cap)",
                   (unsigned long long)p->task, a->o.max_sets);
        return NULL;
    }
    s->used = 1;
    s->task = p->task;
    s->server = p->server;
    s->count = p->count;
    s->length = p->length;
    snprintf(s->host, sizeof(s->host), "%s", p->host ? p->host : "");
    zmq_msg_init(&s->hdr);
    zmq_msg_move(&s->hdr, p->hdr);
    return s;
}

/* Moves the complete set's frames out: header, then data by index. */
static void set_take(struct dh_tp_asm *a, struct tp_set *s, zmq_msg_t *out,
                     int *n_out)
{
    zmq_msg_init(&out[0]);
    zmq_msg_move(&out[0], &s->hdr);
    for (uint32_t i = 0; i < s->count; i++) {
        zmq_msg_init(&out[1 + i]);
        zmq_msg_move(&out[1 + i], &s->data[i]);
    }
    *n_out = (int)s->count + 1;
    s->seen = 0; /* moved out: set_drop() closes only the (empty) header */
    set_drop(a, s);
}

int dh__tp_asm_add(struct dh_tp_asm *a, const struct dh_tp_part *p,
                   uint64_t now_ms, zmq_msg_t *out, int *n_out,
                   struct dh_err *e)
{
    struct tp_set *s = set_find(a, p->task);
    const char *host = p->host ? p->host : "";

    if (s && (s->server != p->server || strcmp(s->host, host)))
        return dh_err_set(e, DH_EPROTO,
                          "task %llu: part %u of %u claims server %u at %s, "
                          "but the payload is being assembled from server %u "
                          "at %s: refused",
                          (unsigned long long)p->task, p->index, p->count,
                          p->server, host[0] ? host : "(unknown)", s->server,
                          s->host[0] ? s->host : "(unknown)");
    if (s && (contradicts(s, p, e) < 0 || room(a, p, e) < 0))
        return dropped(a, s, e);
    if (!s && !(s = set_start(a, p, e)))
        return DH_EPROTO;
    zmq_msg_init(&s->data[p->index]);
    zmq_msg_move(&s->data[p->index], p->data);
    s->seen |= 1u << p->index;
    s->have++;
    s->bytes += zmq_msg_size(&s->data[p->index]);
    a->bytes += zmq_msg_size(&s->data[p->index]);
    s->deadline_ms = now_ms + a->o.timeout_ms;
    if (s->have < s->count)
        return 0;
    set_take(a, s, out, n_out);
    return 1;
}

int dh__tp_asm_expire(struct dh_tp_asm *a, uint64_t now_ms, struct dh_err *e)
{
    for (unsigned i = 0; i < a->o.max_sets; i++) {
        struct tp_set *s = &a->sets[i];

        if (!s->used || now_ms < s->deadline_ms)
            continue;
        dh_err_set(e, DH_ETIMEOUT,
                   "task %llu from server %u at %s: %u of %u payload parts "
                   "arrived, then none for %llu ms: they are dropped",
                   (unsigned long long)s->task, s->server,
                   s->host[0] ? s->host : "(unknown)", s->have, s->count,
                   (unsigned long long)a->o.timeout_ms);
        set_drop(a, s);
        return 1;
    }
    return 0;
}
