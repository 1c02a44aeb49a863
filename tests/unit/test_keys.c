/* test_keys.c - the job key file (src/runtime/keys.h) and the ZAP log's
 * rate limit (src/runtime/zap.h):
 *   - a generated key round-trips through the file format; every malformed
 *     file (bad Z85, a secret of another pair, a missing line, an unknown
 *     name, too many admin keys) is refused naming the file and the line;
 *   - load refuses a file group or others can read (the message names the
 *     file and its mode), a symlink and a non-regular file; write leaves
 *     mode 0600 whatever the umask, atomically, and does not replace a file
 *     unless asked;
 *   - --keyfile wins over $DATAHELIX_KEYFILE, an empty one means none;
 *   - the rate limit lets a burst through per window and reports what it
 *     left out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime/keys.h"
#include "runtime/zap.h"

static char dir[512];

static int setup(void **state)
{
    const char *t = getenv("DH_TEST_TMP");

    (void)state;
    snprintf(dir, sizeof(dir), "%s/keys-%ld", t ? t : "/tmp", (long)getpid());
    return mkdir(dir, 0700);
}

/* The files the tests leave: the key, the link, the env key. */
static int teardown(void **state)
{
    static const char *const left[] = {"job.key", "link.key", "env.key"};
    char p[600];

    (void)state;
    for (size_t i = 0; i < sizeof(left) / sizeof(left[0]); i++) {
        snprintf(p, sizeof(p), "%s/%s", dir, left[i]);
        unlink(p);
    }
    return rmdir(dir);
}

static void path_of(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", dir, name);
}

static void test_roundtrip(void **state)
{
    struct dh_keys k, back;
    char buf[DH_KEY_MAX_FILE];
    struct dh_err e;
    size_t n;

    (void)state;
    assert_int_equal(dh__keys_generate(&k, &e), 0);
    assert_int_equal(strlen(k.pub), DH_KEY_Z85_LEN);
    k.n_admin = 1;
    assert_int_equal(dh__keys_generate(&back, &e), 0);
    memcpy(k.admin[0], back.pub, sizeof(back.pub));
    n = dh__keys_format(&k, buf, sizeof(buf));
    assert_non_null(strstr(buf, "public-key = "));
    assert_int_equal(dh__keys_parse(buf, n, "f", &back, &e), 0);
    assert_string_equal(back.pub, k.pub);
    assert_string_equal(back.sec, k.sec);
    assert_int_equal(back.n_admin, 1);
    assert_string_equal(back.admin[0], k.admin[0]);
    assert_string_equal(dh__keys_server(&back), k.pub);
    dh__keys_wipe(&back);
    assert_int_equal(back.sec[0], 0);
}

static void expect_bad(const char *text, const char *what)
{
    struct dh_keys k;
    struct dh_err e;

    assert_int_equal(dh__keys_parse(text, strlen(text), "K.key", &k, &e),
                     DH_EINVAL);
    assert_non_null(strstr(e.msg, "K.key"));
    if (!strstr(e.msg, what))
        fail_msg("'%s' not in '%s'", what, e.msg);
    assert_int_equal(k.sec[0], 0); /* nothing half-parsed is left */
}

static void test_malformed(void **state)
{
    struct dh_keys a, b;
    char text[1024];
    struct dh_err e;

    (void)state;
    assert_int_equal(dh__keys_generate(&a, &e), 0);
    assert_int_equal(dh__keys_generate(&b, &e), 0);
    snprintf(text, sizeof(text), "public-key = %s\nsecret-key = %s\n", a.pub,
             b.sec);
    expect_bad(text, "does not belong");
    snprintf(text, sizeof(text), "public-key = %s\n", a.pub);
    expect_bad(text, "no secret-key");
    snprintf(text, sizeof(text), "secret-key = %s\n", a.sec);
    expect_bad(text, "no public-key");
    snprintf(text, sizeof(text), "# c\n\npublic-key = %.39s\n", a.pub);
    expect_bad(text, "line 3");
    snprintf(text, sizeof(text), "public-key = %s%s\n", a.pub, "x");
    expect_bad(text, "Z85");
    snprintf(text, sizeof(text), "password = %s\n", a.pub);
    expect_bad(text, "unknown name");
    expect_bad("just words\n", "name = value");
    text[0] = 0;
    for (int i = 0; i <= DH_KEY_MAX_ADMIN; i++)
        snprintf(text + strlen(text), sizeof(text) - strlen(text),
                 "admin-key = %s\n", a.pub);
    expect_bad(text, "admin keys");
    /* spaces, CRLF and comments are fine */
    snprintf(text, sizeof(text),
             "  # job\r\npublic-key=%s\r\n\tsecret-key =  %s\n", a.pub, a.sec);
    assert_int_equal(dh__keys_parse(text, strlen(text), "f", &b, &e), 0);
    assert_string_equal(b.pub, a.pub);
}

static void test_load_modes(void **state)
{
    char p[600], q[600];
    struct dh_keys k, got;
    struct dh_err e;
    struct stat st;
    mode_t old;

    (void)state;
    path_of(p, sizeof(p), "job.key");
    assert_int_equal(dh__keys_generate(&k, &e), 0);
    old = umask(0); /* the file must still come out 0600 */
    assert_int_equal(dh__keys_write(p, &k, 0, &e), 0);
    umask(old);
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(dh__keys_load(p, &got, &e), 0);
    assert_string_equal(got.sec, k.sec);

    assert_int_equal(dh__keys_write(p, &k, 0, &e), DH_EDUP); /* kept */
    assert_non_null(strstr(e.msg, "already exists"));
    assert_int_equal(dh__keys_write(p, &k, 1, &e), 0);

    assert_int_equal(chmod(p, 0644), 0);
    assert_int_equal(dh__keys_load(p, &got, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, p));
    assert_non_null(strstr(e.msg, "mode 0644"));
    assert_int_equal(chmod(p, 0620), 0); /* group-writable: planted */
    assert_int_equal(dh__keys_load(p, &got, &e), DH_EINVAL);
    assert_int_equal(chmod(p, 0400), 0); /* owner read-only is fine */
    assert_int_equal(dh__keys_load(p, &got, &e), 0);

    path_of(q, sizeof(q), "link.key");
    assert_int_equal(symlink(p, q), 0);
    assert_int_equal(dh__keys_load(q, &got, &e), DH_EIO);
    assert_non_null(strstr(e.msg, q));
    assert_int_equal(dh__keys_load(dir, &got, &e), DH_EINVAL); /* a dir */
    path_of(q, sizeof(q), "none.key");
    assert_int_equal(dh__keys_load(q, &got, &e), DH_EIO);
    assert_non_null(strstr(e.msg, "cannot open"));
}

static void test_resolve(void **state)
{
    char p[600];
    struct dh_keys k, got;
    struct dh_err e;
    int have = 7;

    (void)state;
    unsetenv(DH_KEYFILE_ENV);
    assert_null(dh__keys_path(NULL));
    assert_int_equal(dh__keys_resolve(NULL, &got, &have, &e), 0);
    assert_int_equal(have, 0);
    setenv(DH_KEYFILE_ENV, "", 1);
    assert_null(dh__keys_path(NULL));
    setenv(DH_KEYFILE_ENV, "/from/env", 1);
    assert_string_equal(dh__keys_path(NULL), "/from/env");
    assert_string_equal(dh__keys_path("/opt"), "/opt");
    assert_int_equal(dh__keys_resolve(NULL, &got, &have, &e), DH_EIO);
    assert_non_null(strstr(e.msg, "/from/env"));
    path_of(p, sizeof(p), "env.key");
    assert_int_equal(dh__keys_generate(&k, &e), 0);
    assert_int_equal(dh__keys_write(p, &k, 0, &e), 0);
    setenv(DH_KEYFILE_ENV, p, 1);
    assert_int_equal(dh__keys_resolve(NULL, &got, &have, &e), 0);
    assert_int_equal(have, 1);
    assert_string_equal(got.pub, k.pub);
    unsetenv(DH_KEYFILE_ENV);
}

/* Tokens and keys are compared by dh__secret_eq (sodium_memcmp): equal
 * only when every byte and the length agree, wherever they differ. */
static void test_secret_eq(void **state)
{
    char a[] = "0123456789abcdef0123456789abcdef";
    char b[sizeof(a)];

    (void)state;
    memcpy(b, a, sizeof(a));
    assert_true(dh__secret_eq(a, b));
    assert_true(dh__secret_eq("", ""));
    for (size_t i = 0; i < sizeof(a) - 1; i++) {
        b[i] ^= 1;
        assert_false(dh__secret_eq(a, b));
        b[i] ^= 1;
    }
    b[31] = 0; /* a prefix */
    assert_false(dh__secret_eq(a, b));
    assert_false(dh__secret_eq(b, a));
    assert_false(dh__secret_eq(a, ""));
}

/* A payload token: 32 hex digits, the same for the same secret and
 * target, another for another target or secret, none without a secret. */
static void test_payload_token(void **state)
{
    char a[DH_WIRE_TOKEN_LEN + 1], b[DH_WIRE_TOKEN_LEN + 1];
    const char *s1 = "0123456789abcdef0123456789abcdef";
    const char *s2 = "0123456789abcdef0123456789abcdee";

    (void)state;
    dh__payload_token(s1, 3, a);
    assert_int_equal(strlen(a), DH_WIRE_TOKEN_LEN);
    assert_int_equal(strspn(a, "0123456789abcdef"), DH_WIRE_TOKEN_LEN);
    dh__payload_token(s1, 3, b);
    assert_string_equal(a, b);
    dh__payload_token(s1, 4, b);
    assert_string_not_equal(a, b);
    dh__payload_token(s2, 3, b);
    assert_string_not_equal(a, b);
    assert_string_not_equal(a, s1); /* never the secret itself */
    dh__payload_token("", 3, b);
    assert_string_equal(b, "");
    dh__payload_token("abc", 3, b);
    assert_string_equal(b, "");
}

static void test_rate_limit(void **state)
{
    struct dh_zap_rl rl = {0};
    uint64_t skipped = 99, t = 1000000;
    int logged = 0;

    (void)state;
    for (int i = 0; i < 1000; i++)
        logged += dh__zap_rl_allow(&rl, t + (uint64_t)i, &skipped);
    assert_int_equal(logged, DH_ZAP_LOG_BURST);
    assert_int_equal(rl.skipped, 1000 - DH_ZAP_LOG_BURST);
    /* the next window's first line says how many were left out */
    assert_int_equal(dh__zap_rl_allow(&rl, t + DH_ZAP_LOG_WINDOW_MS, &skipped),
                     1);
    assert_int_equal(skipped, 1000 - DH_ZAP_LOG_BURST);
    assert_int_equal(dh__zap_rl_allow(&rl, t + DH_ZAP_LOG_WINDOW_MS, &skipped),
                     1);
    assert_int_equal(skipped, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),     cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_load_modes),    cmocka_unit_test(test_resolve),
        cmocka_unit_test(test_rate_limit),    cmocka_unit_test(test_secret_eq),
        cmocka_unit_test(test_payload_token),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
