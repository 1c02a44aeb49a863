/*
 * keys.h - a job's CURVE key (docs/security.md "Key files"): parsing and
 * writing the key file format, the owner-only check on reading one, and
 * generating a new key.  Used by the transport (transport.h), the CLI
 * (`--keyfile`, `datahelix keygen`) and the library entry points that
 * take a keyfile option.
 *
 * A job has one CURVE key pair: every bound socket is a CURVE server with
 * it, every connecting socket a CURVE client with it (so a peer proves it
 * holds the job's secret), and the ZAP handler (zap.h) admits only the
 * job's public key plus the file's optional admin keys.
 *
 * Internal (not under include/).  Pure except dh__keys_load / _write /
 * _generate, which touch the file system or the RNG.
 */
#ifndef DH_RUNTIME_KEYS_H
#define DH_RUNTIME_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"
#include "datahelix/wire.h"

#define DH_KEY_Z85_LEN 40 /* a 32-byte CURVE key in Z85 */
#define DH_KEY_MAX_ADMIN 8
#define DH_KEY_MAX_FILE 4096 /* a key file is a few lines */
/* The environment variable naming the key file when no option does. */
#define DH_KEYFILE_ENV "DATAHELIX_KEYFILE"

/* 1 if the NUL-terminated secrets a and b (rank tokens, keys) are equal.
 * The bytes are compared with sodium_memcmp, whose time does not depend
 * on where they differ, so a peer cannot find a token a byte at a time by
 * timing refusals; only the lengths (fixed: 32 hex digits, 40 Z85
 * characters) are compared first.  scripts/checksrc.py refuses strcmp,
 * memcmp and the like on a token or a secret. */
int dh__secret_eq(const char *a, const char *b);

/* The token a server whose payload secret is `secret` (DH_WIRE_TOKEN_LEN
 * hex digits, RegisterServer.sender_secret) puts in the payloads it sends
 * to server `target` (docs/security.md "Who may send a payload"): 32
 * lower-case hex digits of a keyed BLAKE2b, or "" for a secret that is not
 * DH_WIRE_TOKEN_LEN characters.  The sender and the Coordinator compute
 * it; the target only compares. */
void dh__payload_token(const char *secret, uint32_t target,
                       char out[DH_WIRE_TOKEN_LEN + 1]);

struct dh_keys {
    char pub[DH_KEY_Z85_LEN + 1];    /* the job's public key, Z85 */
    char sec[DH_KEY_Z85_LEN + 1];    /* its secret key, Z85 */
    char server[DH_KEY_Z85_LEN + 1]; /* the job's servers' public key to
                                        connect to: "" = pub (the job's own
                                        pair); set in an admin's file */
    int n_admin;                     /* extra public keys admitted as admin */
    char admin[DH_KEY_MAX_ADMIN][DH_KEY_Z85_LEN + 1];
};

/*
 * Parses a key file's text (`len` bytes, need not be NUL-terminated):
 * lines `public-key = Z85`, `secret-key = Z85`, `admin-key = Z85` (0..8),
 * `server-key = Z85` (0..1), blank lines and `#` comments.  The secret
 * must belong to the public key.  `name` names the file in messages.
 * 0, or DH_EINVAL naming the line.
 */
int dh__keys_parse(const char *text, size_t len, const char *name,
                   struct dh_keys *k, struct dh_err *e) DH_MUST_CHECK;

/* The key file's text for `k` into buf (at least DH_KEY_MAX_FILE bytes):
 * its length. */
size_t dh__keys_format(const struct dh_keys *k, char *buf, size_t cap);

/* A new random key pair (no admin keys).  0 or DH_EIO (no entropy). */
int dh__keys_generate(struct dh_keys *k, struct dh_err *e) DH_MUST_CHECK;

/*
 * Reads and parses the key file `path`.  Refused (DH_EINVAL, the message
 * names the file and why) unless it is a regular file owned by this user
 * and not readable or writable by group or others (mode & 077 == 0), so a
 * key never comes from a file someone else could read or plant.
 * DH_EIO: it cannot be opened or read.
 */
int dh__keys_load(const char *path, struct dh_keys *k,
                  struct dh_err *e) DH_MUST_CHECK;

/*
 * Writes `k` to `path` atomically with mode 0600: a temporary file beside
 * it (O_EXCL, 0600), fsync, rename.  An existing `path` is replaced only
 * if `replace`; else DH_EDUP naming it.  DH_EIO on a write failure
 * (nothing is left behind).
 */
int dh__keys_write(const char *path, const struct dh_keys *k, int replace,
                   struct dh_err *e) DH_MUST_CHECK;

/* The key file to use: `opt` if given, else $DATAHELIX_KEYFILE if set and
 * not empty, else NULL (no key). */
const char *dh__keys_path(const char *opt);

/* Loads the key file dh__keys_path(opt) names into *k; *have = 1 if there
 * is one, 0 if none is configured (k untouched).  Errors of load(). */
int dh__keys_resolve(const char *opt, struct dh_keys *k, int *have,
                     struct dh_err *e) DH_MUST_CHECK;

/* The public key a connecting socket expects of the server. */
static inline const char *dh__keys_server(const struct dh_keys *k)
{
    return k->server[0] ? k->server : k->pub;
}

/* Overwrites the secret in memory once it is no longer needed. */
void dh__keys_wipe(struct dh_keys *k);

#endif
