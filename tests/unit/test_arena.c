/*
 * test_arena.c - the shared-memory arena and SCM_RIGHTS fd passing
 * (issue 4 item 4; src/include/datahelix/arena.h, src/runtime/fdpass.h).
 *
 * Single process: alloc / ptr / release / reuse, wrap-around, out-of-order
 * release, stale and bogus refs (refused, counted, state intact), a random
 * model check of the ring, backpressure with a second thread (wakes on
 * release; times out with "arena exhausted" otherwise).
 * Cross process: a forked producer attaches through an fd received with
 * dh__fd_recv, fills patterned slots under backpressure and sends their
 * refs; the parent checks the bytes and releases.  A child killed with
 * SIGKILL while holding the arena lock (with and without half-written
 * state) leaves the arena usable.  attach refuses foreign fds.  The last
 * test checks that /dev/shm gained no entry.
 *
 * Children: every fork goes through spawn(), which records the pid; the
 * per-test teardown kills and reaps whatever is left, so no child outlives
 * a failed assertion.  Children also die with the parent
 * (PR_SET_PDEATHSIG) and never call cmocka: they report by exit status.
 * Every wait in here is bounded.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "datahelix/arena.h"
#include "runtime/arena_internal.h"
#include "runtime/fdpass.h"

#define KIB 1024u
#define WAIT_MS 5000

/* ---- helpers ---- */

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static struct dh_arena *make_arena(size_t bytes)
{
    struct dh_arena *a = NULL;
    struct dh_err e;

    if (dh_arena_create(bytes, &a, &e) != 0)
        fail_msg("dh_arena_create(%zu): %s", bytes, e.msg);
    return a;
}

static struct dh_slot_ref must_alloc(struct dh_arena *a, size_t len)
{
    struct dh_slot_ref r;
    struct dh_err e;

    if (dh_arena_alloc(a, len, 0, &r, &e) != 0)
        fail_msg("dh_arena_alloc(%zu): %s", len, e.msg);
    return r;
}

static void must_release(struct dh_arena *a, const struct dh_slot_ref *r)
{
    struct dh_err e;

    if (dh_arena_release(a, r, &e) != 0)
        fail_msg("dh_arena_release: %s", e.msg);
}

static struct dh_arena_stats stats_of(struct dh_arena *a)
{
    struct dh_arena_stats st;

    assert_int_equal(dh_arena_stats(a, &st), 0);
    return st;
}

/* Polls until `n` allocs have waited (bounded); a fixed sleep would race. */
static void await_waits(struct dh_arena *a, uint64_t n)
{
    double until = now_s() + WAIT_MS / 1000.0;

    while (stats_of(a).waits < n && now_s() < until)
        sleep_ms(2);
    assert_int_equal(stats_of(a).waits, n);
}

static uint64_t data_off(struct dh_arena *a)
{
    struct dh_slot_ref r = must_alloc(a, 1);
    uint64_t off = r.offset;

    must_release(a, &r);
    return off;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *de;
    int n = 0;

    assert_non_null(d);
    while ((de = readdir(d)))
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

static unsigned char pattern(unsigned i, size_t j)
{
    return (unsigned char)(j * 131u + i * 7u + (j >> 12));
}

/* ---- child processes ---- */

#define MAX_CHILDREN 8
static pid_t children[MAX_CHILDREN];

static void forget_child(pid_t pid)
{
    for (int i = 0; i < MAX_CHILDREN; i++)
        if (children[i] == pid)
            children[i] = 0;
}

/* Teardown of every test: no child outlives it, pass or fail. */
static int reap_children(void **state)
{
    (void)state;
    for (int i = 0; i < MAX_CHILDREN; i++) {
        if (children[i] > 0) {
            kill(children[i], SIGKILL);
            while (waitpid(children[i], NULL, 0) < 0 && errno == EINTR)
                ;
            children[i] = 0;
        }
    }
    return 0;
}

/* Forks fn(sock) with the other end closed; the child exits with fn's rc. */
static pid_t spawn(int (*fn)(int sock), int sv[2])
{
    pid_t parent = getpid(), pid = fork();

    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(120);
        close(sv[0]);
        _exit(fn(sv[1]));
    }
    close(sv[1]);
    for (int i = 0; i < MAX_CHILDREN; i++) {
        if (children[i] == 0) {
            children[i] = pid;
            return pid;
        }
    }
    fail_msg("too many children");
    return -1;
}

/* Waits up to ms for pid; kills it past that.  Returns its wait status. */
static int wait_child(pid_t pid, int ms)
{
    double until = now_s() + ms / 1000.0;
    int status = 0;
    pid_t r;

    while ((r = waitpid(pid, &status, WNOHANG)) == 0 && now_s() < until)
        sleep_ms(5);
    if (r == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        forget_child(pid);
        fail_msg("child %d did not finish within %d ms", (int)pid, ms);
    }
    forget_child(pid);
    return status;
}

static void socket_pair(int sv[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv),
                     0);
}

/* The child's side: receive the arena fd and attach.  NULL on failure. */
static struct dh_arena *child_attach(int sock)
{
    struct dh_arena *a = NULL;
    unsigned char m[8];
    size_t n;
    int fd;

    if (dh__fd_recv(sock, &fd, m, sizeof(m), &n, WAIT_MS, NULL) != 0 || fd < 0)
        return NULL;
    if (dh_arena_attach(fd, &a, NULL) != 0)
        a = NULL;
    close(fd);
    return a;
}

static void send_arena(int sock, struct dh_arena *a)
{
    struct dh_err e;

    if (dh__fd_send(sock, dh_arena_fd(a), "A", 1, &e) != 0)
        fail_msg("dh__fd_send: %s", e.msg);
}

/* ---- single process ---- */

static void default_size_rule(void **state)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);

    (void)state;
    /* (4 + 2) slots of round_up(1000, 64) = 6144 -> two pages */
    assert_int_equal(dh_arena_default_size(4, 1000), 2 * page);
    assert_int_equal(dh_arena_default_size(0, 64 * page), 2 * 64 * page);
    assert_int_equal(dh_arena_default_size(4, 0), 0);
    assert_int_equal(dh_arena_default_size(UINT32_MAX, SIZE_MAX / 4), 0);
}

static void alloc_ptr_release_reuse(void **state)
{
    struct dh_arena *a = make_arena(1024 * KIB);
    struct dh_arena_stats st;
    struct dh_slot_ref r1, r2;
    unsigned char *p;

    (void)state;
    assert_true(dh_arena_fd(a) >= 0);
    st = stats_of(a);
    assert_int_equal(st.capacity, 1024 * KIB);
    assert_int_equal(st.used, 0);
    r1 = must_alloc(a, 1000);
    assert_int_equal(r1.len, 1000);
    assert_int_equal(r1.offset % DH_ARENA_ALIGN, 0);
    p = dh_arena_ptr(a, &r1);
    assert_non_null(p);
    memset(p, 0xAB, r1.len);
    st = stats_of(a);
    assert_int_equal(st.live_slots, 1);
    assert_int_equal(st.live_bytes, 1000);
    assert_int_equal(st.used, 1024); /* aligned up */
    must_release(a, &r1);
    st = stats_of(a);
    assert_int_equal(st.live_slots, 0);
    assert_int_equal(st.used, 0);
    assert_null(dh_arena_ptr(a, &r1));
    r2 = must_alloc(a, 2000); /* the empty ring restarts at 0 */
    assert_int_equal(r2.offset, r1.offset);
    assert_int_not_equal(r2.gen, r1.gen);
    assert_ptr_equal(dh_arena_ptr(a, &r2), p);
    must_release(a, &r2);
    st = stats_of(a);
    assert_int_equal(st.allocs, 2);
    assert_int_equal(st.releases, 2);
    dh_arena_destroy(a);
    dh_arena_destroy(NULL);
}

static void bad_arguments(void **state)
{
    struct dh_arena *a = make_arena(64 * KIB), *none = NULL;
    struct dh_slot_ref r = {0, 0, 0};
    struct dh_err e;
    double t0;

    (void)state;
    assert_int_equal(dh_arena_create(0, &none, &e), DH_EINVAL);
    assert_null(none);
    assert_int_equal(dh_arena_attach(-1, &none, &e), DH_EINVAL);
    assert_int_equal(dh_arena_alloc(a, 0, 0, &r, &e), DH_EINVAL);
    assert_int_equal(dh_arena_alloc(a, 10, -1, &r, &e), DH_EINVAL);
    t0 = now_s();
    assert_int_equal(dh_arena_alloc(a, 64 * KIB + 1, WAIT_MS, &r, &e),
                     DH_ETOOBIG);
    assert_true(now_s() - t0 < 1.0); /* at once, not after the timeout */
    assert_non_null(strstr(e.msg, "does not fit"));
    assert_int_equal(r.len, 0);  /* out untouched on error */
    r = must_alloc(a, 64 * KIB); /* exactly the capacity fits */
    must_release(a, &r);
    assert_int_equal(dh_arena_fd(NULL), -1);
    dh_arena_destroy(a);
}

static void wrap_around(void **state)
{
    struct dh_arena *a = make_arena(64 * KIB);
    uint64_t base = data_off(a);
    struct dh_slot_ref s1, s2, s3, s4, x;
    struct dh_err e;

    (void)state;
    s1 = must_alloc(a, 24 * KIB);
    s2 = must_alloc(a, 24 * KIB);
    assert_int_equal(s1.offset, base);
    assert_int_equal(s2.offset, base + 24 * KIB);
    must_release(a, &s1); /* tail -> 24K, head 48K, 16K left at the end */
    s3 = must_alloc(a, 24 * KIB);
    assert_int_equal(s3.offset, base); /* wrapped, end padding charged */
    assert_int_equal(stats_of(a).used, 64 * KIB);
    assert_int_equal(dh_arena_alloc(a, 64, 0, &x, &e), DH_EARENA);
    must_release(a, &s2); /* the padding goes with s3 */
    assert_int_equal(stats_of(a).used, 24 * KIB + 16 * KIB);
    s4 = must_alloc(a, 24 * KIB); /* [24K, 48K) */
    assert_int_equal(s4.offset, base + 24 * KIB);
    must_release(a, &s3);
    assert_int_equal(stats_of(a).used, 24 * KIB);
    must_release(a, &s4);
    assert_int_equal(stats_of(a).used, 0);
    dh_arena_destroy(a);
}

static void out_of_order_release(void **state)
{
    struct dh_arena *a = make_arena(64 * KIB);
    struct dh_slot_ref r[3];
    struct dh_arena_stats st;

    (void)state;
    for (int i = 0; i < 3; i++)
        r[i] = must_alloc(a, 16 * KIB);
    must_release(a, &r[1]); /* behind a live slot: not reclaimed yet */
    st = stats_of(a);
    assert_int_equal(st.live_slots, 2);
    assert_int_equal(st.used, 48 * KIB);
    assert_null(dh_arena_ptr(a, &r[1]));
    assert_non_null(dh_arena_ptr(a, &r[2]));
    must_release(a, &r[0]); /* tail passes r0 and r1 */
    st = stats_of(a);
    assert_int_equal(st.live_slots, 1);
    assert_int_equal(st.used, 16 * KIB);
    must_release(a, &r[2]);
    assert_int_equal(stats_of(a).used, 0);
    dh_arena_destroy(a);
}

static void expect_bad(struct dh_arena *a, struct dh_slot_ref r, uint64_t *bad)
{
    struct dh_err e;

    assert_int_equal(dh_arena_release(a, &r, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "stale or unknown"));
    assert_int_equal(dh_arena_retain(a, &r, &e), DH_EINVAL);
    assert_null(dh_arena_ptr(a, &r));
    *bad += 2;
    assert_int_equal(stats_of(a).bad_releases, *bad);
}

static void stale_and_bogus_refs(void **state)
{
    struct dh_arena *a = make_arena(64 * KIB);
    struct dh_slot_ref old, live, r;
    struct dh_arena_stats before, after;
    struct dh_err e;
    uint64_t bad = 0;
    unsigned char *p;

    (void)state;
    old = must_alloc(a, 4 * KIB);
    must_release(a, &old);
    expect_bad(a, old, &bad);      /* double release */
    live = must_alloc(a, 4 * KIB); /* same offset, new generation */
    assert_int_equal(live.offset, old.offset);
    p = dh_arena_ptr(a, &live);
    memset(p, 0x5A, live.len);
    before = stats_of(a);
    expect_bad(a, old, &bad); /* stale generation at a live offset */
    r = live, r.offset += 64;
    expect_bad(a, r, &bad); /* inside the slot */
    r = live, r.offset = 0;
    expect_bad(a, r, &bad); /* the header */
    r = live, r.offset = UINT64_MAX - 8;
    expect_bad(a, r, &bad);
    r = live, r.len += 1;
    expect_bad(a, r, &bad);
    r = live, r.gen += DH_ARENA_MAX_SLOTS; /* same descriptor index */
    expect_bad(a, r, &bad);
    memset(&r, 0, sizeof(r));
    expect_bad(a, r, &bad);
    assert_int_equal(dh_arena_release(a, NULL, &e), DH_EINVAL);
    after = stats_of(a);
    assert_int_equal(after.used, before.used);
    assert_int_equal(after.live_slots, 1);
    assert_int_equal(after.releases, before.releases);
    assert_ptr_equal(dh_arena_ptr(a, &live), p);
    for (size_t i = 0; i < live.len; i++)
        assert_int_equal(p[i], 0x5A);
    must_release(a, &live);
    assert_int_equal(stats_of(a).used, 0);
    dh_arena_destroy(a);
}

static void retain_and_release_many(void **state)
{
    struct dh_arena *a = make_arena(64 * KIB);
    struct dh_slot_ref r[3], bogus;
    struct dh_err e;

    (void)state;
    r[0] = must_alloc(a, 100);
    assert_int_equal(dh_arena_retain(a, &r[0], &e), 0);
    must_release(a, &r[0]);
    assert_non_null(dh_arena_ptr(a, &r[0])); /* one reference left */
    must_release(a, &r[0]);
    assert_null(dh_arena_ptr(a, &r[0]));
    for (int i = 0; i < 3; i++)
        r[i] = must_alloc(a, 1000);
    bogus = r[1];
    bogus.gen ^= 0x55555;
    r[1] = bogus; /* one bad ref in the batch: the others still go */
    assert_int_equal(dh_arena_release_many(a, r, 3, &e), DH_EINVAL);
    assert_int_equal(stats_of(a).live_slots, 1);
    assert_int_equal(stats_of(a).bad_releases, 1);
    assert_int_equal(dh_arena_release_many(a, NULL, 0, &e), 0);
    dh_arena_destroy(a);
}

/*
 * Random model check: random sizes, random release order; after every step
 * live slots do not overlap, lie inside the data area, and keep the bytes
 * written into them.
 */
#define MODEL_MAX 64
struct model {
    struct dh_slot_ref r[MODEL_MAX];
    unsigned tag[MODEL_MAX];
    int n;
};

static void model_check(struct dh_arena *a, struct model *m)
{
    for (int i = 0; i < m->n; i++) {
        unsigned char *p = dh_arena_ptr(a, &m->r[i]);

        assert_non_null(p);
        assert_int_equal(p[0], (unsigned char)m->tag[i]);
        assert_int_equal(p[m->r[i].len - 1], (unsigned char)~m->tag[i]);
        for (int j = 0; j < m->n; j++)
            if (j != i)
                assert_true(m->r[i].offset + m->r[i].len <= m->r[j].offset ||
                            m->r[j].offset + m->r[j].len <= m->r[i].offset);
    }
}

static void ring_model_random(void **state)
{
    struct dh_arena *a = make_arena(256 * KIB);
    uint64_t base = data_off(a), cap = 256 * KIB;
    struct model m = {.n = 0};
    struct dh_err e;
    unsigned seed = 12345;

    (void)state;
    for (unsigned step = 0; step < 20000; step++) {
        seed = seed * 1103515245u + 12345u;
        if (m.n < MODEL_MAX && (seed >> 16) % 3 != 0) {
            size_t len = 1 + (seed >> 8) % (48 * KIB);
            struct dh_slot_ref r;
            unsigned char *p;
            int rc = dh_arena_alloc(a, len, 0, &r, &e);

            if (rc == DH_EARENA)
                continue;
            assert_int_equal(rc, 0);
            assert_true(r.offset >= base && r.offset + len <= base + cap);
            p = dh_arena_ptr(a, &r);
            p[0] = (unsigned char)step;
            p[len - 1] = (unsigned char)~step;
            m.tag[m.n] = step;
            m.r[m.n++] = r;
        } else if (m.n > 0) {
            int k = (int)((seed >> 4) % (unsigned)m.n);

            must_release(a, &m.r[k]);
            m.r[k] = m.r[m.n - 1];
            m.tag[k] = m.tag[--m.n];
        }
        if (step % 16 == 0)
            model_check(a, &m);
    }
    while (m.n > 0)
        must_release(a, &m.r[--m.n]);
    assert_int_equal(stats_of(a).used, 0);
    assert_int_equal(stats_of(a).bad_releases, 0);
    dh_arena_destroy(a);
}

/* ---- backpressure ---- */

struct waiter {
    struct dh_arena *a;
    int timeout_ms;
    int rc;
    struct dh_slot_ref ref;
    struct dh_err e;
    double took;
    atomic_int done;
};

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    double t0 = now_s();

    w->rc = dh_arena_alloc(w->a, 4 * KIB, w->timeout_ms, &w->ref, &w->e);
    w->took = now_s() - t0;
    atomic_store(&w->done, 1);
    return NULL;
}

static void backpressure_wakes_waiter(void **state)
{
    struct dh_arena *a = make_arena(8 * KIB);
    struct dh_slot_ref r1 = must_alloc(a, 4 * KIB);
    struct dh_slot_ref r2 = must_alloc(a, 4 * KIB);
    struct waiter w = {.a = a, .timeout_ms = WAIT_MS};
    pthread_t t;

    (void)state;
    assert_int_equal(pthread_create(&t, NULL, waiter_main, &w), 0);
    await_waits(a, 1);
    /* A fixed sleep on purpose: what is asserted is that nothing happens
     * (the waiter stays blocked while the arena is full), which no
     * condition can signal; 50 ms is the window it is watched. */
    sleep_ms(50);
    assert_int_equal(atomic_load(&w.done), 0); /* blocked: arena full */
    assert_int_equal(stats_of(a).waiting, 1);  /* and says so */
    must_release(a, &r1);                      /* the oldest: the tail moves */
    pthread_join(t, NULL); /* bounded: the waiter's own timeout */
    assert_int_equal(w.rc, 0);
    assert_int_equal(stats_of(a).waiting, 0);
    assert_true(w.took < WAIT_MS / 1000.0 - 1.0);
    assert_int_equal(w.ref.offset, r1.offset);
    must_release(a, &w.ref);
    must_release(a, &r2);
    dh_arena_destroy(a);
}

static void backpressure_times_out(void **state)
{
    struct dh_arena *a = make_arena(8 * KIB);
    struct dh_slot_ref r1 = must_alloc(a, 4 * KIB);
    struct dh_slot_ref r2 = must_alloc(a, 4 * KIB);
    struct waiter w = {.a = a, .timeout_ms = 200};
    const char *want = "arena exhausted: 2 slots (8 KiB) still held by the "
                       "consumer after 200 ms";
    pthread_t t;

    (void)state;
    assert_int_equal(pthread_create(&t, NULL, waiter_main, &w), 0);
    pthread_join(t, NULL);
    assert_int_equal(w.rc, DH_EARENA);
    assert_int_equal(stats_of(a).waiting, 0); /* gave up: no longer waiting */
    assert_true(w.took >= 0.19 && w.took < 2.0);
    if (strncmp(w.e.msg, want, strlen(want)) != 0)
        fail_msg("message: %s", w.e.msg);
    assert_int_equal(stats_of(a).timeouts, 1);
    assert_int_equal(stats_of(a).live_slots, 2);
    must_release(a, &r1);
    must_release(a, &r2);
    dh_arena_destroy(a);
}

/* ---- fd passing ---- */

static void fdpass_roundtrip(void **state)
{
    struct dh_arena *a = make_arena(64 * KIB);
    char msg[16];
    size_t n = 0;
    int sv[2], fd = -2;
    struct dh_err e;

    (void)state;
    socket_pair(sv);
    assert_int_equal(dh__fd_send(sv[0], dh_arena_fd(a), "hello", 5, &e), 0);
    assert_int_equal(dh__fd_recv(sv[1], &fd, msg, sizeof(msg), &n, WAIT_MS, &e),
                     0);
    assert_int_equal(n, 5);
    assert_memory_equal(msg, "hello", 5);
    assert_true(fd >= 0 && fd != dh_arena_fd(a));
    assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    close(fd);
    assert_int_equal(dh__fd_send(sv[0], -1, "x", 1, &e), 0); /* no fd */
    assert_int_equal(dh__fd_recv(sv[1], &fd, msg, sizeof(msg), &n, WAIT_MS, &e),
                     0);
    assert_int_equal(fd, -1);
    assert_int_equal(dh__fd_send(sv[0], -1, msg, 0, &e), DH_EINVAL);
    {
        int five[5] = {0, 1, 2, 0, 1}, holed[2] = {0, -1};

        assert_int_equal(dh__fds_send(sv[0], five, 5, "x", 1, &e), DH_EINVAL);
        assert_int_equal(dh__fds_send(sv[0], holed, 2, "x", 1, &e), DH_EINVAL);
        assert_non_null(strstr(e.msg, "descriptor 1 of 2"));
    }
    close(sv[0]);
    close(sv[1]);
    dh_arena_destroy(a);
}

/* Two descriptors with one message (dh__fds_send): dh__fd_recv refuses
 * it, so their arrival is what the refusal test sees. */
static void send_two_fds(int sock)
{
    int fds[2];
    struct dh_err e;

    assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
    assert_int_equal(dh__fds_send(sock, fds, 2, "two", 3, &e), 0);
    close(fds[0]);
    close(fds[1]);
}

static void fdpass_refusals(void **state)
{
    char msg[4];
    size_t n = 99;
    int sv[2], fd = -2, before;
    struct dh_err e;
    double t0;

    (void)state;
    socket_pair(sv);
    send_two_fds(sv[0]);
    before = count_fds();
    assert_int_equal(dh__fd_recv(sv[1], &fd, msg, sizeof(msg), &n, WAIT_MS, &e),
                     DH_EPROTO);
    assert_non_null(strstr(e.msg, "2 descriptors"));
    assert_int_equal(fd, -2);
    assert_int_equal(count_fds(), before); /* both closed */
    assert_int_equal(dh__fd_send(sv[0], sv[0], "toolong", 7, &e), 0);
    assert_int_equal(dh__fd_recv(sv[1], &fd, msg, sizeof(msg), &n, WAIT_MS, &e),
                     DH_ETOOBIG);
    assert_int_equal(count_fds(), before);
    t0 = now_s();
    assert_int_equal(dh__fd_recv(sv[1], &fd, msg, sizeof(msg), &n, 100, &e),
                     DH_ETIMEOUT);
    assert_true(now_s() - t0 >= 0.09 && now_s() - t0 < 2.0);
    close(sv[0]);
    assert_int_equal(dh__fd_recv(sv[1], &fd, msg, sizeof(msg), &n, WAIT_MS, &e),
                     DH_EPEERDEAD);
    assert_int_equal(dh__fd_send(sv[1], -1, "x", 1, &e), DH_EPEERDEAD);
    assert_int_equal(n, 99);
    close(sv[1]);
}

/* ---- cross process ---- */

#define XP_SLOTS 32
#define XP_SLOT (64 * KIB)

/* Producer: attach, fill patterned slots (4 fit at once), send their refs. */
static int producer_main(int sock)
{
    struct dh_arena *a = child_attach(sock);
    unsigned char m[21];
    int rc = 0;

    if (!a)
        return 10;
    for (unsigned i = 0; i < XP_SLOTS && rc == 0; i++) {
        size_t len = XP_SLOT - (i % 3) * 100;
        struct dh_slot_ref r;
        unsigned char *p;

        if (dh_arena_alloc(a, len, WAIT_MS, &r, NULL) != 0)
            rc = 11;
        else if (!(p = dh_arena_ptr(a, &r)))
            rc = 12;
        for (size_t j = 0; rc == 0 && j < len; j++)
            p[j] = pattern(i, j);
        m[0] = 'R';
        dh_slot_ref_pack(m + 1, &r);
        if (rc == 0 && dh__fd_send(sock, -1, m, sizeof(m), NULL) != 0)
            rc = 13;
    }
    if (rc == 0 && dh__fd_send(sock, -1, "D", 1, NULL) != 0)
        rc = 14;
    dh_arena_destroy(a);
    return rc;
}

static struct dh_slot_ref recv_ref(int sock)
{
    unsigned char m[21];
    struct dh_slot_ref r;
    struct dh_err e;
    size_t n;
    int fd;

    if (dh__fd_recv(sock, &fd, m, sizeof(m), &n, WAIT_MS, &e) != 0)
        fail_msg("recv ref: %s", e.msg);
    assert_int_equal(fd, -1);
    assert_int_equal(n, sizeof(m));
    assert_int_equal(m[0], 'R');
    dh_slot_ref_unpack(m + 1, &r);
    return r;
}

static void check_slot(struct dh_arena *a, unsigned i,
                       const struct dh_slot_ref *r)
{
    const unsigned char *p = dh_arena_ptr(a, r);

    assert_non_null(p);
    assert_int_equal(r->len, XP_SLOT - (i % 3) * 100);
    for (size_t j = 0; j < r->len; j++)
        if (p[j] != pattern(i, j))
            fail_msg("slot %u byte %zu: %u, want %u", i, j, p[j],
                     pattern(i, j));
}

static void cross_process_producer(void **state)
{
    struct dh_arena *a = make_arena(4 * XP_SLOT);
    struct dh_slot_ref held[4];
    struct dh_arena_stats st;
    unsigned char m[4];
    int sv[2], fd, status;
    size_t n;
    pid_t pid;

    (void)state;
    socket_pair(sv);
    pid = spawn(producer_main, sv);
    send_arena(sv[0], a);
    for (unsigned i = 0; i < 4; i++) /* hold 4: the producer must wait */
        held[i] = recv_ref(sv[0]);
    await_waits(a, 1);
    for (unsigned i = 0; i < 4; i++)
        check_slot(a, i, &held[i]);
    for (unsigned i = 0; i < 4; i++) /* out of order: 1 0 3 2 */
        must_release(a, &held[i ^ 1]);
    for (unsigned i = 4; i < XP_SLOTS; i++) {
        struct dh_slot_ref r = recv_ref(sv[0]);

        check_slot(a, i, &r);
        must_release(a, &r);
    }
    assert_int_equal(dh__fd_recv(sv[0], &fd, m, sizeof(m), &n, WAIT_MS, NULL),
                     0);
    assert_int_equal(m[0], 'D');
    status = wait_child(pid, WAIT_MS);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    st = stats_of(a);
    assert_int_equal(st.allocs, XP_SLOTS);
    assert_int_equal(st.releases, XP_SLOTS);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.bad_releases, 0);
    close(sv[0]);
    dh_arena_destroy(a);
}

static int scribble_on_death;

/* Takes the arena lock (maybe half-updating the state) and dies with it. */
static int lock_and_die_main(int sock)
{
    struct dh_arena *a = child_attach(sock);

    if (!a)
        return 10;
    if (dh__arena_test_lock(a, scribble_on_death) != 0)
        return 11;
    if (dh__fd_send(sock, -1, "L", 1, NULL) != 0)
        return 12;
    raise(SIGKILL);
    return 13;
}

static void robust_recovery(int scribble)
{
    struct dh_arena *a = make_arena(64 * KIB);
    struct dh_slot_ref r[3], x;
    struct dh_arena_stats st;
    unsigned char m[4], *p;
    int sv[2], fd, status;
    struct dh_err e;
    size_t n;
    pid_t pid;

    for (int i = 0; i < 3; i++)
        r[i] = must_alloc(a, 8 * KIB);
    memset(dh_arena_ptr(a, &r[0]), 0x11, 8 * KIB);
    must_release(a, &r[1]); /* released behind a live slot */
    scribble_on_death = scribble;
    socket_pair(sv);
    pid = spawn(lock_and_die_main, sv);
    send_arena(sv[0], a);
    if (dh__fd_recv(sv[0], &fd, m, sizeof(m), &n, WAIT_MS, &e) != 0)
        fail_msg("child did not take the lock: %s", e.msg);
    status = wait_child(pid, WAIT_MS);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    st = stats_of(a); /* the first locker repairs */
    assert_int_equal(st.recoveries, 1);
    assert_int_equal(st.live_slots, 2);
    assert_int_equal(st.live_bytes, 16 * KIB);
    assert_int_equal(st.used, 24 * KIB);
    p = dh_arena_ptr(a, &r[0]);
    assert_non_null(p);
    assert_int_equal(p[8 * KIB - 1], 0x11);
    /* the descriptor the dead child half-wrote is outside the window */
    x = (struct dh_slot_ref){r[0].offset, 0, r[2].gen + 1};
    assert_int_equal(dh_arena_release(a, &x, &e), DH_EINVAL);
    x = must_alloc(a, 16 * KIB);
    assert_int_equal(dh_arena_alloc(a, 32 * KIB, 0, &x, &e), DH_EARENA);
    must_release(a, &x);
    must_release(a, &r[0]);
    must_release(a, &r[2]);
    st = stats_of(a);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.live_slots, 0);
    x = must_alloc(a, 64 * KIB);
    must_release(a, &x);
    close(sv[0]);
    dh_arena_destroy(a);
}

static void robust_recovery_clean(void **state)
{
    (void)state;
    robust_recovery(0);
}

static void robust_recovery_half_written(void **state)
{
    (void)state;
    robust_recovery(1);
}

/* ---- attach refuses what is not an arena ---- */

static int sealed_memfd(const void *bytes, size_t n, size_t size, int seal)
{
    int fd = memfd_create("not-an-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);

    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    if (n)
        assert_int_equal(pwrite(fd, bytes, n, 0), (ssize_t)n);
    if (seal)
        assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    return fd;
}

static void expect_refused(int fd, int code, const char *why)
{
    struct dh_arena *a = (struct dh_arena *)&a;
    struct dh_err e;
    int before = count_fds();

    assert_int_equal(dh_arena_attach(fd, &a, &e), code);
    assert_ptr_equal(a, (struct dh_arena *)&a); /* out untouched */
    if (!strstr(e.msg, why))
        fail_msg("attach: \"%s\" does not say \"%s\"", e.msg, why);
    assert_int_equal(count_fds(), before);
    close(fd);
}

/* A byte copy of a real arena, with `patch` bytes written at `at`. */
static int copy_arena(struct dh_arena *src, size_t at, const void *patch,
                      size_t plen, int seal)
{
    off_t size = lseek(dh_arena_fd(src), 0, SEEK_END);
    unsigned char *buf = malloc((size_t)size);
    int fd;

    assert_non_null(buf);
    assert_int_equal(pread(dh_arena_fd(src), buf, (size_t)size, 0), size);
    memcpy(buf + at, patch, plen);
    fd = sealed_memfd(buf, (size_t)size, (size_t)size, seal);
    free(buf);
    return fd;
}

static void attach_refuses_foreign_fds(void **state)
{
    struct dh_arena *src = make_arena(64 * KIB), *ok = NULL;
    const char *tmp = getenv("DH_TEST_TMP");
    char path[4096], ro[64];
    unsigned char junk[4096];
    uint32_t v99 = 99;
    uint64_t bigger;
    struct dh_err e;
    int fd;

    (void)state;
    memset(junk, 0xA5, sizeof(junk));
    expect_refused(sealed_memfd(junk, sizeof(junk), 1024 * KIB, 1), DH_EFORMAT,
                   "bad magic");
    expect_refused(sealed_memfd(junk, 100, 100, 1), DH_EFORMAT,
                   "not an arena size");
    expect_refused(sealed_memfd(NULL, 0, 0, 1), DH_EFORMAT,
                   "not an arena size");
    snprintf(path, sizeof(path), "%s/arena-garbage.%d", tmp ? tmp : "/tmp",
             (int)getpid());
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    unlink(path);
    for (int i = 0; i < 256; i++)
        assert_int_equal(write(fd, junk, sizeof(junk)), sizeof(junk));
    expect_refused(fd, DH_EFORMAT, "not a sealable memfd");
    expect_refused(copy_arena(src, 0, "", 0, 0), DH_EFORMAT,
                   "not sealed against shrinking");
    expect_refused(copy_arena(src, 8, &v99, 4, 1), DH_EVERSION, "version 99");
    bigger = 128 * KIB;
    expect_refused(copy_arena(src, 40, &bigger, 8, 1), DH_EFORMAT,
                   "header says");
    snprintf(ro, sizeof(ro), "/proc/self/fd/%d", dh_arena_fd(src));
    fd = open(ro, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    expect_refused(fd, DH_EIO, "mmap");
    /* control: an untouched sealed copy is accepted */
    fd = copy_arena(src, 0, "", 0, 1);
    assert_int_equal(dh_arena_attach(fd, &ok, &e), 0);
    close(fd);
    assert_int_equal(stats_of(ok).capacity, 64 * KIB);
    dh_arena_destroy(ok);
    dh_arena_destroy(src);
}

/* ---- no name in /dev/shm, ever ---- */

#define SHM_MAX 256
static char shm_before[SHM_MAX][256];
static int shm_nbefore = -1;

static int list_shm(char names[][256], int max)
{
    DIR *d = opendir("/dev/shm");
    struct dirent *de;
    int n = 0;

    if (!d)
        return -1;
    while ((de = readdir(d)) && n < max)
        if (de->d_name[0] != '.')
            snprintf(names[n++], 256, "%s", de->d_name);
    closedir(d);
    return n;
}

static void no_dev_shm_entry(void **state)
{
    static char after[SHM_MAX][256];
    int n = list_shm(after, SHM_MAX);

    (void)state;
    if (shm_nbefore < 0 || n < 0)
        skip(); /* no /dev/shm on this system: nothing could leak there */
    for (int i = 0; i < n; i++) {
        int seen = 0;

        for (int j = 0; j < shm_nbefore && !seen; j++)
            seen = strcmp(after[i], shm_before[j]) == 0;
        if (!seen)
            fail_msg("new /dev/shm entry: %s", after[i]);
    }
}

#define T(f) cmocka_unit_test_teardown(f, reap_children)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(default_size_rule),
        T(alloc_ptr_release_reuse),
        T(bad_arguments),
        T(wrap_around),
        T(out_of_order_release),
        T(stale_and_bogus_refs),
        T(retain_and_release_many),
        T(ring_model_random),
        T(backpressure_wakes_waiter),
        T(backpressure_times_out),
        T(fdpass_roundtrip),
        T(fdpass_refusals),
        T(cross_process_producer),
        T(robust_recovery_clean),
        T(robust_recovery_half_written),
        T(attach_refuses_foreign_fds),
        T(no_dev_shm_entry), /* last: after everything else ran */
    };

    shm_nbefore = list_shm(shm_before, SHM_MAX);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
