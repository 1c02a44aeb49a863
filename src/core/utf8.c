/*
 * utf8.c - UTF-8 validation (see utf8.h).  Pure.
 */
#include "core/utf8.h"

#include <stdint.h>

/* Length of the sequence a lead byte starts, 0 if it cannot lead. */
static int seq_len(uint8_t c)
{
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        return 2;
    if (c >= 0xe0 && c <= 0xef)
        return 3;
    if (c >= 0xf0 && c <= 0xf4)
        return 4;
    return 0;
}

static int valid_seq(const uint8_t *p, int n)
{
    uint32_t cp = p[0] & (0x7f >> n);

    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000))
        return 0; /* overlong */
    return !(cp >= 0xd800 && cp <= 0xdfff) && cp <= 0x10ffff;
}

int dh__utf8_valid(const char *s)
{
    const uint8_t *p = (const uint8_t *)s;

    while (*p) {
        int n = seq_len(*p);
        if (n == 0 || (n > 1 && !valid_seq(p, n)))
            return 0;
        p += n;
    }
    return 1;
}
