/*
 * local_link.c - the client <-> local DataServer link (local_link.h):
 * the hello codec and abstract-namespace Unix sockets.
 *
 * Locking: none.
 */
#include <errno.h>
#include <stdio.h>
#include <stddef.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/le.h"
#include "runtime/local_link.h"

static const char MAGIC[8] = {'D', 'H', 'A', 'R', 'E', 'N', 'A', '2'};

int dh__link_token_new(char out[DH_WIRE_TOKEN_LEN + 1], struct dh_err *e)
{
    unsigned char raw[DH_WIRE_TOKEN_LEN / 2];
    size_t got = 0;

    while (got < sizeof(raw)) {
        ssize_t n = getrandom(raw + got, sizeof(raw) - got, 0);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return dh_err_set(e, DH_EIO, "rank token: getrandom: %s",
                              strerror(errno));
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof(raw); i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

int dh__link_token_ok(const char *t)
{
    size_t i = 0;

    for (; t && i < DH_WIRE_TOKEN_LEN; i++)
        if (!((t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f')))
            return 0;
    return t && t[i] == '\0';
}

void dh__link_hello_pack(unsigned char out[DH_LINK_HELLO_BYTES],
                         const struct dh_link_hello *h)
{
    memcpy(out, MAGIC, sizeof(MAGIC));
    dh__put_le32(out + 8, h->server_id);
    dh__put_le32(out + 12, h->rank);
    dh__put_le64(out + 16, h->capacity);
    memcpy(out + 24, h->token, DH_WIRE_TOKEN_LEN);
}

int dh__link_hello_unpack(const unsigned char *in, size_t len,
                          struct dh_link_hello *h, struct dh_err *e)
{
    if (len != DH_LINK_HELLO_BYTES || memcmp(in, MAGIC, sizeof(MAGIC)) != 0)
        return dh_err_set(e, DH_EFORMAT,
                          "local link: not a datahelix arena "
                          "hello (%zu bytes)",
                          len);
    h->server_id = dh__get_le32(in + 8);
    h->rank = dh__get_le32(in + 12);
    h->capacity = dh__get_le64(in + 16);
    memcpy(h->token, in + 24, DH_WIRE_TOKEN_LEN);
    h->token[DH_WIRE_TOKEN_LEN] = '\0';
    if (!dh__link_token_ok(h->token))
        return dh_err_set(e, DH_EFORMAT,
                          "local link: the hello's rank token is not "
                          "%u hex digits",
                          DH_WIRE_TOKEN_LEN);
    return 0;
}

/* Fills an abstract address; its length through *len. */
static int abstract_addr(const char *name, struct sockaddr_un *a,
                         socklen_t *len, struct dh_err *e)
{
    size_t n;

    if (name && name[0] == '@')
        name++;
    if (!name || !(n = strlen(name)) || n > DH_LINK_MAX_NAME ||
        n + 1 > sizeof(a->sun_path))
        return dh_err_set(e, DH_EINVAL,
                          "local link: bad socket name '%s' "
                          "(1..%d bytes)",
                          name ? name : "", DH_LINK_MAX_NAME);
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    memcpy(a->sun_path + 1, name, n); /* sun_path[0] = 0: abstract */
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
    return 0;
}

int dh__link_listen(const char *name, struct dh_err *e)
{
    struct sockaddr_un a;
    socklen_t len;
    int fd, rc;

    if ((rc = abstract_addr(name, &a, &len, e)) < 0)
        return rc;
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return dh_err_set(e, DH_EIO, "local link: socket: %s", strerror(errno));
    if (bind(fd, (struct sockaddr *)&a, len) < 0 || listen(fd, 4) < 0) {
        int err = errno;

        close(fd);
        return dh_err_set(
            e, DH_EIO, "local link: cannot listen on @%s: %s", a.sun_path + 1,
            err == EADDRINUSE ? "name in use (another dataserver?)"
                              : strerror(err));
    }
    return fd;
}

int dh__link_connect(const char *name, struct dh_err *e)
{
    struct sockaddr_un a;
    socklen_t len;
    int fd, rc;

    if ((rc = abstract_addr(name, &a, &len, e)) < 0)
        return rc;
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return dh_err_set(e, DH_EIO, "local link: socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&a, len) < 0) {
        int err = errno;

        close(fd);
        return dh_err_set(e, DH_EIO, "no local dataserver listens on @%s: %s",
                          a.sun_path + 1, strerror(err));
    }
    return fd;
}
