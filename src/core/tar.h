/*
 * tar.h - the tar header codec (internal): parses the 512-byte headers of
 * ustar, GNU and pax archives, and writes ustar headers with pax records
 * for what ustar cannot hold.  Pure: no I/O (tar_walk.c reads shards,
 * cmd_shard.c writes them).
 *
 * Why our own: a shard is read in place, member by member, at the offsets
 * a table records; what is needed is each member's name, data offset and
 * size, which a streaming extractor does not expose.  The format is three
 * fixed layouts and one "LEN key=value\n" record list (POSIX.1-2001 pax).
 *
 * Thread-safety: pure functions over caller-owned state.
 */
#ifndef DH_CORE_TAR_H
#define DH_CORE_TAR_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"

#define DH_TAR_BLOCK 512
/* Longest member name kept (pax and GNU long names); longer is an error. */
#define DH_TAR_NAME_MAX 4096
/* Largest pax or GNU long-name record block read into memory. */
#define DH_TAR_EXT_MAX (1 << 20)

enum dh_tar_type {
    DH_TAR_FILE,       /* a regular file ('0', '\0', '7') */
    DH_TAR_OTHER,      /* directory, link, device, FIFO: no data we read */
    DH_TAR_LONGNAME,   /* GNU 'L': the data is the next member's name */
    DH_TAR_PAX,        /* 'x': the data holds the next member's records */
    DH_TAR_PAX_GLOBAL, /* 'g': records for all later members */
    DH_TAR_END,        /* a zero block: the end of the archive */
};

struct dh_tar_header {
    enum dh_tar_type type;
    char name[DH_TAR_NAME_MAX]; /* ustar prefix/name joined */
    int64_t size;               /* bytes of data after the header */
};

/* What extension headers set for the member that follows them. */
struct dh_tar_pending {
    char name[DH_TAR_NAME_MAX];
    int has_name;
    int64_t size;
    int has_size;
};

/* Parses one header block.  0, or DH_EFORMAT with `e` saying what is wrong
 * (checksum, a size field that is not a number, an unknown magic). */
int dh__tar_parse(const unsigned char blk[DH_TAR_BLOCK],
                  struct dh_tar_header *h, struct dh_err *e) DH_MUST_CHECK;

/* Bytes the member's data takes in the archive: size rounded up to blocks. */
int64_t dh__tar_padded(int64_t size);

/* Reads a pax record block ("LEN key=value\n" ...) into `p`: `path` and
 * `size` are kept, other keys ignored.  0 or DH_EFORMAT. */
int dh__tar_pax(const char *data, size_t len, struct dh_tar_pending *p,
                struct dh_err *e) DH_MUST_CHECK;

/* Applies and clears what extension headers set: h's name and size. */
void dh__tar_apply(struct dh_tar_pending *p, struct dh_tar_header *h);

/*
 * Writes the header(s) of a regular file `name` of `size` bytes into out
 * (room for 3 blocks plus a pax record block: DH_TAR_HEADER_ROOM bytes):
 * a plain ustar header where the name fits (100 bytes, or a 155/100
 * prefix/name split), else a pax 'x' header whose `path` record holds it.
 * mtime 0, mode 0644, owner 0: the same input gives the same bytes.
 * Returns the bytes written (a multiple of 512), or -1 when the name is
 * empty or longer than DH_TAR_NAME_MAX - 1.
 */
#define DH_TAR_HEADER_ROOM (3 * DH_TAR_BLOCK + DH_TAR_NAME_MAX + 64)
long dh__tar_write_header(unsigned char *out, const char *name, int64_t size);

/* WebDataset's key of a member name: everything before the first dot of
 * its last path component (with the folders before it); *ext the rest
 * after that dot ("" when none).  key must hold DH_TAR_NAME_MAX bytes. */
void dh__tar_split_key(const char *name, char *key, const char **ext);

#endif
