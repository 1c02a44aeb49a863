/*
 * s3_xml.c - S3's XML answers, the few elements read (see s3_xml.h).  Pure.
 */
#include "core/s3_xml.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* UTF-8 of code point cp into out (room for 4): bytes written, 0 if cp
 * is not a character XML allows. */
static size_t utf8_put(unsigned long cp, char *out)
{
    if (cp == 0 || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
        return 0;
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* [a, b) unescaped into out: 0, or -1 when it does not fit or holds an
 * entity that is not one of XML's own. */
static int unescape(const char *a, const char *b, char *out, size_t cap)
{
    static const struct {
        const char *name;
        char c;
    } ents[] = {{"amp;", '&'},
                {"lt;", '<'},
                {"gt;", '>'},
                {"quot;", '"'},
                {"apos;", '\''}};
    size_t n = 0;

    while (a < b) {
        char buf[4];
        size_t k = 1;

        buf[0] = *a;
        if (*a == '&') {
            const char *semi = memchr(a, ';', (size_t)(b - a));
            size_t i;

            if (!semi || semi - a > 12)
                return -1;
            for (i = 0; i < sizeof(ents) / sizeof(ents[0]); i++)
                if ((size_t)(semi + 1 - (a + 1)) == strlen(ents[i].name) &&
                    !memcmp(a + 1, ents[i].name, strlen(ents[i].name)))
                    break;
            if (i < sizeof(ents) / sizeof(ents[0])) {
                buf[0] = ents[i].c;
            } else if (a[1] == '#') {
                char *end;
                int hex = a[2] == 'x';
                unsigned long cp = strtoul(a + 2 + hex, &end, hex ? 16 : 10);

                if (end != semi || end == a + 2 + hex ||
                    !(k = utf8_put(cp, buf)))
                    return -1;
            } else {
                return -1;
            }
            a = semi + 1;
        } else {
            a++;
        }
        if (n + k >= cap)
            return -1;
        memcpy(out + n, buf, k);
        n += k;
    }
    out[n] = '\0';
    return 0;
}

/* The text of <tag> inside [a, b): its bounds, or 0. */
static int element(const char *a, const char *b, const char *tag,
                   const char **ta, const char **tb)
{
    char open[40], close[40];
    const char *p, *q;
    size_t no, nc;

    snprintf(open, sizeof(open), "<%s>", tag);
    snprintf(close, sizeof(close), "</%s>", tag);
    no = strlen(open);
    nc = strlen(close);
    for (p = a; p + no <= b; p++)
        if (!memcmp(p, open, no))
            break;
    if (p + no > b)
        return 0;
    for (q = p + no; q + nc <= b; q++)
        if (!memcmp(q, close, nc))
            break;
    if (q + nc > b)
        return 0;
    *ta = p + no;
    *tb = q;
    return 1;
}

int dh__xml_text(const char *xml, const char *tag, char *out, size_t cap)
{
    const char *a, *b;

    if (!cap)
        return 0;
    out[0] = '\0';
    if (!element(xml, xml + strlen(xml), tag, &a, &b))
        return 0;
    if (unescape(a, b, out, cap)) {
        size_t n = (size_t)(b - a) < cap - 1 ? (size_t)(b - a) : cap - 1;

        memcpy(out, a, n); /* as it stands, cut */
        out[n] = '\0';
    }
    for (char *c = out; *c; c++)
        if ((unsigned char)*c < 0x20)
            *c = ' ';
    return 1;
}

int dh__s3_list_page(const char *xml, dh_s3_object_fn fn, void *arg,
                     int *truncated, char *token, size_t cap)
{
    const char *end = xml + strlen(xml), *p, *ca, *cb;
    char key[1100];

    *truncated = 0;
    if (cap)
        token[0] = '\0';
    if (!strstr(xml, "<ListBucketResult"))
        return -1;
    for (p = xml; element(p, end, "Contents", &ca, &cb); p = cb) {
        const char *ka, *kb, *sa, *sb;
        char *num_end;
        long long size;
        int rc;

        if (!element(ca, cb, "Key", &ka, &kb) ||
            !element(ca, cb, "Size", &sa, &sb) ||
            unescape(ka, kb, key, sizeof(key)) || sa == sb)
            return -1;
        size = strtoll(sa, &num_end, 10);
        if (num_end != sb || size < 0)
            return -1;
        if ((rc = fn(arg, key, (int64_t)size)))
            return rc;
    }
    {
        const char *ta, *tb;

        if (element(xml, end, "IsTruncated", &ta, &tb) && tb - ta == 4 &&
            !memcmp(ta, "true", 4)) {
            if (!element(xml, end, "NextContinuationToken", &ta, &tb) ||
                unescape(ta, tb, token, cap) || !token[0])
                return -1;
            *truncated = 1;
        }
    }
    return 0;
}
