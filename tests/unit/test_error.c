/* test_error.c - dh_strerror table and dh_err buffer behaviour. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "datahelix/error.h"

static void strerror_covers_every_code(void **state)
{
    (void)state;
    assert_string_equal(dh_strerror(DH_OK), "success");
    assert_string_equal(dh_strerror(DH_ENOMEM), "out of memory");
    assert_string_equal(dh_strerror(DH_ECHECKSUM), "checksum mismatch");
    assert_string_equal(dh_strerror(-9999), "unknown error");
    for (int c = -1; c >= DH_EUNSUPPORTED; c--)
        assert_string_not_equal(dh_strerror(c), "unknown error");
}

static void err_set_formats_and_truncates(void **state)
{
    struct dh_err e;
    char big[2 * DH_ERR_MSG_MAX];

    (void)state;
    dh_err_clear(&e);
    assert_int_equal(dh_err_set(&e, DH_EIO, "%s:%d: %s", "f.jsonl", 7, "bad"),
                     DH_EIO);
    assert_int_equal(e.code, DH_EIO);
    assert_string_equal(e.msg, "f.jsonl:7: bad");
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    dh_err_set(&e, DH_EINVAL, "%s", big);
    assert_int_equal(strlen(e.msg), DH_ERR_MSG_MAX - 1);
    assert_int_equal(dh_err_set(NULL, DH_EIO, "ignored"), DH_EIO);
    dh_err_clear(&e);
    assert_int_equal(e.code, 0);
    assert_string_equal(e.msg, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(strerror_covers_every_code),
        cmocka_unit_test(err_set_formats_and_truncates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
