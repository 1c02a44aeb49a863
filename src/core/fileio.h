/*
 * fileio.h - small POSIX file helpers shared by the table and index writers
 * (internal).
 */
#ifndef DH_CORE_FILEIO_H
#define DH_CORE_FILEIO_H

#include <stdint.h>

/* Writes all n bytes, retrying short writes and EINTR, in chunks of at most
 * 1 GiB.  0, or -1 with errno set. */
int dh__write_all(int fd, const void *data, uint64_t n);

#endif
