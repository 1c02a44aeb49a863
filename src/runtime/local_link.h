/*
 * local_link.h - the link between a training rank's client and its local
 * DataServer (internal; docs/arena.md "Hand-over of the arena").
 *
 * One SOCK_SEQPACKET Unix socket per rank, either a socketpair whose one
 * end the client passes to the DataServer it spawns (embedded mode), or an
 * abstract-namespace name the DataServer listens on (external mode; an
 * abstract name leaves nothing in the file system to leak).  Over it the
 * DataServer sends exactly one message, the hello, with the arena's memfd
 * attached (fdpass.h).  After that the link carries nothing: it exists so
 * that each side sees the other die (POLLHUP / EOF), whatever the cause,
 * SIGKILL included.
 *
 * Hello: "DHARENA1", server id (u32), rank (u32), arena capacity (u64),
 * little-endian, DH_LINK_HELLO_BYTES in all.
 *
 * Thread-safety: the functions keep no state.
 */
#ifndef DH_RUNTIME_LOCAL_LINK_H
#define DH_RUNTIME_LOCAL_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"

#define DH_LINK_HELLO_BYTES 24
#define DH_LINK_MAX_NAME 100 /* sun_path minus the leading NUL, rounded */

struct dh_link_hello {
    uint32_t server_id, rank;
    uint64_t capacity;
};

void dh__link_hello_pack(unsigned char out[DH_LINK_HELLO_BYTES],
                         const struct dh_link_hello *h);
/* DH_EFORMAT (naming the problem) unless `in` is a hello of `len` bytes. */
int dh__link_hello_unpack(const unsigned char *in, size_t len,
                          struct dh_link_hello *h,
                          struct dh_err *e) DH_MUST_CHECK;

/*
 * Listens on the abstract Unix name `name` (1..DH_LINK_MAX_NAME bytes, no
 * NUL; a leading '@' is dropped).  Returns the listening socket
 * (non-blocking, close-on-exec) or DH_EINVAL / DH_EIO ("name in use").
 */
int dh__link_listen(const char *name, struct dh_err *e) DH_MUST_CHECK;

/* Connects to the abstract name `name`; returns the socket or DH_EIO
 * naming it ("no local dataserver listens on @name"). */
int dh__link_connect(const char *name, struct dh_err *e) DH_MUST_CHECK;

#endif
