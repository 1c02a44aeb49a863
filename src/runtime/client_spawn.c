/*
 * client_spawn.c - the client's local DataServer: starting the embedded
 * one (posix_spawn of `datahelix dataserver --client-fd N` in its own
 * process group, so a Ctrl-C at the terminal reaches the training process
 * only and the server ends when its link does), attaching to an external
 * one, receiving the arena hello, and reaping.
 *
 * Locking: called by create() before the I/O thread exists, or by the I/O
 * thread; appending to c->arenas is the only shared write (see
 * client_internal.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "runtime/client_internal.h"
#include "runtime/fdpass.h"
#include "runtime/keys.h"
#include "runtime/peer_cred.h"

extern char **environ;

#define CHILD_FD 3 /* where the child finds its end of the link */

/* Receives the hello and the arena fd on c->link_fd, attaches the arena. */
static int greet(struct dh_client *c, uint32_t want_id, const char *who,
                 struct dh_err *e)
{
    unsigned char buf[DH_LINK_HELLO_BYTES + 8];
    size_t len = 0;
    int fd = -1, rc, n = atomic_load(&c->n_arenas);
    struct dh_link_hello h;
    struct dh_arena *a = NULL;

    if (n >= CL_MAX_ARENAS)
        return dh_err_set(e, DH_ETOOBIG,
                          "rank %u: too many local dataserver "
                          "restarts (%d)",
                          c->rank, n);
    rc = dh__fd_recv(c->link_fd, &fd, buf, sizeof(buf), &len,
                     c->start_timeout_ms, e);
    if (rc == DH_EPEERDEAD)
        return dh_err_set(e, DH_EIO,
                          "%s closed the link before handing "
                          "over its arena (it died, or refused this "
                          "process: its log says which)",
                          who);
    if (rc == DH_ETIMEOUT)
        return dh_err_set(e, DH_ETIMEOUT,
                          "%s did not hand over its arena "
                          "within %d ms",
                          who, c->start_timeout_ms);
    if (rc < 0)
        return rc;
    if ((rc = dh__link_hello_unpack(buf, len, &h, e)) < 0)
        goto out;
    if (fd < 0) {
        rc = dh_err_set(e, DH_EFORMAT,
                        "%s sent its hello without the arena "
                        "descriptor",
                        who);
        goto out;
    }
    if (h.rank != c->rank || (want_id && h.server_id != want_id)) {
        rc = dh_err_set(e, DH_EINVAL,
                        "%s serves rank %u as server %u, not "
                        "rank %u",
                        who, h.rank, h.server_id, c->rank);
        goto out;
    }
    if (want_id && !dh__secret_eq(h.token, c->token)) {
        rc = dh_err_set(e, DH_EINVAL,
                        "%s does not hold the rank token it was given", who);
        goto out;
    }
    if ((rc = dh_arena_attach(fd, &a, e)) < 0)
        goto out;
    if (!want_id) /* external: the server's token is the rank's */
        memcpy(c->token, h.token, sizeof(c->token));
    c->arenas[n] = (struct cl_arena){.server_id = h.server_id, .a = a};
    atomic_store(&c->n_arenas, n + 1);
    c->server_id = h.server_id;
out:
    if (fd >= 0)
        close(fd);
    return rc;
}

static const char *program(const struct dh_client *c)
{
    const char *env = getenv("DATAHELIX_BIN");

    if (c->bin)
        return c->bin;
    return env && env[0] ? env : "datahelix";
}

/* The child's environment: ours without any DATAHELIX_RANK_TOKEN, plus
 * the rank's token (the one place it is handed over: never on the
 * command line, which other users can read), and with opts.server_log its
 * DATAHELIX_LOG instead of ours.  The strings are borrowed from environ
 * and from c->env_token / env_log; 0 or ENOMEM. */
static int child_env(struct dh_client *c, char ***out)
{
    size_t n = 0, k = 0, pre = sizeof(DH_RANK_TOKEN_ENV "=") - 1;
    char **v;

    while (environ[n])
        n++;
    if (!(v = dh__calloc(n + 3, sizeof(*v))))
        return ENOMEM;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], DH_RANK_TOKEN_ENV "=", pre) != 0 &&
            !(c->env_log[0] && !strncmp(environ[i], "DATAHELIX_LOG=", 14)))
            v[k++] = environ[i];
    snprintf(c->env_token, sizeof(c->env_token), "%s=%s", DH_RANK_TOKEN_ENV,
             c->token);
    v[k++] = c->env_token;
    if (c->env_log[0])
        v[k++] = c->env_log;
    v[k] = NULL;
    *out = v;
    return 0;
}

int dh__cl_start_server(struct dh_client *c, uint32_t server_id,
                        struct dh_err *e)
{
    int sv[2] = {-1, -1}, rc;
    char rank[16], workers[16], sid[16], mb[24], fdn[8], who[96];
    const char *bin = program(c);
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    char **envp = NULL;
    sigset_t none;
    pid_t pid = -1;

    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return dh_err_set(e, DH_EIO, "rank %u: socketpair: %s", c->rank,
                          strerror(errno));
    snprintf(rank, sizeof(rank), "%u", c->rank);
    snprintf(workers, sizeof(workers), "%u", c->ds_workers);
    snprintf(sid, sizeof(sid), "%u", server_id);
    snprintf(mb, sizeof(mb), "%zu", (c->arena_bytes + (1u << 20) - 1) >> 20);
    snprintf(fdn, sizeof(fdn), "%d", CHILD_FD);
    char *argv[16 + 2 + 2 + 4 + DH_CLIENT_MAX_DS_ARGS + 1] = {
        (char *)bin,  "dataserver", "--coordinator", c->coord,
        "--rank",     rank,         "--index",       c->index_path,
        "--workers",  workers,      "--server-id",   sid,
        "--arena-mb", mb,           "--client-fd",   fdn};
    int argc = 16;

    if (c->ds_listen) { /* payloads from remote DataServers */
        argv[argc++] = "--listen";
        argv[argc++] = c->ds_listen;
    }
    if (c->keyfile) { /* the path, never the key itself */
        argv[argc++] = "--keyfile";
        argv[argc++] = c->keyfile;
    }
    if (c->cache_dir) { /* the host's cache, shared with this client */
        argv[argc++] = "--cache-dir";
        argv[argc++] = c->cache_dir;
        if (c->cache_bytes[0]) {
            argv[argc++] = "--cache-bytes";
            argv[argc++] = c->cache_bytes;
        }
    }
    for (int i = 0; c->ds_args[i]; i++)
        argv[argc++] = c->ds_args[i];
    argv[argc] = NULL;

    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    sigemptyset(&none);
    /* The child end lands on CHILD_FD without close-on-exec (dup2 clears
     * it); if it already is CHILD_FD, move it first. */
    if (sv[1] == CHILD_FD) {
        int d = fcntl(sv[1], F_DUPFD_CLOEXEC, CHILD_FD + 1);

        close(sv[1]);
        sv[1] = d;
    }
    posix_spawn_file_actions_adddup2(&fa, sv[1], CHILD_FD);
    posix_spawnattr_setpgroup(&at, 0);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setflags(&at,
                             POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
    rc = sv[1] < 0 ? EMFILE : child_env(c, &envp);
    if (rc == 0)
        rc = posix_spawnp(&pid, bin, &fa, &at, argv, envp);
    dh__free(envp);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (sv[1] >= 0)
        close(sv[1]);
    if (rc != 0) {
        close(sv[0]);
        return dh_err_set(e, DH_EIO,
                          "rank %u: cannot start the local "
                          "dataserver '%s': %s (set DATAHELIX_BIN)",
                          c->rank, bin, strerror(rc));
    }
    c->child = pid;
    c->link_fd = sv[0];
    snprintf(who, sizeof(who), "local dataserver of rank %u (pid %d)", c->rank,
             (int)pid);
    if ((rc = greet(c, server_id, who, e)) < 0) {
        char why[128];

        close(c->link_fd);
        c->link_fd = -1;
        dh__cl_reap(c, 2000, why, sizeof(why));
        /* Keep the greeting's message; add how the server ended. */
        size_t l = strlen(e->msg);

        if (l + 3 < sizeof(e->msg))
            snprintf(e->msg + l, sizeof(e->msg) - l, " (%s)", why);
    }
    return rc;
}

int dh__cl_attach_server(struct dh_client *c, struct dh_err *e)
{
    char who[160];
    struct dh_peer_cred pc;
    int rc;

    /* The server may still be starting: retry within the start bound. */
    uint64_t end = dh__mono_ms() + (uint64_t)c->start_timeout_ms;

    while ((c->link_fd = dh__link_connect(c->ds_name, e)) < 0) {
        struct timespec ts = {0, 20000000};

        rc = c->link_fd;
        c->link_fd = -1;
        if (rc != DH_EIO || dh__mono_ms() >= end)
            return rc;
        nanosleep(&ts, NULL);
    }
    snprintf(who, sizeof(who), "local dataserver @%s", c->ds_name);
    /* Anyone may listen on an abstract name: take an arena only from a
     * server of this user (peer_cred.h). */
    if ((rc = dh__peer_cred(c->link_fd, &pc, e)) < 0 ||
        (rc = dh__peer_check(&pc, getuid(), 0, who, e)) < 0) {
        close(c->link_fd);
        c->link_fd = -1;
        return rc;
    }
    if ((rc = greet(c, 0, who, e)) < 0) {
        close(c->link_fd);
        c->link_fd = -1;
    }
    return rc;
}

static void describe(int status, char *why, size_t n)
{
    if (WIFEXITED(status))
        snprintf(why, n, "exit status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(why, n, "killed by signal %d", WTERMSIG(status));
    else
        snprintf(why, n, "status 0x%x", status);
}

int dh__cl_reap(struct dh_client *c, int grace_ms, char *why, size_t n)
{
    uint64_t end = dh__mono_ms() + (uint64_t)grace_ms;
    int status = 0, clean = 0;
    pid_t r;

    snprintf(why, n, "no process");
    if (c->child <= 0)
        return 1;
    while ((r = waitpid(c->child, &status, WNOHANG)) == 0 &&
           dh__mono_ms() < end) {
        struct timespec ts = {0, 2000000};

        nanosleep(&ts, NULL);
    }
    if (r == 0) { /* did not stop on its own */
        kill(c->child, SIGKILL);
        while ((r = waitpid(c->child, &status, 0)) < 0 && errno == EINTR)
            ;
        snprintf(why, n, "killed after %d ms", grace_ms);
    } else if (r > 0) {
        describe(status, why, n);
        clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    c->child = -1;
    return clean ? 0 : 1;
}
