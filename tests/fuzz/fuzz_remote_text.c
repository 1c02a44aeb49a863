/*
 * fuzz_remote_text.c - libFuzzer target: what a remote store or a user's
 * AWS files hand us, on arbitrary bytes: an S3 listing page and error body
 * (core/s3_xml.h), a Content-Range and Retry-After header
 * (core/http_retry.h), an AWS config file (core/aws_ini.h), a URL
 * (core/url.h).  Nothing may crash, read past the input or return text
 * that is not terminated within its buffer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/aws_ini.h"
#include "core/http_retry.h"
#include "core/s3_xml.h"
#include "core/url.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int on_object(void *arg, const char *key, int64_t size)
{
    size_t *n = arg;

    if (size < 0 || strlen(key) >= 1100)
        abort();
    (*n)++;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1), out[64], token[64];
    int64_t a, b, t;
    size_t n = 0;
    int truncated;

    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    if (dh__s3_list_page(s, on_object, &n, &truncated, token, sizeof(token)) ==
            0 &&
        truncated && (!token[0] || strlen(token) >= sizeof(token)))
        abort();
    if (dh__xml_text(s, "Code", out, sizeof(out)) && strlen(out) >= sizeof(out))
        abort();
    if (dh__http_content_range(s, &a, &b, &t) == 0 &&
        (a > b || (t >= 0 && b >= t)))
        abort();
    if (dh__http_retry_after_ms(s) > 86400000)
        abort();
    if (dh__aws_ini_get(s, "default", "s3.addressing_style", out,
                        sizeof(out)) &&
        strlen(out) >= sizeof(out))
        abort();
    dh__aws_ini_get(s, "profile x", "region", out, sizeof(out));
    dh__url_redact(s, out, sizeof(out));
    if (strlen(out) >= sizeof(out))
        abort();
    dh__url_path(s, out, sizeof(out));
    dh__url_encode(s, 1, out, sizeof(out));
    free(s);
    return 0;
}
