/*
 * keys.c - the job key file (keys.h, docs/security.md "Key files").
 *
 * Design notes:
 *   - The format is lines of `name = value` so a person can read which key
 *     is which, and Z85 (ZeroMQ's own text form of a CURVE key) so the
 *     values go to ZMQ_CURVE_* unchanged.  Parsing is pure and unit tested.
 *   - The owner-only check is made on the opened descriptor (fstat after
 *     open with O_NOFOLLOW), so a file swapped in between is not read.
 *   - Writing is atomic: a 0600 temporary file beside the target, fsync,
 *     rename; a reader never sees half a key, and the key never exists
 *     with a wider mode, even for an instant.
 *   - Crypto: zmq_curve_keypair (libsodium inside libzmq); none here.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>
#include <zmq.h>

#include "runtime/keys.h"

/* ---- parsing ---- */

static int valid_z85(const char *v)
{
    uint8_t raw[32];

    return strlen(v) == DH_KEY_Z85_LEN && zmq_z85_decode(raw, v) != NULL;
}

/* Trims spaces / tabs at both ends of s[0..*n). */
static const char *trim(const char *s, size_t *n)
{
    while (*n && (*s == ' ' || *s == '\t')) {
        s++;
        (*n)--;
    }
    while (*n && (s[*n - 1] == ' ' || s[*n - 1] == '\t' || s[*n - 1] == '\r'))
        (*n)--;
    return s;
}

static int parse_line(const char *l, size_t n, int line, const char *name,
                      struct dh_keys *k, int *seen, struct dh_err *e)
{
    const char *eq = memchr(l, '=', n), *key, *val;
    size_t kn, vn;
    char v[DH_KEY_Z85_LEN + 2];

    l = trim(l, &n);
    if (n == 0 || l[0] == '#')
        return 0;
    if (!eq)
        return dh_err_set(e, DH_EINVAL,
                          "key file %s: line %d: expected `name = value`", name,
                          line);
    kn = (size_t)(eq - l);
    key = trim(l, &kn);
    vn = n - (size_t)(eq - l) - 1;
    val = trim(eq + 1, &vn);
    if (vn > DH_KEY_Z85_LEN)
        vn = DH_KEY_Z85_LEN + 1; /* too long: fails valid_z85 below */
    memcpy(v, val, vn);
    v[vn] = 0;
    if (!valid_z85(v))
        return dh_err_set(e, DH_EINVAL,
                          "key file %s: line %d: not a 40-character Z85 "
                          "CURVE key",
                          name, line);
    if (kn == 10 && !memcmp(key, "public-key", 10)) {
        memcpy(k->pub, v, sizeof(k->pub));
        *seen |= 1;
    } else if (kn == 10 && !memcmp(key, "secret-key", 10)) {
        memcpy(k->sec, v, sizeof(k->sec));
        *seen |= 2;
    } else if (kn == 10 && !memcmp(key, "server-key", 10)) {
        memcpy(k->server, v, sizeof(k->server));
    } else if (kn == 9 && !memcmp(key, "admin-key", 9)) {
        if (k->n_admin == DH_KEY_MAX_ADMIN)
            return dh_err_set(e, DH_EINVAL,
                              "key file %s: line %d: more than %d admin keys",
                              name, line, DH_KEY_MAX_ADMIN);
        memcpy(k->admin[k->n_admin++], v, DH_KEY_Z85_LEN + 1);
    } else {
        return dh_err_set(e, DH_EINVAL,
                          "key file %s: line %d: unknown name '%.*s' (want "
                          "public-key, secret-key, server-key or admin-key)",
                          name, line, (int)(kn > 32 ? 32 : kn), key);
    }
    return 0;
}

int dh__keys_parse(const char *text, size_t len, const char *name,
                   struct dh_keys *k, struct dh_err *e)
{
    char derived[DH_KEY_Z85_LEN + 1];
    int seen = 0, line = 0, rc;
    size_t i = 0;

    memset(k, 0, sizeof(*k));
    while (i < len) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t n = nl ? (size_t)(nl - (text + i)) : len - i;

        if ((rc = parse_line(text + i, n, ++line, name, k, &seen, e)) < 0)
            goto fail;
        i += n + 1;
    }
    if (seen != 3) {
        rc = dh_err_set(e, DH_EINVAL, "key file %s: no %s line", name,
                        seen & 1 ? "secret-key" : "public-key");
        goto fail;
    }
    if (zmq_curve_public(derived, k->sec) < 0 || strcmp(derived, k->pub)) {
        rc = dh_err_set(e, DH_EINVAL,
                        "key file %s: the secret-key does not belong to the "
                        "public-key",
                        name);
        goto fail;
    }
    return 0;
fail:
    dh__keys_wipe(k);
    return rc;
}

size_t dh__keys_format(const struct dh_keys *k, char *buf, size_t cap)
{
    int n = snprintf(buf, cap,
                     "# datahelix job key (ZeroMQ CURVE, Z85). Whoever can "
                     "read this file\n# can join the job: keep it mode "
                     "0600.\npublic-key = %s\nsecret-key = %s\n",
                     k->pub, k->sec);

    if (k->server[0] && n >= 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, "server-key = %s\n", k->server);
    for (int i = 0; i < k->n_admin && n >= 0 && (size_t)n < cap; i++)
        n += snprintf(buf + n, cap - (size_t)n, "admin-key = %s\n",
                      k->admin[i]);
    return n < 0 ? 0 : (size_t)n >= cap ? cap - 1 : (size_t)n;
}

int dh__keys_generate(struct dh_keys *k, struct dh_err *e)
{
    memset(k, 0, sizeof(*k));
    if (zmq_curve_keypair(k->pub, k->sec) < 0)
        return dh_err_set(e, DH_EIO, "cannot generate a CURVE key: %s",
                          zmq_strerror(zmq_errno()));
    return 0;
}

void dh__keys_wipe(struct dh_keys *k)
{
    sodium_memzero(k, sizeof(*k));
}

int dh__secret_eq(const char *a, const char *b)
{
    size_t n = strlen(a);

    return n == strlen(b) && sodium_memcmp(a, b, n) == 0;
}

/* A keyed BLAKE2b of the target's id, under the sender's own secret:
 * unforgeable without the secret, and different per target, so a target
 * that learns its token cannot send as that server to another rank. */
void dh__payload_token(const char *secret, uint32_t target,
                       char out[DH_WIRE_TOKEN_LEN + 1])
{
    static const char label[] = "datahelix payload token v1";
    unsigned char msg[sizeof(label) + 4], mac[DH_WIRE_TOKEN_LEN / 2];

    out[0] = '\0';
    if (!secret || strlen(secret) != DH_WIRE_TOKEN_LEN)
        return;
    memcpy(msg, label, sizeof(label));
    for (int i = 0; i < 4; i++)
        msg[sizeof(label) + (size_t)i] = (unsigned char)(target >> (8 * i));
    crypto_generichash(mac, sizeof(mac), msg, sizeof(msg),
                       (const unsigned char *)secret, DH_WIRE_TOKEN_LEN);
    for (size_t i = 0; i < sizeof(mac); i++)
        snprintf(out + 2 * i, 3, "%02x", mac[i]);
    sodium_memzero(msg, sizeof(msg));
}

/* ---- files ---- */

int dh__keys_load(const char *path, struct dh_keys *k, struct dh_err *e)
{
    char buf[DH_KEY_MAX_FILE];
    struct stat st;
    ssize_t n = 0, r;
    int fd = open(path,
                  O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK),
        rc;

    if (fd < 0)
        return dh_err_set(e, DH_EIO, "key file %s: cannot open: %s", path,
                          strerror(errno));
    if (fstat(fd, &st) < 0) {
        rc = dh_err_set(e, DH_EIO, "key file %s: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = dh_err_set(e, DH_EINVAL, "key file %s: not a regular file", path);
        goto out;
    }
    if (st.st_uid != geteuid()) {
        rc = dh_err_set(e, DH_EINVAL,
                        "key file %s: owned by uid %u, not by this user (uid "
                        "%u): refused",
                        path, (unsigned)st.st_uid, (unsigned)geteuid());
        goto out;
    }
    if (st.st_mode & 077) {
        rc = dh_err_set(e, DH_EINVAL,
                        "key file %s: mode %04o lets group or others read "
                        "it: refused (chmod 600 %s)",
                        path, (unsigned)(st.st_mode & 07777), path);
        goto out;
    }
    while (n < (ssize_t)sizeof(buf) &&
           (r = read(fd, buf + n, sizeof(buf) - (size_t)n)) != 0) {
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = dh_err_set(e, DH_EIO, "key file %s: %s", path,
                            strerror(errno));
            goto out;
        }
        n += r;
    }
    if (n == (ssize_t)sizeof(buf)) {
        rc = dh_err_set(e, DH_EINVAL, "key file %s: over %d bytes", path,
                        DH_KEY_MAX_FILE - 1);
        goto out;
    }
    rc = dh__keys_parse(buf, (size_t)n, path, k, e);
out:
    memset(buf, 0, sizeof(buf));
    close(fd);
    return rc;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);

        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int dh__keys_write(const char *path, const struct dh_keys *k, int replace,
                   struct dh_err *e)
{
    char tmp[4096], buf[DH_KEY_MAX_FILE];
    size_t n = dh__keys_format(k, buf, sizeof(buf));
    int fd, rc = 0;

    if (!replace && access(path, F_OK) == 0)
        return dh_err_set(e, DH_EDUP,
                          "key file %s already exists: not replaced", path);
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid()) >=
        (int)sizeof(tmp))
        return dh_err_set(e, DH_EINVAL, "key file %s: path too long", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        rc = dh_err_set(e, DH_EIO, "key file %s: cannot create %s: %s", path,
                        tmp, strerror(errno));
        goto out;
    }
    /* The umask can only narrow 0600; fchmod makes it exact either way. */
    if (fchmod(fd, 0600) < 0 || write_all(fd, buf, n) < 0 || fsync(fd) < 0) {
        rc = dh_err_set(e, DH_EIO, "key file %s: cannot write %s: %s", path,
                        tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        goto out;
    }
    close(fd);
    if (rename(tmp, path) < 0) {
        rc = dh_err_set(e, DH_EIO, "key file %s: cannot rename %s: %s", path,
                        tmp, strerror(errno));
        unlink(tmp);
    }
out:
    memset(buf, 0, sizeof(buf));
    return rc;
}

const char *dh__keys_path(const char *opt)
{
    const char *env;

    if (opt && *opt)
        return opt;
    env = getenv(DH_KEYFILE_ENV);
    return env && *env ? env : NULL;
}

int dh__keys_resolve(const char *opt, struct dh_keys *k, int *have,
                     struct dh_err *e)
{
    const char *path = dh__keys_path(opt);
    int rc;

    *have = 0;
    if (!path)
        return 0;
    if ((rc = dh__keys_load(path, k, e)) < 0)
        return rc;
    *have = 1;
    return 0;
}
