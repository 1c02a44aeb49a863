/*
 * datahelix/rb_link.h - Tier 2's exchange over ZeroMQ, for ranks without a
 * torch.distributed process group (issue 17 item 3's "C fallback";
 * docs/rebalance.md "Without a process group").  The primitive only: the
 * Python loader does not use it yet (load_balance= without a process group
 * still raises NotImplementedError).
 *
 * One link per rank of a group of n: a PULL socket bound at addrs[me] and
 * one PUSH connected to every other rank's address.  An exchange is an
 * all_to_all with split sizes, the layout of dh_rb_plan: rank me sends
 * send[off(j) .. off(j) + send_split[j]) to rank j (off: the sum of the
 * splits before j) and receives recv_split[s] bytes from every rank s at
 * recv[off(s)).  Every pair exchanges a message each round, empty or not,
 * so a round ends when n - 1 have arrived.  An all-gather is the same call
 * with one buffer sent to everyone.
 *
 * Messages: a 20-byte header (round u64, source u32, length u64, little
 * endian) and the payload.  A peer may run one round ahead (it finished
 * this one while we wait for a third rank): its next round's message is
 * kept for the next call.  Anything else - another round, an unknown or
 * repeated source, a length other than the split says - is DH_EPROTO
 * naming the peer.  Addresses must be ipc://, inproc:// or loopback tcp://
 * (no CURVE here: anything else is DH_EUNSUPPORTED).
 *
 * Every wait is bounded by the call's timeout: a dead or silent peer is
 * DH_ETIMEOUT naming the ranks that did not answer.  Thread-safety: a link
 * is used by one thread at a time (ZeroMQ sockets).
 */
#ifndef DATAHELIX_RB_LINK_H
#define DATAHELIX_RB_LINK_H

#include <stdint.h>

#include "datahelix/error.h"

struct dh_rb_link;

/*
 * Binds addrs[me] and connects to the n - 1 others (n <= 1024) in ZeroMQ
 * context zctx (the caller's, outliving the link).  0 and *out, or
 * DH_EINVAL, DH_EUNSUPPORTED (an address that is not local), DH_EIO (bind
 * or connect failed, naming the address), DH_ENOMEM.
 */
int dh_rb_link_create(void *zctx, const char *const *addrs, uint32_t n,
                      uint32_t me, struct dh_rb_link **out,
                      struct dh_err *e) DH_MUST_CHECK;

/*
 * Round `round` (increasing by one per call) of the exchange (see the
 * file's notes).  send_split and recv_split: n entries each (entry me is
 * ignored: nothing travels to oneself).  0 with recv filled, or
 * DH_ETIMEOUT, DH_EPROTO, DH_EIO, DH_ENOMEM with e naming the peer; recv
 * is then partly written.
 */
int dh_rb_link_exchange(struct dh_rb_link *l, uint64_t round, const void *send,
                        const uint64_t *send_split, void *recv,
                        const uint64_t *recv_split, int timeout_ms,
                        struct dh_err *e) DH_MUST_CHECK;

/* Closes the sockets (pending sends are dropped); accepts NULL. */
void dh_rb_link_destroy(struct dh_rb_link *l);

#endif
