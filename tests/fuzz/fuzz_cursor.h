/*
 * fuzz_cursor.h - the byte cursor the stateful fuzz targets read their
 * scripts with: take() returns the next byte, 0 once the input is spent
 * (so a script cut anywhere still means something).
 */
#ifndef DH_TESTS_FUZZ_CURSOR_H
#define DH_TESTS_FUZZ_CURSOR_H

#include <stddef.h>
#include <stdint.h>

struct cursor {
    const uint8_t *p;
    size_t n;
};

static inline uint8_t take(struct cursor *c)
{
    if (!c->n)
        return 0;
    c->n--;
    return *c->p++;
}

#endif
