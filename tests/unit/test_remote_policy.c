/* test_remote_policy.c - the pure parts of remote reads: what a table path
 * that is a URL names and how messages show it (core/url.h), and when a
 * read is tried again and after how long (core/http_retry.h).  The reads
 * themselves, against real servers, are the integration tests'
 * (test_http_source.py). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/aws_ini.h"
#include "core/http_retry.h"
#include "core/s3_xml.h"
#include "core/url.h"

static void url_kinds(void **state)
{
    (void)state;
    assert_int_equal(dh__url_kind("/data/a.mp4"), DH_URL_NONE);
    assert_int_equal(dh__url_kind("a:b/c.mp4"), DH_URL_NONE);
    assert_int_equal(dh__url_kind("dir/x://y"), DH_URL_NONE);
    assert_int_equal(dh__url_kind("http://h/a"), DH_URL_HTTP);
    assert_int_equal(dh__url_kind("HTTPS://h/a"), DH_URL_HTTPS);
    assert_int_equal(dh__url_kind("s3://bucket/k"), DH_URL_S3);
    assert_int_equal(dh__url_kind("ftp://h/a"), DH_URL_OTHER);
    assert_int_equal(dh__url_kind("://h"), DH_URL_NONE);
}

static void urls_shown_without_credentials_or_query(void **state)
{
    char out[256];

    (void)state;
    assert_true(dh__url_has_userinfo("http://u:p@h/a"));
    assert_false(dh__url_has_userinfo("http://h/a@b"));
    assert_false(dh__url_has_userinfo("http://h?x=u@v"));
    dh__url_redact("http://u:pw@h:8/a/b.mp4?X-Amz-Signature=s#f", out,
                   sizeof(out));
    assert_string_equal(out, "http://h:8/a/b.mp4?...");
    dh__url_redact("https://a@b@h/x", out, sizeof(out));
    assert_string_equal(out, "https://h/x");
    dh__url_redact("https://h/x.mp4", out, sizeof(out));
    assert_string_equal(out, "https://h/x.mp4");
    dh__url_redact("/local/p?x", out, sizeof(out));
    assert_string_equal(out, "/local/p?x");
    dh__url_redact("http://u:pw@h/abcdef", out, 12); /* cut, terminated */
    assert_string_equal(out, "http://h/ab");
    dh__url_path("https://h:1/a/b.mkv?x=1", out, sizeof(out));
    assert_string_equal(out, "/a/b.mkv");
    dh__url_path("https://h", out, sizeof(out));
    assert_string_equal(out, "");
}

static void s3_urls_split(void **state)
{
    char b[64], k[64];

    (void)state;
    assert_int_equal(
        dh__url_s3_split("s3://my-bucket/a/b.tar", b, sizeof(b), k, sizeof(k)),
        0);
    assert_string_equal(b, "my-bucket");
    assert_string_equal(k, "a/b.tar");
    assert_int_equal(dh__url_s3_split("s3://bkt", b, sizeof(b), k, sizeof(k)),
                     0);
    assert_string_equal(k, "");
    assert_int_equal(dh__url_s3_split("s3://ab/k", b, sizeof(b), k, 64), -1);
    assert_int_equal(dh__url_s3_split("s3://Upper/k", b, 64, k, 64), -1);
    assert_int_equal(dh__url_s3_split("http://bkt/k", b, 64, k, 64), -1);
    assert_int_equal(dh__url_s3_split("s3://bkt/long", b, 64, k, 4), -1);
}

static void statuses_worth_another_try(void **state)
{
    (void)state;
    assert_true(dh__http_status_retryable(503));
    assert_true(dh__http_status_retryable(500));
    assert_true(dh__http_status_retryable(429));
    assert_true(dh__http_status_retryable(408));
    assert_false(dh__http_status_retryable(501));
    assert_false(dh__http_status_retryable(505));
    assert_false(dh__http_status_retryable(404));
    assert_false(dh__http_status_retryable(403));
    assert_false(dh__http_status_retryable(416));
    assert_false(dh__http_status_retryable(206));
}

static void backoff_is_jittered_bounded_and_honours_retry_after(void **state)
{
    (void)state;
    /* full jitter: within [0, base * 2^(n-1)], capped */
    assert_int_equal(dh__http_backoff_ms(1, 0, -1), 0);
    assert_int_equal(dh__http_backoff_ms(1, 100, -1), 100);
    assert_int_equal(dh__http_backoff_ms(1, 101, -1), 0);
    assert_int_equal(dh__http_backoff_ms(3, 400, -1), 400);
    assert_int_equal(dh__http_backoff_ms(3, 401, -1), 0);
    for (int a = 1; a < 70; a++)
        for (uint64_t r = 0; r < 3; r++)
            assert_true(dh__http_backoff_ms(a, UINT64_MAX - r, -1) <=
                        DH_HTTP_BACKOFF_CAP_MS);
    assert_int_equal(dh__http_backoff_ms(40, DH_HTTP_BACKOFF_CAP_MS, -1),
                     DH_HTTP_BACKOFF_CAP_MS);
    /* the server's Retry-After wins when longer, bounded */
    assert_int_equal(dh__http_backoff_ms(1, 0, 3000), 3000);
    assert_int_equal(dh__http_backoff_ms(1, 50, 10), 50);
    assert_int_equal(dh__http_backoff_ms(1, 0, 999999),
                     DH_HTTP_RETRY_AFTER_MAX_MS);
    assert_int_equal(dh__http_retry_after_ms(" 3\r\n"), 3000);
    assert_int_equal(dh__http_retry_after_ms("0"), 0);
    assert_int_equal(dh__http_retry_after_ms("Wed, 21 Oct 2015 07:28:00 GMT"),
                     -1);
    assert_int_equal(dh__http_retry_after_ms("-1"), -1);
    assert_int_equal(dh__http_retry_after_ms("3x"), -1);
    assert_int_equal(dh__http_retry_after_ms("99999999999999999999"), -1);
    assert_int_equal(dh__http_retry_after_ms(""), -1);
}

static void content_ranges(void **state)
{
    int64_t a, b, t;

    (void)state;
    assert_int_equal(dh__http_content_range(" bytes 0-99/1000\r\n", &a, &b, &t),
                     0);
    assert_int_equal(a, 0);
    assert_int_equal(b, 99);
    assert_int_equal(t, 1000);
    assert_int_equal(dh__http_content_range("bytes 5-9/*", &a, &b, &t), 0);
    assert_int_equal(t, -1);
    assert_int_equal(dh__http_content_range("bytes 9-5/100", &a, &b, &t), -1);
    assert_int_equal(dh__http_content_range("bytes 0-100/100", &a, &b, &t), -1);
    assert_int_equal(dh__http_content_range("bytes */100", &a, &b, &t), -1);
    assert_int_equal(dh__http_content_range("items 0-1/2", &a, &b, &t), -1);
    assert_int_equal(dh__http_content_range("bytes 0-1/2 junk", &a, &b, &t),
                     -1);
}

static void s3_keys_are_uri_encoded(void **state)
{
    char out[64];

    (void)state;
    assert_int_equal(dh__url_encode("a b+c/d~e.mp4", 1, out, sizeof(out)), 0);
    assert_string_equal(out, "a%20b%2Bc/d~e.mp4");
    assert_int_equal(dh__url_encode("a/b", 0, out, sizeof(out)), 0);
    assert_string_equal(out, "a%2Fb");
    assert_int_equal(dh__url_encode("\xc3\xa9", 1, out, sizeof(out)), 0);
    assert_string_equal(out, "%C3%A9");
    assert_int_equal(dh__url_encode("abc", 1, out, 3), -1);
    assert_int_equal(dh__url_encode("a ", 1, out, 4), -1);
    assert_int_equal(dh__url_encode("", 1, out, 1), 0);
}

static const char config[] = "# comment\n"
                             "[default]\n"
                             "region = us-east-1\n"
                             "[profile data]\r\n"
                             "region=eu-west-1 \r\n"
                             "endpoint_url = http://127.0.0.1:9000\n"
                             "s3 =\n"
                             "  addressing_style = path\n"
                             "  max_concurrent_requests = 20\n"
                             "region_after = x\n"
                             "; another\n"
                             "[profile other]\n"
                             "s3 =\n"
                             "    addressing_style = virtual\n"
                             "[profile data]\n"
                             "output = json\n";

static void aws_files_are_read_as_aws_reads_them(void **state)
{
    char v[64];

    (void)state;
    assert_true(dh__aws_ini_get(config, "default", "region", v, sizeof(v)));
    assert_string_equal(v, "us-east-1");
    assert_true(
        dh__aws_ini_get(config, "profile data", "region", v, sizeof(v)));
    assert_string_equal(v, "eu-west-1");
    assert_true(
        dh__aws_ini_get(config, "profile data", "endpoint_url", v, sizeof(v)));
    assert_string_equal(v, "http://127.0.0.1:9000");
    assert_true(dh__aws_ini_get(config, "profile data", "s3.addressing_style",
                                v, sizeof(v)));
    assert_string_equal(v, "path");
    assert_true(dh__aws_ini_get(config, "profile other", "s3.addressing_style",
                                v, sizeof(v)));
    assert_string_equal(v, "virtual");
    /* a section seen twice adds to the first */
    assert_true(
        dh__aws_ini_get(config, "profile data", "output", v, sizeof(v)));
    assert_string_equal(v, "json");
    /* nested settings are not top-level ones, nor the reverse */
    assert_false(dh__aws_ini_get(config, "profile data", "addressing_style", v,
                                 sizeof(v)));
    assert_false(dh__aws_ini_get(config, "profile data", "s3.region_after", v,
                                 sizeof(v)));
    assert_false(
        dh__aws_ini_get(config, "profile none", "region", v, sizeof(v)));
    assert_false(dh__aws_ini_get(config, "data", "region", v, sizeof(v)));
    assert_true(dh__aws_ini_get(config, "profile data", "endpoint_url", v, 8));
    assert_string_equal(v, "http://");
}

static int n_objects;
static char last_key[128];
static int64_t size_sum;

static int on_object(void *arg, const char *key, int64_t size)
{
    (void)arg;
    n_objects++;
    snprintf(last_key, sizeof(last_key), "%s", key);
    size_sum += size;
    return n_objects == 99 ? 7 : 0;
}

static void s3_listing_pages_and_errors(void **state)
{
    static const char page[] =
        "<?xml version=\"1.0\"?><ListBucketResult xmlns=\"x\">"
        "<Name>b</Name><IsTruncated>true</IsTruncated>"
        "<Contents><Key>d/a &amp; b.mp4</Key><Size>10</Size></Contents>"
        "<Contents><Key>d/&#233;&#x263a;.mkv</Key><ETag>&quot;e&quot;</ETag>"
        "<Size>32</Size></Contents>"
        "<NextContinuationToken>t/o+k=</NextContinuationToken>"
        "</ListBucketResult>";
    char token[32], v[64];
    int truncated;

    (void)state;
    assert_int_equal(
        dh__s3_list_page(page, on_object, NULL, &truncated, token, 32), 0);
    assert_int_equal(n_objects, 2);
    assert_int_equal(size_sum, 42);
    assert_string_equal(last_key, "d/\xc3\xa9\xe2\x98\xba.mkv");
    assert_int_equal(truncated, 1);
    assert_string_equal(token, "t/o+k=");
    /* the last page, an empty one, and what is not a listing */
    assert_int_equal(
        dh__s3_list_page("<ListBucketResult><IsTruncated>false</IsTruncated>"
                         "</ListBucketResult>",
                         on_object, NULL, &truncated, token, 32),
        0);
    assert_int_equal(truncated, 0);
    assert_int_equal(
        dh__s3_list_page("<Error><Code>NoSuchBucket</Code></Error>", on_object,
                         NULL, &truncated, token, 32),
        -1);
    assert_int_equal(dh__s3_list_page("<ListBucketResult><Contents><Key>a"
                                      "</Key></Contents></ListBucketResult>",
                                      on_object, NULL, &truncated, token, 32),
                     -1);
    assert_int_equal(
        dh__s3_list_page("<ListBucketResult><Contents><Key>a</Key><Size>-1"
                         "</Size></Contents></ListBucketResult>",
                         on_object, NULL, &truncated, token, 32),
        -1);
    assert_int_equal(
        dh__s3_list_page("<ListBucketResult><Contents><Key>a&bogus;</Key>"
                         "<Size>1</Size></Contents></ListBucketResult>",
                         on_object, NULL, &truncated, token, 32),
        -1);
    assert_int_equal(
        dh__s3_list_page("<ListBucketResult><IsTruncated>true</IsTruncated>"
                         "</ListBucketResult>",
                         on_object, NULL, &truncated, token, 32),
        -1); /* truncated without a token: would loop */
    /* the callback stops the walk */
    n_objects = 98;
    assert_int_equal(
        dh__s3_list_page(page, on_object, NULL, &truncated, token, 32), 7);
    /* an error's code and message */
    assert_true(dh__xml_text("<Error><Code>SlowDown</Code><Message>Please\n"
                             "reduce &lt;rate&gt;</Message></Error>",
                             "Message", v, sizeof(v)));
    assert_string_equal(v, "Please reduce <rate>");
    assert_false(dh__xml_text("<Error></Error>", "Code", v, sizeof(v)));
    assert_string_equal(v, "");
    assert_true(dh__xml_text("<Code>ABCDEFGHIJ</Code>", "Code", v, 5));
    assert_string_equal(v, "ABCD");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(url_kinds),
        cmocka_unit_test(urls_shown_without_credentials_or_query),
        cmocka_unit_test(s3_urls_split),
        cmocka_unit_test(statuses_worth_another_try),
        cmocka_unit_test(backoff_is_jittered_bounded_and_honours_retry_after),
        cmocka_unit_test(content_ranges),
        cmocka_unit_test(s3_keys_are_uri_encoded),
        cmocka_unit_test(aws_files_are_read_as_aws_reads_them),
        cmocka_unit_test(s3_listing_pages_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
