/*
 * tar.c - the tar header codec (see tar.h).
 *
 * Layout of a header block (POSIX ustar; GNU uses the same offsets up to
 * the magic and puts other things in the prefix area):
 *   0 name[100]  100 mode[8]  108 uid[8]  116 gid[8]  124 size[12]
 *   136 mtime[12]  148 chksum[8]  156 typeflag  157 linkname[100]
 *   257 magic[6]  263 version[2]  265 uname[32]  297 gname[32]
 *   329 devmajor[8]  337 devminor[8]  345 prefix[155]
 */
#include <stdio.h>
#include <string.h>

#include "core/tar.h"

#define OFF_NAME 0
#define OFF_MODE 100
#define OFF_UID 108
#define OFF_GID 116
#define OFF_SIZE 124
#define OFF_MTIME 136
#define OFF_CHKSUM 148
#define OFF_TYPE 156
#define OFF_MAGIC 257
#define OFF_VERSION 263
#define OFF_PREFIX 345
#define LEN_NAME 100
#define LEN_PREFIX 155
/* The largest size an 11-digit octal field holds. */
#define OCTAL_SIZE_MAX ((int64_t)077777777777)

int64_t dh__tar_padded(int64_t size)
{
    return (size + DH_TAR_BLOCK - 1) / DH_TAR_BLOCK * DH_TAR_BLOCK;
}

/* An octal field (spaces and NULs around the digits), or GNU's base-256
 * (high bit of the first byte set).  -1 when it is neither. */
static int64_t number(const unsigned char *f, size_t len)
{
    int64_t v = 0;
    size_t i = 0;

    if (f[0] & 0x80) {
        if (f[0] == 0xff)
            return -1; /* negative: not a size */
        v = f[0] & 0x7f;
        for (i = 1; i < len; i++) {
            if (v > (INT64_MAX >> 8))
                return -1;
            v = (v << 8) | f[i];
        }
        return v;
    }
    while (i < len && (f[i] == ' ' || f[i] == '\0'))
        i++;
    if (i == len)
        return 0; /* an empty field */
    for (; i < len && f[i] >= '0' && f[i] <= '7'; i++) {
        if (v > (INT64_MAX >> 3))
            return -1;
        v = v * 8 + (f[i] - '0');
    }
    for (; i < len; i++)
        if (f[i] != ' ' && f[i] != '\0')
            return -1;
    return v;
}

static int all_zero(const unsigned char *b)
{
    for (int i = 0; i < DH_TAR_BLOCK; i++)
        if (b[i])
            return 0;
    return 1;
}

/* The stored checksum against the block's, as unsigned bytes (POSIX) or as
 * signed ones (some old writers). */
static int checksum_ok(const unsigned char *b)
{
    int64_t want = number(b + OFF_CHKSUM, 8);
    int64_t u = 0, s = 0;

    for (int i = 0; i < DH_TAR_BLOCK; i++) {
        unsigned char c = i >= OFF_CHKSUM && i < OFF_CHKSUM + 8 ? ' ' : b[i];

        u += c;
        s += (signed char)c;
    }
    return want >= 0 && (want == u || want == s);
}

static void field_str(char *dst, const unsigned char *src, size_t len)
{
    size_t n = strnlen((const char *)src, len);

    memcpy(dst, src, n);
    dst[n] = '\0';
}

static enum dh_tar_type type_of(unsigned char t)
{
    switch (t) {
    case '0':
    case '\0':
    case '7':
        return DH_TAR_FILE;
    case 'L':
        return DH_TAR_LONGNAME;
    case 'x':
        return DH_TAR_PAX;
    case 'g':
        return DH_TAR_PAX_GLOBAL;
    default:
        return DH_TAR_OTHER;
    }
}

int dh__tar_parse(const unsigned char blk[DH_TAR_BLOCK],
                  struct dh_tar_header *h, struct dh_err *e)
{
    int posix = !memcmp(blk + OFF_MAGIC, "ustar\0", 6);
    int gnu = !memcmp(blk + OFF_MAGIC, "ustar  \0", 8);
    unsigned char t = blk[OFF_TYPE];
    size_t n;

    memset(h, 0, sizeof(*h));
    if (all_zero(blk)) {
        h->type = DH_TAR_END;
        return 0;
    }
    if (!checksum_ok(blk))
        return dh_err_set(e, DH_EFORMAT,
                          "not a tar header (checksum mismatch%s)",
                          posix || gnu ? "" : ", no ustar magic");
    h->type = type_of(t);
    h->size = number(blk + OFF_SIZE, 12);
    if (h->size < 0)
        return dh_err_set(e, DH_EFORMAT, "tar header: bad size field");
    /* Links, devices, directories and FIFOs carry no data whatever their
     * size field says. */
    if (t >= '1' && t <= '6')
        h->size = 0;
    n = 0;
    if (posix && blk[OFF_PREFIX]) {
        field_str(h->name, blk + OFF_PREFIX, LEN_PREFIX);
        n = strlen(h->name);
        h->name[n++] = '/';
    }
    field_str(h->name + n, blk + OFF_NAME, LEN_NAME);
    return 0;
}

int dh__tar_pax(const char *data, size_t len, struct dh_tar_pending *p,
                struct dh_err *e)
{
    size_t at = 0;

    while (at < len) {
        size_t rec = 0, i = at, klen, vlen;
        const char *key, *val, *eq;

        if (data[at] == '\0')
            break; /* padding after the last record */
        while (i < len && data[i] >= '0' && data[i] <= '9' && rec < len)
            rec = rec * 10 + (size_t)(data[i++] - '0');
        if (i == at || i >= len || data[i] != ' ' || rec > len - at ||
            rec < i - at + 3 || data[at + rec - 1] != '\n')
            return dh_err_set(e, DH_EFORMAT,
                              "pax header: malformed record at byte %zu", at);
        key = data + i + 1;
        eq = memchr(key, '=', (size_t)(data + at + rec - 1 - key));
        if (!eq)
            return dh_err_set(e, DH_EFORMAT,
                              "pax header: record at byte %zu has no '='", at);
        klen = (size_t)(eq - key);
        val = eq + 1;
        vlen = (size_t)(data + at + rec - 1 - val);

        if (klen == 4 && !memcmp(key, "path", 4)) {
            if (vlen == 0 || vlen >= DH_TAR_NAME_MAX || memchr(val, '\0', vlen))
                return dh_err_set(e, DH_EFORMAT,
                                  "pax header: path of %zu bytes", vlen);
            memcpy(p->name, val, vlen);
            p->name[vlen] = '\0';
            p->has_name = 1;
        } else if (klen == 4 && !memcmp(key, "size", 4)) {
            int64_t v = 0;

            for (size_t k = 0; k < vlen; k++) {
                if (val[k] < '0' || val[k] > '9' || v > (INT64_MAX - 9) / 10)
                    return dh_err_set(e, DH_EFORMAT, "pax header: bad size");
                v = v * 10 + (val[k] - '0');
            }
            if (vlen == 0)
                return dh_err_set(e, DH_EFORMAT, "pax header: empty size");
            p->size = v;
            p->has_size = 1;
        }
        at += rec;
    }
    return 0;
}

void dh__tar_apply(struct dh_tar_pending *p, struct dh_tar_header *h)
{
    if (p->has_name)
        memcpy(h->name, p->name, strlen(p->name) + 1);
    if (p->has_size)
        h->size = p->size;
    memset(p, 0, sizeof(*p));
}

/* ---- writing ---- */

static void put_octal(unsigned char *f, size_t len, int64_t v)
{
    /* len - 1 digits and a NUL, as GNU and Python write them */
    snprintf((char *)f, len, "%0*llo", (int)(len - 1), (unsigned long long)v);
}

static void put_size(unsigned char *f, int64_t v)
{
    if (v <= OCTAL_SIZE_MAX) {
        put_octal(f, 12, v);
        return;
    }
    memset(f, 0, 12); /* base-256 (GNU); the pax record says it too */
    f[0] = 0x80;
    for (int i = 11; i > 0 && v; i--, v >>= 8)
        f[i] = (unsigned char)(v & 0xff);
}

static void seal(unsigned char *b)
{
    unsigned sum = 0;

    memset(b + OFF_CHKSUM, ' ', 8);
    for (int i = 0; i < DH_TAR_BLOCK; i++)
        sum += b[i];
    snprintf((char *)b + OFF_CHKSUM, 8, "%06o", sum);
    b[OFF_CHKSUM + 7] = ' ';
}

static void ustar(unsigned char *b, const char *prefix, size_t plen,
                  const char *name, size_t nlen, int64_t size, char type)
{
    memset(b, 0, DH_TAR_BLOCK);
    memcpy(b + OFF_NAME, name, nlen);
    put_octal(b + OFF_MODE, 8, 0644);
    put_octal(b + OFF_UID, 8, 0);
    put_octal(b + OFF_GID, 8, 0);
    put_size(b + OFF_SIZE, size);
    put_octal(b + OFF_MTIME, 12, 0);
    b[OFF_TYPE] = (unsigned char)type;
    memcpy(b + OFF_MAGIC, "ustar\0", 6);
    memcpy(b + OFF_VERSION, "00", 2);
    if (plen)
        memcpy(b + OFF_PREFIX, prefix, plen);
    seal(b);
}

/* "LEN key=value\n" where LEN counts the whole record, itself included. */
static size_t pax_record(char *out, const char *key, const char *val)
{
    size_t body = strlen(key) + strlen(val) + 3; /* ' ', '=', '\n' */
    size_t len = body + 1, digits;

    for (;;) {
        digits = (size_t)snprintf(NULL, 0, "%zu", len);
        if (body + digits == len)
            break;
        len = body + digits;
    }
    return (size_t)snprintf(out, len + 1, "%zu %s=%s\n", len, key, val);
}

long dh__tar_write_header(unsigned char *out, const char *name, int64_t size)
{
    size_t n = strlen(name), split = 0;
    char rec[DH_TAR_NAME_MAX + 64];
    size_t rlen = 0;
    long at = 0;

    if (n == 0 || n >= DH_TAR_NAME_MAX || size < 0)
        return -1;
    if (n > LEN_NAME) {
        /* prefix/name at a '/' where both halves fit */
        for (size_t i = n - 1; i > 0 && !split; i--)
            if (name[i] == '/' && i <= LEN_PREFIX && n - i - 1 <= LEN_NAME &&
                n - i - 1 > 0)
                split = i;
    }
    if (n > LEN_NAME && !split)
        rlen = pax_record(rec, "path", name);
    if (size > OCTAL_SIZE_MAX) {
        char v[24];

        snprintf(v, sizeof(v), "%lld", (long long)size);
        rlen += pax_record(rec + rlen, "size", v);
    }
    if (rlen) {
        char pname[LEN_NAME];
        /* the extension header's own name, as GNU tar forms it */
        int pn = snprintf(pname, sizeof(pname), "PaxHeaders/%.80s",
                          strrchr(name, '/') ? strrchr(name, '/') + 1 : name);

        ustar(out, NULL, 0, pname,
              (size_t)pn < sizeof(pname) ? (size_t)pn : sizeof(pname) - 1,
              (int64_t)rlen, 'x');
        memset(out + DH_TAR_BLOCK, 0, (size_t)dh__tar_padded((int64_t)rlen));
        memcpy(out + DH_TAR_BLOCK, rec, rlen);
        at = DH_TAR_BLOCK + (long)dh__tar_padded((int64_t)rlen);
    }
    if (split)
        ustar(out + at, name, split, name + split + 1, n - split - 1, size,
              '0');
    else
        ustar(out + at, NULL, 0, name, n < LEN_NAME ? n : LEN_NAME, size, '0');
    return at + DH_TAR_BLOCK;
}

void dh__tar_split_key(const char *name, char *key, const char **ext)
{
    const char *base = strrchr(name, '/');
    const char *dot;
    size_t n;

    base = base ? base + 1 : name;
    dot = strchr(base, '.');
    n = dot ? (size_t)(dot - name) : strlen(name);
    if (n >= DH_TAR_NAME_MAX)
        n = DH_TAR_NAME_MAX - 1;
    memcpy(key, name, n);
    key[n] = '\0';
    *ext = dot ? dot + 1 : "";
}
