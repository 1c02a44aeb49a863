/*
 * bench_payload.h - the payload half of bench_route's "cost of security"
 * section (bench_payload.c): the real payload path, CURVE on or off.
 */
#ifndef DH_BENCH_PAYLOAD_H
#define DH_BENCH_PAYLOAD_H

#include <stdint.h>

#include "datahelix/error.h"

#define BENCH_PAY_BYTES (4u << 20) /* one batch */

struct bench_pay {
    double mbps;            /* the timed batches' MB/s */
    double cpu_ns_per_byte; /* CPU time of the process (both ends, every
                               thread, user + system) per byte moved */
    uint64_t parts;         /* parts the inbox reassembled */
};

/* One run: `warmup` untimed then `count` timed 4 MiB batches from a
 * sidecar's payload link (`stripes` sockets, its own context with as many
 * I/O threads) into a local DataServer's inbox (its own context, likewise)
 * over tcp://127.0.0.1, placed in an arena and released as a client
 * would.  0 and *out, or the error (e says which). */
int bench_pay_once(int curve, uint32_t stripes, int warmup, int count,
                   struct bench_pay *out, struct dh_err *e);

/* The ceilings on this machine, one core each, over 4 MiB: the cipher
 * CURVE boxes a message with (XSalsa20-Poly1305, crypto_secretbox_easy;
 * 0 if built without libsodium) and memcpy. MB/s. */
double bench_cipher_mbps(void);
/* AES-256-GCM (crypto_aead_aes256gcm_encrypt), which CURVE does not
 * offer: 0 without libsodium or AES-NI. */
double bench_aes_mbps(void);
double bench_memcpy_mbps(void);

#endif
