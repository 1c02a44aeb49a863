/*
 * fileio.c - short-write- and EINTR-safe writing (see fileio.h).
 */
#include "core/fileio.h"

#include <errno.h>
#include <unistd.h>

int dh__write_all(int fd, const void *data, uint64_t n)
{
    const char *p = data;

    while (n > 0) {
        ssize_t k = write(fd, p, n > (1u << 30) ? (1u << 30) : (size_t)n);

        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -1;
        p += k;
        n -= (uint64_t)k;
    }
    return 0;
}
