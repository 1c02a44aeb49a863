/* test_peer_cred.c - the local link's peer-credential rule (peer_cred.h):
 * fabricated credentials for the uids this machine cannot give a test
 * (another user), and the kernel's own answer for a real connection. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime/local_link.h"
#include "runtime/peer_cred.h"

static void same_uid_is_admitted_another_is_not(void **state)
{
    struct dh_peer_cred me = {.pid = 4242, .uid = 1000, .gid = 1000};
    struct dh_peer_cred other = {.pid = 4243, .uid = 1001, .gid = 1000};
    struct dh_peer_cred root = {.pid = 1, .uid = 0, .gid = 0};
    struct dh_err e;

    (void)state;
    assert_int_equal(dh__peer_check(&me, 1000, 0, "a client", &e), 0);
    assert_int_equal(dh__peer_check(&other, 1000, 0, "a client", &e),
                     DH_EINVAL);
    assert_string_equal(e.msg, "a client pid 4243 of uid 1001 refused: only "
                               "processes of uid 1000 may use this link");
    /* No exception for root: it is another uid like any other. */
    assert_int_equal(dh__peer_check(&root, 1000, 0, "a client", &e), DH_EINVAL);
    assert_int_equal(dh__peer_check(&root, 0, 0, "a client", &e), 0);
}

static void a_named_pid_is_the_only_one_admitted(void **state)
{
    struct dh_peer_cred it = {.pid = 777, .uid = 1000};
    struct dh_peer_cred sibling = {.pid = 778, .uid = 1000};
    struct dh_peer_cred launcher = {.pid = 777, .uid = 2000};
    struct dh_err e;

    (void)state;
    assert_int_equal(dh__peer_check(&it, 1000, 777, "a client", &e), 0);
    /* Same user, wrong process: refused. */
    assert_int_equal(dh__peer_check(&sibling, 1000, 777, "a client", &e),
                     DH_EINVAL);
    assert_non_null(strstr(e.msg, "pid 778 (uid 1000) refused: this link "
                                  "serves pid 777 only"));
    /* The named pid, whatever its uid (the one who started us named it). */
    assert_int_equal(dh__peer_check(&launcher, 1000, 777, "a client", &e), 0);
}

static void the_kernel_names_the_real_peer(void **state)
{
    char name[64];
    struct dh_peer_cred pc;
    struct dh_err e;
    int lfd, cfd, afd;

    (void)state;
    snprintf(name, sizeof(name), "dh-test-peercred-%d", (int)getpid());
    lfd = dh__link_listen(name, &e);
    assert_true(lfd >= 0);
    cfd = dh__link_connect(name, &e);
    assert_true(cfd >= 0);
    afd = accept(lfd, NULL, NULL);
    assert_true(afd >= 0);
    /* Both ends see this process. */
    assert_int_equal(dh__peer_cred(afd, &pc, &e), 0);
    assert_int_equal(pc.pid, getpid());
    assert_int_equal(pc.uid, getuid());
    assert_int_equal(dh__peer_cred(cfd, &pc, &e), 0);
    assert_int_equal(pc.pid, getpid());
    assert_int_equal(dh__peer_check(&pc, getuid(), 0, "x", &e), 0);
    assert_int_equal(dh__peer_check(&pc, getuid(), getpid(), "x", &e), 0);
    assert_int_equal(dh__peer_check(&pc, getuid(), getpid() + 1, "x", &e),
                     DH_EINVAL);
    close(afd);
    close(cfd);
    close(lfd);
    /* Not a socket: a clear error, not garbage credentials. */
    assert_int_equal(dh__peer_cred(999, &pc, &e), DH_EIO);
    assert_non_null(strstr(e.msg, "SO_PEERCRED"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(same_uid_is_admitted_another_is_not),
        cmocka_unit_test(a_named_pid_is_the_only_one_admitted),
        cmocka_unit_test(the_kernel_names_the_real_peer),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
