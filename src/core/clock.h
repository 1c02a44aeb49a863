/*
 * clock.h - the monotonic clock as the library reads it: milliseconds for
 * timeouts and deadlines, fractional milliseconds for measurements, and
 * absolute deadlines for pthread_cond_timedwait on CLOCK_MONOTONIC
 * condvars.  One definition instead of one per module.
 */
#ifndef DH_CORE_CLOCK_H
#define DH_CORE_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t dh__mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline double dh__mono_msf(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* *d = now + ms on CLOCK_MONOTONIC. */
static inline void dh__mono_deadline(struct timespec *d, int ms)
{
    clock_gettime(CLOCK_MONOTONIC, d);
    d->tv_sec += ms / 1000;
    d->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (d->tv_nsec >= 1000000000L) {
        d->tv_sec++;
        d->tv_nsec -= 1000000000L;
    }
}

/* a < b (CLOCK_MONOTONIC deadlines). */
static inline int dh__ts_before(const struct timespec *a,
                                const struct timespec *b)
{
    return a->tv_sec < b->tv_sec ||
           (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

#endif
