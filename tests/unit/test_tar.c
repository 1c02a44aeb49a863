/* test_tar.c - the tar header codec: headers written by us parse back to
 * the same name and size (plain ustar, a prefix/name split, a pax path
 * record, a size past 8 GiB); a hand-made GNU header with base-256 size;
 * checksum, size-field and pax-record errors; WebDataset key splitting.
 * Python's tarfile and GNU tar reading our shards are the integration
 * tests' (test_shards.py). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/tar.h"

static unsigned char buf[DH_TAR_HEADER_ROOM];

/* Walks the headers of one written member like tar_walk.c does. */
static void read_back(long len, struct dh_tar_header *h)
{
    struct dh_tar_pending p;
    struct dh_err e;
    long at = 0;

    memset(&p, 0, sizeof(p));
    for (;;) {
        assert_true(at < len);
        assert_int_equal(dh__tar_parse(buf + at, h, &e), 0);
        at += DH_TAR_BLOCK;
        if (h->type == DH_TAR_PAX) {
            assert_int_equal(
                dh__tar_pax((const char *)buf + at, (size_t)h->size, &p, &e),
                0);
            at += (long)dh__tar_padded(h->size);
            continue;
        }
        dh__tar_apply(&p, h);
        break;
    }
    assert_int_equal(at, len);
}

static void round_trip(const char *name, int64_t size)
{
    struct dh_tar_header h;
    long n = dh__tar_write_header(buf, name, size);

    assert_true(n > 0 && n % DH_TAR_BLOCK == 0);
    read_back(n, &h);
    assert_int_equal(h.type, DH_TAR_FILE);
    assert_string_equal(h.name, name);
    assert_int_equal(h.size, size);
}

static void writes_and_parses_names_and_sizes(void **state)
{
    char longname[3000];

    (void)state;
    round_trip("a.mp4", 0);
    round_trip("clip-000001.mp4", 1234567);
    /* 100 bytes exactly: the name field without its NUL */
    memset(longname, 'x', 100);
    longname[100] = '\0';
    round_trip(longname, 1);
    /* 150 bytes with a '/' that splits into prefix + name */
    memset(longname, 'd', 120);
    longname[120] = '/';
    memcpy(longname + 121, "k.mp4", 6);
    round_trip(longname, 512);
    assert_int_equal(dh__tar_write_header(buf, longname, 512), DH_TAR_BLOCK);
    /* no usable '/': a pax path record */
    memset(longname, 'y', 2999);
    longname[2999] = '\0';
    round_trip(longname, 77);
    assert_true(dh__tar_write_header(buf, longname, 77) > DH_TAR_BLOCK);
    /* past the 11 octal digits: base-256 and a pax size */
    round_trip("big.mkv", (int64_t)9 << 30);
}

static void refuses_what_it_cannot_write(void **state)
{
    char name[DH_TAR_NAME_MAX + 1];

    (void)state;
    assert_int_equal(dh__tar_write_header(buf, "", 1), -1);
    assert_int_equal(dh__tar_write_header(buf, "a", -1), -1);
    memset(name, 'n', DH_TAR_NAME_MAX);
    name[DH_TAR_NAME_MAX] = '\0';
    assert_int_equal(dh__tar_write_header(buf, name, 1), -1);
}

static void fix_checksum(unsigned char *b)
{
    unsigned sum = 0;

    memset(b + 148, ' ', 8);
    for (int i = 0; i < DH_TAR_BLOCK; i++)
        sum += b[i];
    snprintf((char *)b + 148, 8, "%06o", sum);
}

static void gnu_base256_and_types(void **state)
{
    struct dh_tar_header h;
    struct dh_err e;

    (void)state;
    assert_int_equal(dh__tar_write_header(buf, "g.bin", 5), DH_TAR_BLOCK);
    memcpy(buf + 257, "ustar  \0", 8); /* GNU magic */
    memset(buf + 124, 0, 12);
    buf[124] = 0x80;
    buf[133] = 0x01; /* 2^16 */
    fix_checksum(buf);
    assert_int_equal(dh__tar_parse(buf, &h, &e), 0);
    assert_int_equal(h.size, 65536);
    assert_string_equal(h.name, "g.bin");
    buf[156] = 'L';
    fix_checksum(buf);
    assert_int_equal(dh__tar_parse(buf, &h, &e), 0);
    assert_int_equal(h.type, DH_TAR_LONGNAME);
    buf[156] = '5'; /* a directory: no data whatever the size says */
    fix_checksum(buf);
    assert_int_equal(dh__tar_parse(buf, &h, &e), 0);
    assert_int_equal(h.type, DH_TAR_OTHER);
    assert_int_equal(h.size, 0);
    memset(buf, 0, DH_TAR_BLOCK);
    assert_int_equal(dh__tar_parse(buf, &h, &e), 0);
    assert_int_equal(h.type, DH_TAR_END);
}

static void bad_headers_are_errors(void **state)
{
    struct dh_tar_header h;
    struct dh_err e;

    (void)state;
    assert_int_equal(dh__tar_write_header(buf, "a.mp4", 10), DH_TAR_BLOCK);
    buf[0] = 'b'; /* checksum no longer matches */
    assert_int_equal(dh__tar_parse(buf, &h, &e), DH_EFORMAT);
    assert_non_null(strstr(e.msg, "checksum"));
    assert_int_equal(dh__tar_write_header(buf, "a.mp4", 10), DH_TAR_BLOCK);
    memcpy(buf + 124, "12x45670000", 11); /* not octal */
    fix_checksum(buf);
    assert_int_equal(dh__tar_parse(buf, &h, &e), DH_EFORMAT);
    assert_non_null(strstr(e.msg, "size"));
    memset(buf, 0x41, DH_TAR_BLOCK); /* text, as an MPEG-TS payload is */
    assert_int_equal(dh__tar_parse(buf, &h, &e), DH_EFORMAT);
}

static void pax_records(void **state)
{
    struct dh_tar_pending p;
    struct dh_err e;
    static const char ok[] = "15 path=ab.mp4\n11 size=42\n19 mtime=1.5000001\n";
    static const char *bad[] = {
        "99 path=ab.mp4\n", /* longer than the block */
        "14 path=ab.mp4\n", /* length one short: no newline at its end */
        "x path=a\n",       /* no length */
        "13 pathab.mp\n",   /* no '=' */
        "11 size=1x\n",     /* not a number */
        "8 path=\n",        /* empty path */
    };

    (void)state;
    memset(&p, 0, sizeof(p));
    assert_int_equal(dh__tar_pax(ok, sizeof(ok) - 1, &p, &e), 0);
    assert_true(p.has_name && p.has_size);
    assert_string_equal(p.name, "ab.mp4");
    assert_int_equal(p.size, 42);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(&p, 0, sizeof(p));
        assert_int_equal(dh__tar_pax(bad[i], strlen(bad[i]), &p, &e),
                         DH_EFORMAT);
    }
}

static void webdataset_keys(void **state)
{
    char key[DH_TAR_NAME_MAX];
    const char *ext;

    (void)state;
    dh__tar_split_key("000123.mp4", key, &ext);
    assert_string_equal(key, "000123");
    assert_string_equal(ext, "mp4");
    dh__tar_split_key("dir.v2/clip.seg.json", key, &ext);
    assert_string_equal(key, "dir.v2/clip");
    assert_string_equal(ext, "seg.json");
    dh__tar_split_key("noext", key, &ext);
    assert_string_equal(key, "noext");
    assert_string_equal(ext, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(writes_and_parses_names_and_sizes),
        cmocka_unit_test(refuses_what_it_cannot_write),
        cmocka_unit_test(gnu_base256_and_types),
        cmocka_unit_test(bad_headers_are_errors),
        cmocka_unit_test(pax_records),
        cmocka_unit_test(webdataset_keys),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
