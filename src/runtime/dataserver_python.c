/*
 * dataserver_python.c - a local DataServer's Python-dataset mode
 * (src/include/datahelix/dataserver.h `python_dataset`; DESIGN.md 8 "Python
 * datasets"; docs/python.md "DistributedDataLoader"): the jobs of this
 * server run in Python worker processes it starts and owns, instead of the
 * media worker pool.
 *
 * Design:
 *   - Worker i is `PYTHON -m datahelix._worker --fd 3 --arena-fd 4
 *     --dataset FILE --worker-id i ...`, fork+exec'd with one end of a
 *     SOCK_SEQPACKET socketpair on fd 3 and the arena's memfd on fd 4 (so
 *     it writes batches straight into the arena the client maps), every
 *     other descriptor closed, PR_SET_PDEATHSIG = SIGKILL (it dies with
 *     this server, SIGKILL included), in this server's process group.  It
 *     also ends when its socket reads EOF.
 *   - Messages (little-endian; worker = W, server = S):
 *       S->W "DHPJ" n:u32 task:u64 ids[k]:u64   a job of n ids, the first
 *            message holding up to PY_IDS_PER_MSG, "DHPC" k:u32 ids[k] the
 *            rest
 *       W->S "DHPR" pid:u32                     ready (dataset loaded)
 *            "DHPF" text                        cannot load the dataset
 *            "DHPS" task:u64 sample:u64         starting that sample
 *            "DHPA" task:u64 ref:20             slot allocated (so a
 *                                               death does not leak it)
 *            "DHPD" task:u64 ref:20             done: the slot holds it
 *            "DHPE" task:u64 sample:u64 code:i32 text
 *                                               failed without a slot
 *     A dataset's own exception travels inside the slot (the full
 *     traceback, which no notice could hold); "DHPE" is for what stops a
 *     worker from writing one (arena exhausted, batch over capacity).
 *   - One job per worker at a time, FIFO; an IterableDataset step is
 *     pinned to the worker whose stream it reads (pinned_worker).  A
 *     worker that dies (EOF on its socket) or overruns
 *     python_job_timeout_ms (SIGKILL) is reaped -
 *     bounded: SIGKILL after PY_REAP_MS - the slot it held goes back and
 *     a new worker takes its place.  A job whose worker died (not one
 *     that overran) runs again, ahead of the queue, PY_JOB_RETRIES times
 *     (a kill -9 from outside is not the samples' fault); after that, or
 *     after a timeout, it gets an ErrorNotice naming the sample it was on
 *     and how its worker ended.  A worker that says it
 *     cannot load the dataset, or PY_MAX_START_FAILS starts in a row that
 *     end before "ready", make the mode `broken`: every job then fails at
 *     once with that reason.
 *   - An executor (dataserver_internal.h): submit() queues a job, drain()
 *     does the work of a loop turn and reports each job's end to the sink
 *     (a RESULT: one uint8 tensor of the slot's bytes; or an ERROR).
 *   - Everything runs in the serving loop's turn (drain(); the workers'
 *     sockets are in the loop's poll, so a message wakes it), with
 *     non-blocking reads; the only blocking calls are job sends to an idle
 *     worker (bounded by DH_FD_SEND_TIMEOUT_MS) and destroy's bounded
 *     reaping.
 *
 * Locking: none (dataserver_internal.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/le.h"
#include "runtime/dataserver_internal.h"
#include "runtime/fdpass.h"
#include "runtime/forkserver.h"

extern char **environ;

#define PY_MAX_WORKERS DS_PY_MAX_WORKERS
#define PY_IDS_PER_MSG 4096
#define PY_MSG_MAX 8192
#define PY_START_TIMEOUT_MS 120000 /* import torch + unpickle the dataset */
#define PY_REAP_MS 2000            /* exit after EOF / SIGKILL */
#define PY_STOP_GRACE_MS 500       /* destroy: EOF, then SIGKILL */
#define PY_MAX_START_FAILS 3
#define PY_JOB_RETRIES                                                         \
    1                           /* runs of a job after its worker died (not a
                            timeout): a kill -9 is not the samples' fault,
                            a sample that kills every worker is */
#define PY_RESPAWN_MS 500       /* after a failed fork */
#define PY_FORK_ANSWER_MS 10000 /* the fork server's answer to a request */
#define PY_HDR_BIT (UINT64_C(1) << 63)
#define PY_NO_SAMPLE UINT64_MAX

enum pyw_state { PYW_EMPTY, PYW_STARTING, PYW_IDLE, PYW_BUSY, PYW_DYING };

struct ds_pyw {
    enum pyw_state st;
    unsigned id;
    pid_t pid;
    int fd;
    int pidfd;               /* forked by the fork server: its pidfd */
    int exited, exit_status; /* the fork server's exit notice came */
    struct ds_job *job;      /* BUSY (and DYING, if it died on one) */
    uint64_t deadline_ms;    /* STARTING: ready by; BUSY: done by; DYING:
                              exited by (then SIGKILL, then give up) */
    uint64_t respawn_ms;     /* EMPTY: start again at */
    uint64_t sample;         /* the sample it said it is on */
    int has_slot;
    struct dh_slot_ref slot;
    int killed, timed_out, was_ready;
    char why[160]; /* DYING: what we did to it, "" if it just died */
};

struct ds_py {
    struct ds_exec x; /* first */
    const struct ds_env *env;
    struct ds_sink sink;
    char *python, *dataset, *index, *pythonpath_env;
    char **envp;
    unsigned n;
    int job_timeout_ms, unlink_files;
    uint64_t seed;
    unsigned start_fails;
    struct dh_forkserver *fs; /* NULL: workers are fork+exec'd */
    struct ds_pyw *w;
    struct ds_job **q; /* FIFO ring of queued jobs */
    size_t q_cap, q_head, q_len;
    int broken;
    char broken_msg[DH_WIRE_MAX_TEXT];
};

/* ---- options, environment ---- */

/* An executable `name` (with a '/': as is; else the first on PATH) as a
 * new string, or NULL. */
static char *find_program(const char *name)
{
    const char *path = getenv("PATH");
    char buf[4096];

    if (strchr(name, '/'))
        return access(name, X_OK) == 0 ? dh__strdup(name) : NULL;
    for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);

        if (n &&
            (size_t)snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, p, name) <
                sizeof(buf) &&
            access(buf, X_OK) == 0)
            return dh__strdup(buf);
        p += n + (end ? 1 : 0);
    }
    return NULL;
}

/* environ with PYTHONPATH = python_path[:old value] (the strings are
 * environ's, except the one PYTHONPATH entry, kept in py). */
static int build_env(struct ds_py *py, const char *python_path,
                     struct dh_err *e)
{
    size_t n = 0, k = 0;
    const char *old = getenv("PYTHONPATH");

    while (environ[n])
        n++;
    if (!(py->envp = dh__calloc(n + 2, sizeof(*py->envp))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        if (!python_path || strncmp(environ[i], "PYTHONPATH=", 11))
            py->envp[k++] = environ[i];
    if (python_path) {
        size_t len = strlen(python_path) + (old ? strlen(old) : 0) + 16;

        if (!(py->pythonpath_env = dh__malloc(len)))
            return dh_err_set(e, DH_ENOMEM, "out of memory");
        snprintf(py->pythonpath_env, len, "PYTHONPATH=%s%s%s", python_path,
                 old && old[0] ? ":" : "", old ? old : "");
        py->envp[k++] = py->pythonpath_env;
    }
    py->envp[k] = NULL;
    return 0;
}

/* ---- workers: start, stop ---- */

static void set_broken(struct ds_py *py, const char *why);

/* In the child between fork and exec: async-signal-safe calls only. */
static void child_exec(int sock, int arena_fd, pid_t parent, char *const argv[],
                       char *const envp[])
{
    sigset_t none;
    int a, b;

    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* Dies with this server, SIGKILL included; if the server is already
     * gone, it is not needed. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
        _exit(127);
    a = fcntl(sock, F_DUPFD, 10);
    b = fcntl(arena_fd, F_DUPFD, 10);
    if (a < 0 || b < 0 || dup2(a, 3) < 0 || dup2(b, 4) < 0)
        _exit(127);
    close_range(5, ~0u, 0);
    execve(argv[0], argv, envp);
    _exit(127);
}

/* The fork server is not used any more (it failed or went away): its
 * workers die with it or live on, found dead through their pidfds. */
static void fs_lost(struct ds_py *py, const char *why)
{
    dh__log(DH_LOG_WARN,
            "dataserver %u: python fork server: %s; workers start as "
            "fresh interpreters from now on",
            py->env->server_id, why);
    dh__fs_close(py->fs);
    py->fs = NULL;
}

/* Exit notices to the workers they name (from_socket 0: only those the
 * last fork request set aside). */
static void fs_poll(struct ds_py *py, int from_socket)
{
    struct dh_err e = {0};
    pid_t pid;
    int status, r;

    while (py->fs &&
           (r = dh__fs_exit(py->fs, from_socket, &pid, &status, &e)) != 0) {
        if (r < 0) {
            fs_lost(py, e.msg);
            return;
        }
        for (unsigned i = 0; i < py->n; i++)
            if (py->w[i].pidfd >= 0 && py->w[i].pid == pid) {
                py->w[i].exited = 1;
                py->w[i].exit_status = status;
            }
    }
}

/* Worker w from the fork server over socket end `sock`: its pid and
 * pidfd, or -1 (then it is fork+exec'd). */
static int fs_spawn(struct ds_py *py, struct ds_pyw *w, int sock, pid_t *pid,
                    int *pidfd)
{
    struct dh_err e = {0};
    char args[128];
    int fds[DH_FS_FDS] = {sock, dh_arena_fd(py->env->arena), 1, 2};

    snprintf(args, sizeof(args), "%u %u %llu %d %u", w->id, py->n,
             (unsigned long long)py->seed, py->env->alloc_timeout_ms,
             py->env->server_id);
    if (dh__fs_fork(py->fs, args, fds, pid, pidfd, PY_FORK_ANSWER_MS, &e) < 0) {
        fs_lost(py, e.msg);
        return -1;
    }
    fs_poll(py, 0);
    return 0;
}

static void spawn(struct ds_py *py, struct ds_pyw *w)
{
    int sv[2], pidfd = -1;
    char id[16], nw[16], seed[24], at[16], sid[16];
    char *argv[] = {py->python,
                    "-m",
                    "datahelix._worker",
                    "--fd",
                    "3",
                    "--arena-fd",
                    "4",
                    "--dataset",
                    py->dataset,
                    "--worker-id",
                    id,
                    "--num-workers",
                    nw,
                    "--seed",
                    seed,
                    "--alloc-timeout-ms",
                    at,
                    "--server-id",
                    sid,
                    NULL};
    pid_t parent = getpid(), pid;

    snprintf(id, sizeof(id), "%u", w->id);
    snprintf(nw, sizeof(nw), "%u", py->n);
    snprintf(seed, sizeof(seed), "%llu", (unsigned long long)py->seed);
    snprintf(at, sizeof(at), "%d", py->env->alloc_timeout_ms);
    snprintf(sid, sizeof(sid), "%u", py->env->server_id);
    w->st = PYW_EMPTY;
    w->respawn_ms = dh__mono_ms() + PY_RESPAWN_MS;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        dh__log(DH_LOG_ERROR,
                "dataserver %u: python worker %u: "
                "socketpair: %s",
                py->env->server_id, w->id, strerror(errno));
        return;
    }
    if (!py->fs || fs_spawn(py, w, sv[1], &pid, &pidfd) < 0) {
        pid = fork();
        if (pid == 0)
            child_exec(sv[1], dh_arena_fd(py->env->arena), parent, argv,
                       py->envp);
    }
    close(sv[1]);
    if (pid < 0) {
        dh__log(DH_LOG_ERROR,
                "dataserver %u: python worker %u: "
                "fork: %s",
                py->env->server_id, w->id, strerror(errno));
        close(sv[0]);
        if (++py->start_fails >= PY_MAX_START_FAILS)
            set_broken(py, "python workers cannot be started: fork failed");
        return;
    }
    if (fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK) < 0) {
        /* reads use MSG_DONTWAIT anyway */
    }
    *w = (struct ds_pyw){.st = PYW_STARTING,
                         .id = w->id,
                         .pid = pid,
                         .fd = sv[0],
                         .pidfd = pidfd,
                         .sample = PY_NO_SAMPLE,
                         .deadline_ms = dh__mono_ms() + PY_START_TIMEOUT_MS};
}

/* The worker stops counting as alive: its socket closes, it is reaped
 * (finish_dead) once it has exited.  `why`: what we did to it. */
static void mark_dying(struct ds_pyw *w, const char *why)
{
    if (w->fd >= 0)
        close(w->fd);
    w->fd = -1;
    w->was_ready = w->st != PYW_STARTING;
    w->st = PYW_DYING;
    w->deadline_ms = dh__mono_ms() + PY_REAP_MS;
    if (why && !w->why[0])
        snprintf(w->why, sizeof(w->why), "%s", why);
}

static void kill_worker(struct ds_pyw *w, const char *why)
{
    if (w->pid > 0 && !w->killed) {
        dh__proc_signal(w->pidfd, w->pid, SIGKILL);
        w->killed = 1;
    }
    mark_dying(w, why);
}

static void describe(int status, char *out, size_t n)
{
    if (WIFSIGNALED(status))
        snprintf(out, n, "was killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else if (WIFEXITED(status))
        snprintf(out, n, "exited with status %d", WEXITSTATUS(status));
    else
        snprintf(out, n, "ended (status 0x%x)", status);
}

/* The first dataset index of a job (its ids[0] is the header). */
static uint64_t first_index(const struct ds_job *j)
{
    return j->n > 1 && (j->ids[0] & PY_HDR_BIT) ? j->ids[1] : j->ids[0];
}

/* The job ends with an ErrorNotice (the core frees it). */
static void job_fail(struct ds_py *py, struct ds_job *j, uint64_t sample,
                     int code, const char *msg)
{
    struct ds_done d = {.kind = DS_DONE_ERROR,
                        .job = j,
                        .task = j->task,
                        .code = code,
                        .msg = msg,
                        .latency_ms = -1,
                        .sample = sample == PY_NO_SAMPLE ? first_index(j)
                                                         : sample};

    py->sink.done(py->sink.arg, &d);
}

static void set_broken(struct ds_py *py, const char *why)
{

    if (py->broken)
        return;
    py->broken = 1;
    snprintf(py->broken_msg, sizeof(py->broken_msg), "%s", why);
    dh__log(DH_LOG_ERROR, "dataserver %u: %s", py->env->server_id,
            py->broken_msg);
    while (py->q_len) {
        struct ds_job *j = py->q[py->q_head];

        py->q_head = (py->q_head + 1) % py->q_cap;
        py->q_len--;
        job_fail(py, j, PY_NO_SAMPLE, DH_EIO, py->broken_msg);
    }
}

/* A DYING worker has exited (status) or will not be waited for any more:
 * its job fails, its slot goes back, a new one starts. */
static void finish_dead(struct ds_py *py, struct ds_pyw *w, int status,
                        int reaped)
{
    char how[160], msg[512];

    if (w->why[0])
        snprintf(how, sizeof(how), "%s", w->why);
    else if (reaped)
        describe(status, how, sizeof(how));
    else
        snprintf(how, sizeof(how), "went away");
    if (w->has_slot)
        dh__ds_release(py->env, &w->slot);
    if (w->job && !w->timed_out && w->job->retries < PY_JOB_RETRIES &&
        py->q_len < py->q_cap) {
        /* Ahead of the queue, for the next worker ready. */
        w->job->retries++;
        py->q_head = (py->q_head + py->q_cap - 1) % py->q_cap;
        py->q[py->q_head] = w->job;
        py->q_len++;
        dh__log(DH_LOG_WARN,
                "dataserver %u: python worker %u (pid %d) %s "
                "while loading task %llu; the task runs again on a new "
                "worker (retry %u of %d)",
                py->env->server_id, w->id, (int)w->pid, how,
                (unsigned long long)w->job->task.id, w->job->retries,
                PY_JOB_RETRIES);
    } else if (w->job) {
        snprintf(msg, sizeof(msg),
                 "python worker %u (pid %d) %s while "
                 "loading %s (task %llu); a new worker takes its place",
                 w->id, (int)w->pid, how,
                 w->sample == PY_NO_SAMPLE ? "its batch" : "this sample",
                 (unsigned long long)w->job->task.id);
        job_fail(py, w->job, w->sample, w->timed_out ? DH_ETIMEOUT : DH_EIO,
                 msg);
    } else if (w->was_ready) {
        dh__log(DH_LOG_WARN,
                "dataserver %u: idle python worker %u "
                "(pid %d) %s",
                py->env->server_id, w->id, (int)w->pid, how);
    } else if (!py->broken) {
        dh__log(DH_LOG_WARN,
                "dataserver %u: python worker %u (pid "
                "%d) %s before it was ready",
                py->env->server_id, w->id, (int)w->pid, how);
        if (++py->start_fails >= PY_MAX_START_FAILS) {
            snprintf(msg, sizeof(msg),
                     "python workers (%s) failed to start "
                     "%u times in a row; the last %s",
                     py->python, py->start_fails, how);
            set_broken(py, msg);
        }
    }
    if (w->pidfd >= 0)
        close(w->pidfd);
    *w = (struct ds_pyw){
        .st = PYW_EMPTY, .id = w->id, .pid = -1, .fd = -1, .pidfd = -1};
    if (!py->broken)
        spawn(py, w);
}

/* A worker of the fork server: its exit notice, or (the fork server
 * gone) its pidfd says it has exited. */
static int reap_forked(struct ds_py *py, struct ds_pyw *w)
{
    fs_poll(py, 1);
    if (w->exited) {
        finish_dead(py, w, w->exit_status, 1);
        return 1;
    }
    if (!py->fs && dh__pidfd_exited(w->pidfd)) {
        finish_dead(py, w, 0, 0);
        return 1;
    }
    return 0;
}

static void reap(struct ds_py *py, struct ds_pyw *w, uint64_t now)
{
    int status = 0;
    pid_t r;

    if (w->pidfd >= 0) {
        if (reap_forked(py, w))
            return;
    } else if ((r = waitpid(w->pid, &status, WNOHANG)) == w->pid ||
               (r < 0 && errno == ECHILD)) {
        finish_dead(py, w, status, r == w->pid);
        return;
    }
    if (now < w->deadline_ms)
        return;
    if (!w->killed) { /* EOF but still running: it will not be used */
        dh__proc_signal(w->pidfd, w->pid, SIGKILL);
        w->killed = 1;
        w->deadline_ms = now + PY_REAP_MS;
        return;
    }
    dh__log(DH_LOG_WARN,
            "dataserver %u: python worker %u (pid %d) "
            "did not exit %d ms after SIGKILL; no longer waited for",
            py->env->server_id, w->id, (int)w->pid, PY_REAP_MS);
    finish_dead(py, w, 0, 0);
}

/* ---- jobs ---- */

static int send_job(struct ds_pyw *w, const struct ds_job *j, struct dh_err *e)
{
    static unsigned char buf[16 + 8 * PY_IDS_PER_MSG];
    uint32_t at = 0;
    int rc;

    do {
        uint32_t k = j->n - at > PY_IDS_PER_MSG ? PY_IDS_PER_MSG : j->n - at;
        size_t h;

        if (at == 0) {
            memcpy(buf, "DHPJ", 4);
            dh__put_le32(buf + 4, j->n);
            dh__put_le64(buf + 8, j->task.id);
            h = 16;
        } else {
            memcpy(buf, "DHPC", 4);
            dh__put_le32(buf + 4, k);
            h = 8;
        }
        for (uint32_t i = 0; i < k; i++)
            dh__put_le64(buf + h + 8 * i, j->ids[at + i]);
        if ((rc = dh__fd_send(w->fd, -1, buf, h + 8 * (size_t)k, e)) < 0)
            return rc;
        at += k;
    } while (at < j->n);
    return 0;
}

static int py_submit(struct ds_exec *x, struct ds_job *j, struct dh_err *e)
{
    struct ds_py *py = (struct ds_py *)x;

    (void)e; /* never refused: a job that cannot run ends as an ERROR */

    if (py->broken) {
        job_fail(py, j, PY_NO_SAMPLE, DH_EIO, py->broken_msg);
        return 0;
    }
    if (py->q_len == py->q_cap) { /* cannot happen: q_cap = n_jobs */
        job_fail(py, j, PY_NO_SAMPLE, DH_ETOOBIG, "python job queue full");
        return 0;
    }
    py->q[(py->q_head + py->q_len) % py->q_cap] = j;
    py->q_len++;
    return 0;
}

/* The worker a job is pinned to, or -1 (any worker).  An IterableDataset
 * step's second id is a stream marker (bit 63 too: no map-style index has
 * it) whose bits 32..37 name the worker whose stream it reads (the
 * loader's round robin, datahelix._worker): its batches exist only there. */
static int pinned_worker(const struct ds_job *j)
{
    if (j->n >= 2 && (j->ids[0] & PY_HDR_BIT) && (j->ids[1] & PY_HDR_BIT))
        return (int)((j->ids[1] >> 32) & 63);
    return -1;
}

/* Takes the queued job at ring position `k` out of the queue. */
static struct ds_job *q_take(struct ds_py *py, size_t k)
{
    struct ds_job *j = py->q[(py->q_head + k) % py->q_cap];

    for (size_t i = k; i > 0; i--) /* the jobs ahead move up one place */
        py->q[(py->q_head + i) % py->q_cap] =
            py->q[(py->q_head + i - 1) % py->q_cap];
    py->q_head = (py->q_head + 1) % py->q_cap;
    py->q_len--;
    return j;
}

/* The first queued job worker `w` may run (FIFO among those), or -1. */
static long q_find(const struct ds_py *py, unsigned w)
{
    for (size_t k = 0; k < py->q_len; k++) {
        int p = pinned_worker(py->q[(py->q_head + k) % py->q_cap]);

        if (p < 0 || (unsigned)p == w)
            return (long)k;
    }
    return -1;
}

static void dispatch(struct ds_py *py)
{
    struct dh_err e;

    /* A step pinned to a worker this server does not run fails at once. */
    for (size_t k = 0; k < py->q_len;) {
        struct ds_job *j = py->q[(py->q_head + k) % py->q_cap];
        int p = pinned_worker(j);

        if (p >= 0 && (unsigned)p >= py->n) {
            q_take(py, k);
            job_fail(py, j, PY_NO_SAMPLE, DH_EINVAL,
                     "a step pinned to a python worker this server does "
                     "not run (--python-workers is fewer)");
            continue;
        }
        k++;
    }
    for (unsigned i = 0; i < py->n && py->q_len; i++) {
        struct ds_pyw *w = &py->w[i];
        struct ds_job *j;
        long k;

        if (w->st != PYW_IDLE || (k = q_find(py, i)) < 0)
            continue;
        j = q_take(py, (size_t)k);
        if (send_job(w, j, &e) < 0) {
            /* The worker is going away: the job goes back to the front. */
            py->q_head = (py->q_head + py->q_cap - 1) % py->q_cap;
            py->q[py->q_head] = j;
            py->q_len++;
            kill_worker(w, NULL);
            continue;
        }
        w->st = PYW_BUSY;
        w->job = j;
        w->sample = PY_NO_SAMPLE;
        w->has_slot = 0;
        w->deadline_ms = dh__mono_ms() + (uint64_t)py->job_timeout_ms;
    }
}

/* Done: the slot's reference passes to the core (and the client) as one
 * uint8 tensor of the slot's bytes (the worker's own layout inside). */
static void job_done(struct ds_py *py, struct ds_job *j,
                     const struct dh_slot_ref *ref)
{
    uint32_t skip = j->n > 1 && (j->ids[0] & PY_HDR_BIT) ? 1 : 0;
    uint32_t n = j->n - skip, *valid = dh__calloc(n + 1, sizeof(*valid));
    struct ds_done d = {
        .kind = DS_DONE_RESULT, .job = j, .task = j->task, .latency_ms = -1};
    struct dh_err e;

    if (!valid || ref->len == 0 || ref->len > (UINT64_C(1) << 32)) {
        if (!valid)
            dh_err_set(&e, DH_ENOMEM, "out of memory");
        else
            dh_err_set(&e, DH_ETOOBIG,
                       "python batch of %llu bytes: over "
                       "the 4 GiB a notice can describe",
                       (unsigned long long)ref->len);
        dh__free(valid);
        dh__ds_release(py->env, ref);
        job_fail(py, j, PY_NO_SAMPLE, e.code, e.msg);
        return;
    }
    d.res = (struct ds_result){.slot = *ref,
                               .ndims = 1,
                               .dims = {ref->len},
                               .dtype = DH_DTYPE_U8,
                               .layout = DH_LAYOUT_THWC,
                               .ids = j->ids + skip,
                               .valid = valid,
                               .n = n};
    py->sink.done(py->sink.arg, &d);
    dh__free(valid);
}

/* ---- worker messages ---- */

static void protocol_error(struct ds_py *py, struct ds_pyw *w, const char *what)
{
    char why[160];

    dh__log(DH_LOG_WARN,
            "dataserver %u: python worker %u (pid %d): "
            "%s; killed",
            py->env->server_id, w->id, (int)w->pid, what);
    snprintf(why, sizeof(why),
             "broke the worker protocol (%s) and was "
             "killed",
             what);
    kill_worker(w, why);
}

/* The worker's job, if `task` names it; else a protocol error. */
static struct ds_job *own_job(struct ds_py *py, struct ds_pyw *w, uint64_t task)
{
    if (w->st == PYW_BUSY && w->job && w->job->task.id == task)
        return w->job;
    protocol_error(py, w, "a message for a task it does not run");
    return NULL;
}

static void on_msg(struct ds_py *py, struct ds_pyw *w, const unsigned char *m,
                   size_t n)
{
    struct dh_slot_ref ref;
    struct ds_job *j;
    char text[DH_WIRE_MAX_TEXT];

    if (n >= 8 && !memcmp(m, "DHPR", 4) && w->st == PYW_STARTING) {
        w->st = PYW_IDLE;
        py->start_fails = 0;
    } else if (n >= 4 && !memcmp(m, "DHPF", 4)) {
        snprintf(text, sizeof(text),
                 "python workers cannot load the "
                 "dataset: %.*s",
                 (int)(n - 4), (const char *)m + 4);
        set_broken(py, text);
        kill_worker(w, "could not load the dataset");
    } else if (n == 20 && !memcmp(m, "DHPS", 4)) {
        if (own_job(py, w, dh__get_le64(m + 4)))
            w->sample = dh__get_le64(m + 12);
    } else if (n == 12 + DH_SLOT_REF_BYTES && !memcmp(m, "DHPA", 4)) {
        if (own_job(py, w, dh__get_le64(m + 4))) {
            dh_slot_ref_unpack(m + 12, &w->slot);
            w->has_slot = 1;
        }
    } else if (n == 12 + DH_SLOT_REF_BYTES && !memcmp(m, "DHPD", 4)) {
        if ((j = own_job(py, w, dh__get_le64(m + 4)))) {
            dh_slot_ref_unpack(m + 12, &ref);
            w->job = NULL;
            w->has_slot = 0;
            w->st = PYW_IDLE;
            job_done(py, j, &ref);
        }
    } else if (n >= 24 && !memcmp(m, "DHPE", 4)) {
        if ((j = own_job(py, w, dh__get_le64(m + 4)))) {
            int code = (int)dh__get_le32(m + 20);

            if (code >= 0 || code < DH_EPEERDEAD)
                code = DH_EIO;
            snprintf(text, sizeof(text), "%.*s", (int)(n - 24),
                     (const char *)m + 24);
            if (w->has_slot) /* it should have released it */
                dh__ds_release(py->env, &w->slot);
            w->job = NULL;
            w->has_slot = 0;
            w->st = PYW_IDLE;
            job_fail(py, j, dh__get_le64(m + 12), code, text);
        }
    } else {
        protocol_error(py, w, "an unknown or malformed message");
    }
}

static void read_worker(struct ds_py *py, struct ds_pyw *w)
{
    static unsigned char buf[PY_MSG_MAX];

    for (int i = 0; i < DS_BURST && w->fd >= 0; i++) {
        ssize_t n = recv(w->fd, buf, sizeof(buf), MSG_DONTWAIT);

        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) { /* EOF, or the socket failed: it is gone */
            mark_dying(w, NULL);
            return;
        }
        on_msg(py, w, buf, (size_t)n);
    }
}

static void py_drain(struct ds_exec *x)
{
    struct ds_py *py = (struct ds_py *)x;
    uint64_t now = dh__mono_ms();
    char why[160];

    /* Every turn: a notice nobody waits for (a worker no longer waited
     * for), or the fork server's EOF, must not keep the poll awake. */
    fs_poll(py, 1);
    for (unsigned i = 0; i < py->n; i++) {
        struct ds_pyw *w = &py->w[i];

        if (w->fd >= 0)
            read_worker(py, w);
        if (w->st == PYW_BUSY && now >= w->deadline_ms) {
            snprintf(why, sizeof(why),
                     "was still busy after %d ms "
                     "(python job timeout) and was killed",
                     py->job_timeout_ms);
            w->timed_out = 1;
            kill_worker(w, why);
        } else if (w->st == PYW_STARTING && now >= w->deadline_ms) {
            snprintf(why, sizeof(why),
                     "was not ready after %d ms and was "
                     "killed",
                     PY_START_TIMEOUT_MS);
            kill_worker(w, why);
        }
        if (w->st == PYW_DYING)
            reap(py, w, now);
        else if (w->st == PYW_EMPTY && !py->broken && now >= w->respawn_ms)
            spawn(py, w);
    }
    if (!py->broken)
        dispatch(py);
}

static void py_load(struct ds_exec *x, uint64_t *queued, uint64_t *busy)
{
    const struct ds_py *py = (const struct ds_py *)x;

    *queued = py->q_len;
    *busy = 0;
    for (unsigned i = 0; i < py->n; i++)
        *busy += py->w[i].job != NULL;
}

static int py_pollitems(struct ds_exec *x, zmq_pollitem_t *it, int cap)
{
    const struct ds_py *py = (const struct ds_py *)x;
    int n = 0;

    for (unsigned i = 0; i < py->n && n < cap; i++)
        if (py->w[i].fd >= 0)
            it[n++] = (zmq_pollitem_t){.fd = py->w[i].fd, .events = ZMQ_POLLIN};
    if (py->fs && n < cap) /* an exit notice */
        it[n++] = (zmq_pollitem_t){.fd = dh__fs_fd(py->fs),
                                   .events = ZMQ_POLLIN};
    return n;
}

/* ---- create / destroy ---- */

static int check_dataset_file(const char *path, struct dh_err *e)
{
    if (access(path, R_OK) < 0)
        return dh_err_set(e, errno == ENOENT ? DH_ENOTFOUND : DH_EIO,
                          "dataserver: python dataset %s: %s", path,
                          strerror(errno));
    return 0;
}

static const struct ds_exec_ops py_ops;

static int py_init(struct ds_py *py, const struct dh_dataserver_opts *o,
                   struct dh_err *e)
{
    if (!(py->python = find_program(o->python ? o->python : "python3")))
        return dh_err_set(e, DH_ENOTFOUND,
                          "dataserver: python interpreter "
                          "'%s' not found or not executable",
                          o->python ? o->python : "python3");
    if (!(py->dataset = dh__strdup(o->python_dataset)) ||
        !(py->index = dh__strdup(o->index_path)) ||
        !(py->w = dh__calloc(py->n, sizeof(*py->w))) ||
        !(py->q = dh__calloc(py->q_cap, sizeof(*py->q))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    for (unsigned i = 0; i < py->n; i++)
        py->w[i] = (struct ds_pyw){.id = i, .pid = -1, .fd = -1, .pidfd = -1};
    return build_env(py, o->python_path, e);
}

int dh__ds_py_create(const struct ds_env *env,
                     const struct dh_dataserver_opts *o, size_t max_jobs,
                     struct ds_sink sink, struct ds_exec **out,
                     struct dh_err *e)
{
    struct ds_py *py;
    int rc;

    if (o->python_workers < 1 || o->python_workers > PY_MAX_WORKERS ||
        o->python_job_timeout_ms < 1)
        return dh_err_set(e, DH_EINVAL,
                          "dataserver: --python-workers %u "
                          "(1..%d) or --python-job-timeout-ms %d out of "
                          "range",
                          o->python_workers, PY_MAX_WORKERS,
                          o->python_job_timeout_ms);
    if ((rc = check_dataset_file(o->python_dataset, e)) < 0)
        return rc;
    if (!(py = dh__calloc(1, sizeof(*py))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    py->x.ops = &py_ops;
    py->env = env;
    py->sink = sink;
    py->n = o->python_workers;
    py->job_timeout_ms = o->python_job_timeout_ms;
    py->seed = o->python_seed;
    py->unlink_files = o->python_unlink;
    py->q_cap = max_jobs;
    if ((rc = py_init(py, o, e)) < 0) {
        py_ops.destroy(&py->x);
        return rc;
    }
    if (o->python_forkserver &&
        dh__fs_connect(o->python_forkserver, &py->fs, e) < 0) {
        dh__log(DH_LOG_WARN,
                "dataserver %u: %s; python workers start as fresh "
                "interpreters",
                env->server_id, e->msg);
        *e = (struct dh_err){0};
    }
    for (unsigned i = 0; i < py->n; i++)
        spawn(py, &py->w[i]);
    *out = &py->x;
    return 0;
}

/* Waits (polling) until every worker in `alive` has exited or `ms` pass;
 * returns how many are left. */
static unsigned wait_all(struct ds_py *py, int ms)
{
    uint64_t end = dh__mono_ms() + (uint64_t)ms;
    unsigned left;

    for (;;) {
        left = 0;
        for (unsigned i = 0; i < py->n; i++) {
            struct ds_pyw *w = &py->w[i];
            pid_t r;

            if (w->pid <= 0)
                continue;
            if (w->pidfd >= 0) /* the fork server reaps it */
                r = dh__pidfd_exited(w->pidfd) ? w->pid : 0;
            else
                r = waitpid(w->pid, NULL, WNOHANG);
            if (r == w->pid || (r < 0 && errno == ECHILD))
                w->pid = -1;
            else
                left++;
        }
        if (!left || dh__mono_ms() >= end)
            return left;
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
}

/* The dataset file (and the index beside it, and their folder when it is
 * empty then) once the client that wrote them is gone. */
static void unlink_files(const struct ds_py *py)
{
    const char *slash = strrchr(py->dataset, '/');
    size_t dir = slash ? (size_t)(slash - py->dataset) : 0;
    char d[4096];

    unlink(py->dataset);
    if (py->index && dir && !strncmp(py->index, py->dataset, dir + 1) &&
        !strchr(py->index + dir + 1, '/'))
        unlink(py->index);
    if (dir && dir < sizeof(d)) {
        memcpy(d, py->dataset, dir);
        d[dir] = 0;
        rmdir(d); /* fails, harmlessly, if something else is in it */
    }
}

static void py_destroy(struct ds_exec *x)
{
    struct ds_py *py = (struct ds_py *)x;

    if (!py)
        return;
    for (unsigned i = 0; py->w && i < py->n; i++)
        if (py->w[i].fd >= 0) { /* EOF: an idle worker exits */
            close(py->w[i].fd);
            py->w[i].fd = -1;
        }
    if (py->w && wait_all(py, PY_STOP_GRACE_MS)) {
        for (unsigned i = 0; i < py->n; i++)
            if (py->w[i].pid > 0)
                dh__proc_signal(py->w[i].pidfd, py->w[i].pid, SIGKILL);
        if (wait_all(py, PY_REAP_MS))
            dh__log(DH_LOG_WARN,
                    "dataserver %u: a python worker did "
                    "not exit after SIGKILL",
                    py->env->server_id);
    }
    for (unsigned i = 0; py->w && i < py->n; i++) {
        if (py->w[i].has_slot)
            dh__ds_release(py->env, &py->w[i].slot);
        if (py->w[i].pidfd >= 0)
            close(py->w[i].pidfd);
    }
    dh__fs_close(py->fs);
    if (py->unlink_files && py->env->client_gone && py->dataset)
        unlink_files(py);
    dh__free(py->python);
    dh__free(py->dataset);
    dh__free(py->index);
    dh__free(py->pythonpath_env);
    dh__free(py->envp);
    dh__free(py->w);
    dh__free(py->q);
    dh__free(py);
}

static const struct ds_exec_ops py_ops = {
    .name = "python",
    /* Not implemented: a Python dataset's sample is not substituted (its
     * job fails as before); DistributedDataLoader sends no spares. */
    .spares = 0,
    .submit = py_submit,
    .drain = py_drain,
    .pollitems = py_pollitems,
    .load = py_load,
    .destroy = py_destroy,
};
