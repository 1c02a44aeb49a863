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
 * Hello: "DHARENA2", server id (u32), rank (u32), arena capacity (u64),
 * little-endian, then the rank's token (DH_WIRE_TOKEN_LEN hex digits:
 * the client's own in embedded mode, the one the server drew in external
 * mode, which the client then registers with; docs/wire-protocol.md
 * "Authorization"), DH_LINK_HELLO_BYTES in all.
 *
 * Thread-safety: the functions keep no state.
 */
#ifndef DH_RUNTIME_LOCAL_LINK_H
#define DH_RUNTIME_LOCAL_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"

#include "datahelix/wire.h"

#define DH_LINK_HELLO_BYTES (24 + DH_WIRE_TOKEN_LEN)
#define DH_LINK_MAX_NAME 100 /* sun_path minus the leading NUL, rounded */

struct dh_link_hello {
    uint32_t server_id, rank;
    uint64_t capacity;
    char token[DH_WIRE_TOKEN_LEN + 1];
};

/* Draws a new rank token: DH_WIRE_TOKEN_LEN lower-case hex digits of
 * getrandom(2).  DH_EIO if the kernel gives no randomness. */
int dh__link_token_new(char out[DH_WIRE_TOKEN_LEN + 1],
                       struct dh_err *e) DH_MUST_CHECK;
/* 1 if `t` is a well-formed token. */
int dh__link_token_ok(const char *t);

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
