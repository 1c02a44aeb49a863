/*
 * arena.c - the shared-memory arena (src/include/datahelix/arena.h,
 * docs/arena.md).
 *
 * Design notes
 * - Region: one memfd (MFD_CLOEXEC | MFD_ALLOW_SEALING), sealed with
 *   F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, mapped MAP_SHARED by both
 *   processes.  Nothing is ever named in /dev/shm; the memory goes away
 *   with the last fd and mapping, whoever dies first.  Shrinking is sealed
 *   so that a peer can never truncate the file under our mapping (SIGBUS).
 * - Layout: [struct shm_hdr, rounded up to pages][data area].  The header
 *   holds the identity and geometry (written once by the creator), the
 *   process-shared robust mutex and CLOCK_MONOTONIC condvar, the allocator
 *   state and the slot descriptors.  Geometry is copied into the local
 *   struct dh_arena at attach and never re-read from shared memory, and
 *   every offset read from shared memory is checked against it before it
 *   becomes a pointer, so a peer scribbling on the header gets errors
 *   ("corrupt") rather than making us touch memory outside the mapping.
 * - Allocator: a ring.  Slots are carved from the head; a slot that does
 *   not fit before the end of the data area starts at 0 and is charged the
 *   skipped tail as padding; releases happen in any order (refcount to 0)
 *   and the tail advances over released slots in allocation order.  Why a
 *   ring rather than a fixed-size-slot free list: batches differ in size
 *   (balance="free", variable frame counts, microbatches), a ring serves
 *   any size without rounding every slot up to the largest batch, it keeps
 *   a slot contiguous (one tensor = one span), and it cannot fragment: the
 *   free space is always at most two runs ([head, end) and [0, tail)).
 *   Its one weakness - a slot held for long blocks reclaiming the slots
 *   after it - matches the consumer, which receives batches in request
 *   order and drops them in roughly that order.  When the ring empties,
 *   head and tail go back to 0, so a full-size slot always fits then.
 * - Slot descriptors live out of band, in the header, not in front of the
 *   data: a writer overrunning its slot cannot corrupt the allocator, and a
 *   bogus offset cannot forge a header.  Each allocation gets the next
 *   64-bit sequence number; its descriptor is slot[seq % MAX_SLOTS] and its
 *   generation is (uint32_t)seq, so looking up a ref is O(1) and a stale
 *   ref (the descriptor since reused, or released) never matches.
 * - State: seq_tail..seq_head (the window of slots not yet returned to the
 *   ring) and the descriptors in it are authoritative; head, tail, used,
 *   live and live_bytes are derived from them.  Updates write descriptors
 *   before they move seq_head / seq_tail (with a compiler fence: a SIGKILL
 *   lands between instructions), so a process killed inside the lock
 *   leaves a window of complete descriptors, and recovery (EOWNERDEAD)
 *   rebuilds the derived state from it - see repair().
 *
 * Locking: one robust process-shared mutex guards everything in the header
 * after the geometry; it is held for O(1) work (O(MAX_SLOTS) in repair),
 * never across a copy.  Acquisition is bounded (DH_ARENA_LOCK_TIMEOUT_MS).
 * Allocators wait on the condvar with the caller's deadline; a release
 * that returns space to the ring broadcasts.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "datahelix/arena.h"
#include "runtime/arena_internal.h"

#define ARENA_MAGIC "DHXARENA"
#define MAX_SLOTS ((uint64_t)DH_ARENA_MAX_SLOTS)
#define ABI_TAG                                                                \
    ((uint32_t)(sizeof(pthread_mutex_t) << 16 | sizeof(pthread_cond_t)))

struct shm_slot {
    uint64_t off;    /* data offset from the start of the data area */
    uint64_t len;    /* bytes asked for */
    uint64_t charge; /* ring bytes taken: wrap padding + aligned span */
    uint32_t gen;    /* (uint32_t)sequence number */
    uint32_t refs;   /* 0: released */
};

struct shm_hdr {
    /* identity and geometry: written once by the creator */
    unsigned char magic[8];
    uint32_t version;
    uint32_t layout; /* sizeof(struct shm_hdr) */
    uint32_t abi;    /* sizes of the pthread types */
    uint32_t max_slots;
    uint64_t align;
    uint64_t hdr_size;
    uint64_t data_size;
    uint64_t total_size;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* authoritative allocator state (under mu) */
    uint64_t seq_head; /* next sequence number to hand out */
    uint64_t seq_tail; /* oldest slot not yet returned to the ring */
    /* derived state, rebuilt by repair() */
    uint64_t head, tail, used, live_bytes;
    uint32_t live;
    uint32_t corrupt; /* sticky: the state failed a check */
    uint32_t waiting; /* allocs blocked for room now (atomic: read without
                         the lock by a consumer deciding it holds them up) */
    uint32_t pad_;
    /* counters */
    uint64_t allocs, releases, waits, timeouts, bad_releases, recoveries;
    struct shm_slot slot[DH_ARENA_MAX_SLOTS];
};

struct dh_arena {
    int fd;
    unsigned char *base; /* the whole mapping */
    size_t total;        /* bytes mapped */
    uint64_t hdr_size;   /* data area offset */
    uint64_t data_size;  /* data area bytes */
    struct shm_hdr *h;
};

#define FENCE() atomic_signal_fence(memory_order_seq_cst)

/* ---- small helpers ---- */

static uint64_t round_up(uint64_t v, uint64_t to)
{
    return (v + to - 1) / to * to;
}

static size_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);

    return p > 0 ? (size_t)p : 4096;
}

static uint64_t header_bytes(void)
{
    return round_up(sizeof(struct shm_hdr), page_size());
}

static int passed(const struct timespec *d)
{
    struct timespec now;

    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > d->tv_sec ||
           (now.tv_sec == d->tv_sec && now.tv_nsec >= d->tv_nsec);
}

/* "96 MiB", "1.5 GiB", "100 bytes" */
static const char *fmt_bytes(char *buf, size_t n, uint64_t b)
{
    static const char *unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;

    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%llu bytes", (unsigned long long)b);
    else if (v == (double)(uint64_t)v)
        snprintf(buf, n, "%.0f %s", v, unit[u]);
    else
        snprintf(buf, n, "%.1f %s", v, unit[u]);
    return buf;
}

static struct shm_slot *slot_of(struct dh_arena *a, uint64_t seq)
{
    return &a->h->slot[seq % MAX_SLOTS];
}

/* ---- derived state: rebuild and repair ---- */

/* Where the ring bytes of `s` begin (its padding, if it wrapped), or -1. */
static int64_t reserved_start(const struct dh_arena *a,
                              const struct shm_slot *s, uint64_t seq)
{
    uint64_t cap = a->data_size, span;

    if (s->gen != (uint32_t)seq || s->len == 0 || s->len > cap)
        return -1;
    span = round_up(s->len, DH_ARENA_ALIGN);
    if (s->off % DH_ARENA_ALIGN || s->off > cap - span || s->charge < span)
        return -1;
    if (s->charge == span)
        return (int64_t)s->off;
    if (s->off != 0 || s->charge - span >= cap)
        return -1;
    return (int64_t)(cap - (s->charge - span));
}

static uint64_t slot_end(const struct dh_arena *a, const struct shm_slot *s)
{
    uint64_t end = s->off + round_up(s->len, DH_ARENA_ALIGN);

    return end == a->data_size ? 0 : end;
}

/*
 * Recomputes head, tail, used, live, live_bytes from the window of
 * descriptors, checking that they tile the ring.  -1 if they do not.
 */
static int rebuild(struct dh_arena *a)
{
    struct shm_hdr *h = a->h;
    uint64_t pos = 0, used = 0, live_bytes = 0, seq;
    uint32_t live = 0;

    h->head = h->tail = 0;
    for (seq = h->seq_tail; seq != h->seq_head; seq++) {
        const struct shm_slot *s = slot_of(a, seq);
        int64_t rs = reserved_start(a, s, seq);

        if (rs < 0 || (seq != h->seq_tail && (uint64_t)rs != pos))
            return -1;
        if (seq == h->seq_tail)
            h->tail = (uint64_t)rs;
        pos = slot_end(a, s);
        used += s->charge;
        if (used > a->data_size)
            return -1;
        live += s->refs != 0;
        live_bytes += s->refs ? s->len : 0;
    }
    h->head = pos;
    h->used = used;
    h->live = live;
    h->live_bytes = live_bytes;
    return 0;
}

static int reclaim(struct dh_arena *a);

/*
 * After EOWNERDEAD: a process died holding the lock, maybe half way
 * through alloc, release or reclaim.  Repairs, in order:
 *  1. rebuilds head, tail, used, live and live_bytes from the window
 *     (an alloc that died before publishing seq_head leaves a descriptor
 *     outside the window: it is ignored - find() checks the window - and
 *     overwritten by the next alloc);
 *  2. reclaims released slots at the tail (a release that died between
 *     dropping the count and reclaiming);
 *  3. wakes every waiter (a wakeup may have been lost).
 * Counters (allocs, releases, ...) may be off by the one update that was
 * cut short.  If the window itself is inconsistent the arena is marked
 * corrupt and every later call fails with DH_EFORMAT.
 */
static void repair(struct dh_arena *a)
{
    struct shm_hdr *h = a->h;

    h->recoveries++;
    if (h->seq_head < h->seq_tail || h->seq_head - h->seq_tail > MAX_SLOTS) {
        h->corrupt = 1;
        return;
    }
    if (rebuild(a) != 0 || reclaim(a) < 0)
        h->corrupt = 1;
    pthread_cond_broadcast(&h->cv);
}

/* ---- locking ---- */

/* Called with the result of a lock attempt; on 0 the lock is held. */
static int locked(struct dh_arena *a, int rc, struct dh_err *e)
{
    if (rc == EOWNERDEAD) {
        pthread_mutex_consistent(&a->h->mu);
        repair(a);
        rc = 0;
    }
    if (rc == 0 && a->h->corrupt) {
        pthread_mutex_unlock(&a->h->mu);
        return dh_err_set(e, DH_EFORMAT,
                          "arena: shared allocator state is "
                          "corrupt; recreate the arena");
    }
    if (rc == 0)
        return 0;
    if (rc == ETIMEDOUT)
        return dh_err_set(e, DH_ETIMEOUT,
                          "arena: lock held for over %d ms "
                          "by another thread or process (stopped or hung?)",
                          DH_ARENA_LOCK_TIMEOUT_MS);
    if (rc == ENOTRECOVERABLE)
        return dh_err_set(e, DH_EPEERDEAD,
                          "arena: lock unrecoverable (a "
                          "peer died while repairing it); recreate the arena");
    return dh_err_set(e, DH_EIO, "arena: lock: %s", strerror(rc));
}

static int lock_arena(struct dh_arena *a, struct dh_err *e)
{
    struct timespec d;

    dh__mono_deadline(&d, DH_ARENA_LOCK_TIMEOUT_MS);
    return locked(a, pthread_mutex_clocklock(&a->h->mu, CLOCK_MONOTONIC, &d),
                  e);
}

static void unlock_arena(struct dh_arena *a)
{
    pthread_mutex_unlock(&a->h->mu);
}

/* Waits for a broadcast or the deadline.  0: lock held; else not held. */
static int wait_arena(struct dh_arena *a, const struct timespec *d,
                      struct dh_err *e)
{
    int rc = pthread_cond_timedwait(&a->h->cv, &a->h->mu, d);

    if (rc == ETIMEDOUT)
        rc = 0;
    if (rc == 0 || rc == EOWNERDEAD || rc == ENOTRECOVERABLE)
        return locked(a, rc, e);
    pthread_mutex_unlock(&a->h->mu);
    return dh_err_set(e, DH_EIO, "arena: wait: %s", strerror(rc));
}

/* ---- the ring ---- */

/*
 * Returns slots at the tail whose count is 0 to the ring.  Returns how
 * many, or -1 if the state is inconsistent (then marks it corrupt).
 */
static int reclaim(struct dh_arena *a)
{
    struct shm_hdr *h = a->h;
    int n = 0;

    while (h->seq_tail != h->seq_head && n < (int)MAX_SLOTS) {
        struct shm_slot *s = slot_of(a, h->seq_tail);

        if (s->refs)
            break;
        if (reserved_start(a, s, h->seq_tail) < 0 || s->charge > h->used) {
            h->corrupt = 1;
            return -1;
        }
        h->used -= s->charge;
        h->tail = slot_end(a, s);
        FENCE();
        h->seq_tail++;
        n++;
    }
    if (h->used == 0)
        h->head = h->tail = 0;
    return n;
}

/*
 * Finds room for `span` bytes: 1 and *off / *charge set, 0 if there is
 * none now, -1 if the state is inconsistent.
 */
static int place(struct dh_arena *a, uint64_t span, uint64_t *off,
                 uint64_t *charge)
{
    struct shm_hdr *h = a->h;
    uint64_t cap = a->data_size, head, tail;

    if (h->seq_head - h->seq_tail >= MAX_SLOTS)
        return 0;
    if (h->used == 0)
        h->head = h->tail = 0;
    head = h->head;
    tail = h->tail;
    if (head >= cap || tail >= cap || h->used > cap)
        return -1;
    *off = head;
    *charge = span;
    if (h->used == 0 || head > tail) {
        if (span <= cap - head)
            return 1;
        *off = 0;
        *charge = cap - head + span;
        return span <= tail;
    }
    return head < tail && span <= tail - head;
}

/* Publishes the slot placed at `off` and fills *out. */
static void commit(struct dh_arena *a, uint64_t off, uint64_t len,
                   uint64_t charge, struct dh_slot_ref *out)
{
    struct shm_hdr *h = a->h;
    uint64_t seq = h->seq_head;
    struct shm_slot *s = slot_of(a, seq);

    s->off = off;
    s->len = len;
    s->charge = charge;
    s->gen = (uint32_t)seq;
    s->refs = 1;
    FENCE();
    h->seq_head = seq + 1;
    FENCE();
    h->head = slot_end(a, s);
    h->used += charge;
    h->live++;
    h->live_bytes += len;
    h->allocs++;
    out->offset = a->hdr_size + off;
    out->len = len;
    out->gen = s->gen;
}

static int exhausted(struct dh_arena *a, uint64_t len, int timeout_ms,
                     struct dh_err *e)
{
    char held[32], need[32], cap[32];

    a->h->timeouts++;
    return dh_err_set(e, DH_EARENA,
                      "arena exhausted: %u slots (%s) "
                      "still held by the consumer after %d ms (need %s of %s)",
                      a->h->live,
                      fmt_bytes(held, sizeof(held), a->h->live_bytes),
                      timeout_ms, fmt_bytes(need, sizeof(need), len),
                      fmt_bytes(cap, sizeof(cap), a->data_size));
}

/*
 * The live descriptor `ref` names, or NULL.  Checks generation, offset and
 * length against the descriptor, that its sequence number is inside the
 * window, and (against local geometry) that it lies in the data area.
 */
static struct shm_slot *find(struct dh_arena *a, const struct dh_slot_ref *ref)
{
    struct shm_hdr *h = a->h;
    struct shm_slot *s;
    uint32_t age;

    if (!ref || ref->offset < a->hdr_size)
        return NULL;
    s = &h->slot[ref->gen % MAX_SLOTS];
    age = (uint32_t)(ref->gen - (uint32_t)h->seq_tail);
    if (age >= (uint32_t)(h->seq_head - h->seq_tail) || s->refs == 0 ||
        s->gen != ref->gen || s->len != ref->len ||
        s->off != ref->offset - a->hdr_size)
        return NULL;
    if (s->off > a->data_size || s->len > a->data_size - s->off)
        return NULL;
    return s;
}

static int bad_ref(struct dh_arena *a, const char *what,
                   const struct dh_slot_ref *ref, struct dh_err *e)
{
    a->h->bad_releases++;
    if (!ref)
        return dh_err_set(e, DH_EINVAL, "arena: %s of a NULL slot ref", what);
    return dh_err_set(e, DH_EINVAL,
                      "arena: %s of a stale or unknown slot "
                      "(offset %llu, len %llu, gen %u)",
                      what, (unsigned long long)ref->offset,
                      (unsigned long long)ref->len, ref->gen);
}

/* Drops one reference; 1 if the slot's count reached 0, 0, or < 0. */
static int release_locked(struct dh_arena *a, const struct dh_slot_ref *ref,
                          struct dh_err *e)
{
    struct shm_slot *s = find(a, ref);

    if (!s)
        return bad_ref(a, "release", ref, e);
    if (--s->refs)
        return 0;
    FENCE();
    a->h->live--;
    a->h->live_bytes -= s->len;
    a->h->releases++;
    return 1;
}

/* ---- creation and attachment ---- */

static int make_memfd(size_t total, int *out, struct dh_err *e)
{
    int fd = memfd_create("datahelix-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);

    if (fd < 0)
        return dh_err_set(e, DH_EIO, "arena: memfd_create: %s",
                          strerror(errno));
    if (ftruncate(fd, (off_t)total) != 0) {
        dh_err_set(e, DH_EIO, "arena: sizing the memfd to %zu bytes: %s", total,
                   strerror(errno));
        goto out_close_fd;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
        dh_err_set(e, DH_EIO, "arena: sealing the memfd: %s", strerror(errno));
        goto out_close_fd;
    }
    *out = fd;
    return 0;
out_close_fd:
    close(fd);
    return DH_EIO;
}

static int map_arena(struct dh_arena *a, size_t total, struct dh_err *e)
{
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);

    if (p == MAP_FAILED)
        return dh_err_set(e, DH_EIO, "arena: mmap of %zu bytes: %s", total,
                          strerror(errno));
    a->base = p;
    a->total = total;
    a->h = p;
    return 0;
}

static int init_sync(struct shm_hdr *h, struct dh_err *e)
{
    pthread_mutexattr_t ma;
    pthread_condattr_t ca;
    int rc;

    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
    rc = pthread_mutex_init(&h->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    if (rc)
        return dh_err_set(e, DH_EIO, "arena: mutex init: %s", strerror(rc));
    pthread_condattr_init(&ca);
    pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    rc = pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc)
        return dh_err_set(e, DH_EIO, "arena: condvar init: %s", strerror(rc));
    return 0;
}

/* The creator's header; the magic goes in last. */
static int init_header(struct dh_arena *a, struct dh_err *e)
{
    struct shm_hdr *h = a->h;
    int rc = init_sync(h, e);

    if (rc)
        return rc;
    h->version = DH_ARENA_VERSION;
    h->layout = sizeof(struct shm_hdr);
    h->abi = ABI_TAG;
    h->max_slots = DH_ARENA_MAX_SLOTS;
    h->align = DH_ARENA_ALIGN;
    h->hdr_size = a->hdr_size;
    h->data_size = a->data_size;
    h->total_size = a->total;
    h->seq_head = h->seq_tail = 1; /* generation 0 is never handed out */
    FENCE();
    memcpy(h->magic, ARENA_MAGIC, sizeof(h->magic));
    return 0;
}

size_t dh_arena_default_size(unsigned prefetch_depth, size_t batch_bytes)
{
    uint64_t slot, n = (uint64_t)prefetch_depth + 2, page = page_size();

    if (batch_bytes == 0 || batch_bytes > UINT64_MAX / 2)
        return 0;
    slot = round_up(batch_bytes, DH_ARENA_ALIGN);
    if (slot > (SIZE_MAX - page) / n)
        return 0;
    return (size_t)round_up(slot * n, page);
}

int dh_arena_create(size_t bytes, struct dh_arena **out, struct dh_err *e)
{
    struct dh_arena *a;
    uint64_t hdr = header_bytes(), page = page_size();
    int rc;

    if (!out || bytes == 0)
        return dh_err_set(e, DH_EINVAL, "arena: create needs a size > 0");
    if (bytes > (SIZE_MAX >> 2) - hdr - page)
        return dh_err_set(e, DH_ETOOBIG, "arena: %zu bytes is too large",
                          bytes);
    a = dh__calloc(1, sizeof(*a));
    if (!a)
        return dh_err_set(e, DH_ENOMEM, "arena: out of memory");
    a->hdr_size = hdr;
    a->data_size = round_up(bytes, page);
    rc = make_memfd(hdr + a->data_size, &a->fd, e);
    if (rc)
        goto out_free_arena;
    rc = map_arena(a, hdr + a->data_size, e);
    if (rc)
        goto out_close_fd;
    rc = init_header(a, e);
    if (rc)
        goto out_unmap;
    *out = a;
    return 0;
out_unmap:
    munmap(a->base, a->total);
out_close_fd:
    close(a->fd);
out_free_arena:
    dh__free(a);
    return rc;
}

/* What can be checked before mapping: type, size, seals. */
static int check_fd(int fd, size_t *total, struct dh_err *e)
{
    struct stat st;
    uint64_t min = header_bytes() + page_size();
    int seals;

    if (fstat(fd, &st) != 0)
        return dh_err_set(e, DH_EIO, "arena fd %d: fstat: %s", fd,
                          strerror(errno));
    if (!S_ISREG(st.st_mode))
        return dh_err_set(e, DH_EFORMAT,
                          "arena fd %d: not a memfd (file "
                          "type %o)",
                          fd, (unsigned)(st.st_mode & S_IFMT));
    if (st.st_size < 0 || (uint64_t)st.st_size < min ||
        (uint64_t)st.st_size > (SIZE_MAX >> 2))
        return dh_err_set(e, DH_EFORMAT,
                          "arena fd %d: %lld bytes is not an "
                          "arena size (at least %llu)",
                          fd, (long long)st.st_size, (unsigned long long)min);
    seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0)
        return dh_err_set(e, DH_EFORMAT,
                          "arena fd %d: not a sealable memfd "
                          "(%s)",
                          fd, strerror(errno));
    if (!(seals & F_SEAL_SHRINK))
        return dh_err_set(e, DH_EFORMAT,
                          "arena fd %d: memfd not sealed "
                          "against shrinking",
                          fd);
    *total = (size_t)st.st_size;
    return 0;
}

static int check_header(const struct dh_arena *a, struct dh_err *e)
{
    const struct shm_hdr *h = a->h;

    if (memcmp(h->magic, ARENA_MAGIC, sizeof(h->magic)) != 0)
        return dh_err_set(e, DH_EFORMAT,
                          "arena fd %d: bad magic: not a "
                          "datahelix arena",
                          a->fd);
    if (h->version != DH_ARENA_VERSION)
        return dh_err_set(e, DH_EVERSION,
                          "arena fd %d: version %u, this "
                          "build reads %u",
                          a->fd, h->version, DH_ARENA_VERSION);
    if (h->layout != sizeof(struct shm_hdr) || h->abi != ABI_TAG ||
        h->max_slots != DH_ARENA_MAX_SLOTS || h->align != DH_ARENA_ALIGN)
        return dh_err_set(e, DH_EFORMAT,
                          "arena fd %d: header layout differs "
                          "from this build's (another ABI?)",
                          a->fd);
    if (h->hdr_size != a->hdr_size || h->total_size != a->total ||
        h->data_size != a->data_size)
        return dh_err_set(e, DH_EFORMAT,
                          "arena fd %d: header says %llu + "
                          "%llu = %llu bytes, the fd has %zu",
                          a->fd, (unsigned long long)h->hdr_size,
                          (unsigned long long)h->data_size,
                          (unsigned long long)h->total_size, a->total);
    return 0;
}

int dh_arena_attach(int fd, struct dh_arena **out, struct dh_err *e)
{
    struct dh_arena *a;
    size_t total = 0;
    int rc;

    if (fd < 0 || !out)
        return dh_err_set(e, DH_EINVAL, "arena: attach needs an fd");
    rc = check_fd(fd, &total, e);
    if (rc)
        return rc;
    a = dh__calloc(1, sizeof(*a));
    if (!a)
        return dh_err_set(e, DH_ENOMEM, "arena: out of memory");
    a->hdr_size = header_bytes();
    a->data_size = total - a->hdr_size;
    a->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (a->fd < 0) {
        rc = dh_err_set(e, DH_EIO, "arena fd %d: dup: %s", fd, strerror(errno));
        goto out_free_arena;
    }
    rc = map_arena(a, total, e);
    if (rc)
        goto out_close_fd;
    rc = check_header(a, e);
    if (rc)
        goto out_unmap;
    *out = a;
    return 0;
out_unmap:
    munmap(a->base, a->total);
out_close_fd:
    close(a->fd);
out_free_arena:
    dh__free(a);
    return rc;
}

int dh_arena_fd(const struct dh_arena *a)
{
    return a ? a->fd : -1;
}

void dh_arena_destroy(struct dh_arena *a)
{
    if (!a)
        return;
    munmap(a->base, a->total);
    close(a->fd);
    dh__free(a);
}

/* ---- slots ---- */

int dh_arena_alloc(struct dh_arena *a, size_t len, int timeout_ms,
                   struct dh_slot_ref *out, struct dh_err *e)
{
    struct timespec d;
    uint64_t off = 0, charge = 0, span;
    int rc, waited = 0, werr = 0;

    if (!a || !out || len == 0 || timeout_ms < 0)
        return dh_err_set(e, DH_EINVAL,
                          "arena: alloc needs len > 0 and a "
                          "timeout >= 0");
    if (len > a->data_size) {
        char want[32], cap[32];
        return dh_err_set(e, DH_ETOOBIG,
                          "arena: a slot of %s does not fit "
                          "in an arena of %s",
                          fmt_bytes(want, 32, len),
                          fmt_bytes(cap, 32, a->data_size));
    }
    span = round_up(len, DH_ARENA_ALIGN);
    dh__mono_deadline(&d, timeout_ms);
    rc = lock_arena(a, e);
    if (rc)
        return rc;
    while ((rc = place(a, span, &off, &charge)) == 0 && !passed(&d)) {
        if (!waited) {
            a->h->waits++;
            __atomic_add_fetch(&a->h->waiting, 1, __ATOMIC_SEQ_CST);
        }
        waited = 1;
        if ((werr = wait_arena(a, &d, e)) != 0)
            break;
    }
    if (waited)
        __atomic_sub_fetch(&a->h->waiting, 1, __ATOMIC_SEQ_CST);
    if (werr) /* the lock is not held */
        return werr;
    if (rc < 0) {
        a->h->corrupt = 1;
        unlock_arena(a);
        return dh_err_set(e, DH_EFORMAT,
                          "arena: shared allocator state is "
                          "corrupt; recreate the arena");
    }
    if (rc == 0) {
        rc = exhausted(a, len, timeout_ms, e);
    } else {
        commit(a, off, len, charge, out);
        rc = 0;
    }
    unlock_arena(a);
    return rc;
}

void *dh_arena_ptr(struct dh_arena *a, const struct dh_slot_ref *ref)
{
    void *p = NULL;

    if (!a || !ref || lock_arena(a, NULL) != 0)
        return NULL;
    if (find(a, ref))
        p = a->base + ref->offset;
    unlock_arena(a);
    return p;
}

int dh_arena_retain(struct dh_arena *a, const struct dh_slot_ref *ref,
                    struct dh_err *e)
{
    struct shm_slot *s;
    int rc;

    if (!a)
        return dh_err_set(e, DH_EINVAL, "arena: retain on a NULL arena");
    rc = lock_arena(a, e);
    if (rc)
        return rc;
    s = find(a, ref);
    if (!s)
        rc = bad_ref(a, "retain", ref, e);
    else if (s->refs == UINT32_MAX)
        rc = dh_err_set(e, DH_ETOOBIG,
                        "arena: slot reference count "
                        "overflow");
    else
        s->refs++;
    unlock_arena(a);
    return rc;
}

int dh_arena_release_many(struct dh_arena *a, const struct dh_slot_ref *refs,
                          size_t n, struct dh_err *e)
{
    int rc, first = 0, freed = 0;
    size_t i;

    if (!a || (n && !refs))
        return dh_err_set(e, DH_EINVAL, "arena: release needs refs");
    rc = lock_arena(a, e);
    if (rc)
        return rc;
    for (i = 0; i < n; i++) {
        rc = release_locked(a, &refs[i], first ? NULL : e);
        if (rc < 0 && !first)
            first = rc;
        freed |= rc > 0;
    }
    if (freed && reclaim(a) != 0)
        pthread_cond_broadcast(&a->h->cv);
    unlock_arena(a);
    return first;
}

int dh_arena_release(struct dh_arena *a, const struct dh_slot_ref *ref,
                     struct dh_err *e)
{
    return dh_arena_release_many(a, ref, 1, e);
}

int dh_arena_stats(struct dh_arena *a, struct dh_arena_stats *out)
{
    struct shm_hdr *h;
    int rc;

    if (!a || !out)
        return DH_EINVAL;
    rc = lock_arena(a, NULL);
    if (rc)
        return rc;
    h = a->h;
    out->capacity = a->data_size;
    out->used = h->used;
    out->live_bytes = h->live_bytes;
    out->live_slots = h->live;
    out->allocs = h->allocs;
    out->releases = h->releases;
    out->waits = h->waits;
    out->timeouts = h->timeouts;
    out->waiting = __atomic_load_n(&h->waiting, __ATOMIC_SEQ_CST);
    out->bad_releases = h->bad_releases;
    out->recoveries = h->recoveries;
    unlock_arena(a);
    return 0;
}

/* ---- test hooks (arena_internal.h) ---- */

int dh__arena_test_lock(struct dh_arena *a, int scribble)
{
    int rc = lock_arena(a, NULL);

    if (rc || !scribble)
        return rc;
    a->h->head = 12345;
    a->h->tail = 678;
    a->h->used = a->data_size + 1;
    a->h->live = 999;
    a->h->live_bytes = 1;
    slot_of(a, a->h->seq_head)->refs = 7; /* an alloc cut short */
    slot_of(a, a->h->seq_head)->gen = (uint32_t)a->h->seq_head;
    return 0;
}

void dh_slot_ref_pack(unsigned char *p, const struct dh_slot_ref *r)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (unsigned char)(r->offset >> (8 * i));
        p[8 + i] = (unsigned char)(r->len >> (8 * i));
    }
    for (int i = 0; i < 4; i++)
        p[16 + i] = (unsigned char)(r->gen >> (8 * i));
}

void dh_slot_ref_unpack(const unsigned char *p, struct dh_slot_ref *r)
{
    r->offset = r->len = 0;
    r->gen = 0;
    for (int i = 0; i < 8; i++) {
        r->offset |= (uint64_t)p[i] << (8 * i);
        r->len |= (uint64_t)p[8 + i] << (8 * i);
    }
    for (int i = 0; i < 4; i++)
        r->gen |= (uint32_t)p[16 + i] << (8 * i);
}
