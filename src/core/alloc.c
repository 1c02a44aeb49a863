/*
 * alloc.c - allocation seam with fault injection (see alloc.h).
 *
 * The countdown is a single atomic: when it is negative injection is off.
 * Injection is for tests only; production code pays one relaxed atomic load.
 */
#include "alloc.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_long fail_countdown = -1;
static atomic_long fail_count = 0;
static atomic_long armed_at = -1; /* the countdown's start */

static int should_fail(void)
{
    long left = atomic_load_explicit(&fail_countdown, memory_order_relaxed);

    if (left < 0)
        return 0;
    if (left == 0) {
        atomic_fetch_add(&fail_count, 1);
        return 1;
    }
    atomic_fetch_sub(&fail_countdown, 1);
    return 0;
}

void *dh__malloc(size_t n)
{
    return should_fail() ? NULL : malloc(n ? n : 1);
}

void *dh__calloc(size_t count, size_t size)
{
    return should_fail() ? NULL : calloc(count ? count : 1, size ? size : 1);
}

void *dh__realloc(void *p, size_t n)
{
    return should_fail() ? NULL : realloc(p, n ? n : 1);
}

void dh__free(void *p)
{
    free(p);
}

char *dh__strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *d = dh__malloc(len + 1);

    if (!d)
        return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

int dh__buf_reserve(char **buf, size_t *cap, size_t n)
{
    char *p;

    if (n <= *cap)
        return 0;
    if (!(p = dh__realloc(*buf, n)))
        return -1;
    *buf = p;
    *cap = n;
    return 0;
}

char *dh__strdup(const char *s)
{
    return dh__strndup(s, strlen(s));
}

static void install_json_allocs(void)
{
    json_set_alloc_funcs(dh__malloc, dh__free);
}

void dh__alloc_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;

    pthread_once(&once, install_json_allocs);
}

void dh__alloc_fail_after(long n)
{
    atomic_store(&fail_count, 0);
    atomic_store(&armed_at, n);
    atomic_store(&fail_countdown, n);
}

long dh__alloc_count(void)
{
    long left = atomic_load(&fail_countdown), at = atomic_load(&armed_at);

    return at < 0 || left < 0 ? -1 : at - left;
}

void dh__alloc_fail_reset(void)
{
    atomic_store(&fail_countdown, -1);
}

long dh__alloc_failures(void)
{
    return atomic_load(&fail_count);
}
