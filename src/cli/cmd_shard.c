/*
 * cmd_shard.c - `datahelix shard`: writes WebDataset shards from a folder,
 * a list or a table (docs/shards.md), and their table.
 *
 * Design: the inputs are expanded as probe expands them (files, folders,
 * {"path", "text"} lists, tables, shards), then split into shards by
 * their sizes before anything is written: shard k's members are the same
 * on every run over the same inputs, so a run that stopped is resumed by
 * writing only the shards that are missing or the wrong size.  Each shard
 * is written to a hidden temporary name beside it and renamed when whole,
 * so no half shard ever has a final name.  Each sample is KEY.EXT (the
 * media, copied byte for byte), KEY.txt (its caption, when it has one) and
 * KEY.json ({"source": where it came from}); KEY is its position, nine
 * digits, so keys sort in input order.  The table is probe's, run on the
 * written shards (--table).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/alloc.h"
#include "core/fileio.h"
#include "core/tar.h"
#include "datahelix/probe.h"
#include "media/source.h"

#define CMD "shard"
#define COPY_BUF (1 << 20)

struct opts {
    const char *out;
    const char *table;
    const char *prefix;
    int64_t shard_bytes;
    int quiet;
};

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: datahelix shard --out DIR [options] INPUT...\n\n"
        "Writes WebDataset shards (tar: KEY.mp4 + KEY.txt + KEY.json per\n"
        "sample) from files, folders, {\"path\", \"text\"} lists, tables or\n"
        "other shards, in input order.  Readable by WebDataset, Energon and\n"
        "DALI as by datahelix (docs/shards.md).  Shards are written whole or\n"
        "not at all; a run over the same inputs writes only the shards that\n"
        "are missing (resumable).\n\n"
        "  -o, --out DIR         folder for the shards (made if missing)\n"
        "      --shard-bytes N   target shard size; a shard ends at the first\n"
        "                        sample that would take it past N (a larger\n"
        "                        sample is a shard of its own)  [1073741824]\n"
        "      --prefix NAME     shard names NAME-000000.tar ...   [shard]\n"
        "      --table FILE      then probe the shards into FILE (the table\n"
        "                        a loader reads; `datahelix probe`'s output)\n"
        "  -q, --quiet           no progress or summary\n"
        "  -h, --help            this text\n\n"
        "Exit status: 0 when every input was written, 1 on any failure (one\n"
        "line each on stderr), 2 for bad usage.\n");
}

enum { OPT_BYTES = 256, OPT_PREFIX, OPT_TABLE };

static const struct option longopts[] = {
    {"out", required_argument, NULL, 'o'},
    {"shard-bytes", required_argument, NULL, OPT_BYTES},
    {"prefix", required_argument, NULL, OPT_PREFIX},
    {"table", required_argument, NULL, OPT_TABLE},
    {"quiet", no_argument, NULL, 'q'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int parse_opt(void *ctx, int c)
{
    struct opts *o = ctx;

    switch (c) {
    case 'o':
        o->out = optarg;
        return 0;
    case OPT_BYTES:
        return dh_cli_opt_i64(CMD, "--shard-bytes", optarg, 4096,
                              (int64_t)1 << 50, &o->shard_bytes)
                   ? DH_EXIT_USAGE
                   : 0;
    case OPT_PREFIX:
        if (!*optarg || strchr(optarg, '/') || optarg[0] == '.')
            return dh_cli_usage_error(CMD, "--prefix must be a plain name");
        o->prefix = optarg;
        return 0;
    case OPT_TABLE:
        o->table = optarg;
        return 0;
    case 'q':
        o->quiet = 1;
        return 0;
    default:
        return dh_cli_usage_error(CMD, "bad option");
    }
}

DH_CLI_CMD(CMD, ":o:qh", longopts, parse_opt, -1, usage);

/* One sample as it will be written. */
struct entry {
    const struct dh_probe_item *it;
    int64_t size; /* the media's bytes */
    char ext[32];
    char *meta; /* KEY.json's text */
};

struct run {
    const struct opts *o;
    struct dh_probe_list list;
    struct entry *ents;
    size_t *first; /* shard k holds ents[first[k] .. first[k + 1]) */
    size_t nshards;
    unsigned char *buf;
    unsigned char hdr[DH_TAR_HEADER_ROOM];
    int failed;
};

static int64_t header_bytes(struct run *r, const char *name, int64_t size)
{
    long n = dh__tar_write_header(r->hdr, name, size);

    return n < 0 ? -1 : n;
}

/* Bytes a member takes in the archive: its header(s) and padded data. */
static int64_t member_bytes(struct run *r, const char *name, int64_t size)
{
    int64_t h = header_bytes(r, name, size);

    return h < 0 ? -1 : h + dh__tar_padded(size);
}

static void key_name(char *buf, size_t len, size_t i, const char *ext)
{
    snprintf(buf, len, "%09zu.%s", i, ext);
}

/* The media member's extension, from its (member or file) name. */
static int take_ext(struct entry *en)
{
    const char *n = en->it->member ? en->it->member : en->it->path;
    const char *slash = strrchr(n, '/');
    const char *dot = strrchr(slash ? slash + 1 : n, '.');
    size_t len;

    if (!dot || !dot[1] || (len = strlen(dot + 1)) >= sizeof(en->ext))
        return -1;
    for (size_t i = 0; i < len; i++) {
        char c = dot[1 + i];

        en->ext[i] = (char)(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    }
    en->ext[len] = '\0';
    return 0;
}

static char *meta_json(const struct dh_probe_item *it)
{
    json_t *o = json_object();
    char *s = NULL;

    if (o &&
        !json_object_set_new(o, "source", json_string(dh_probe_item_name(it))))
        s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* Bytes entry i takes in its shard: the media member, its .json and its
 * .txt (when it has a caption). */
static int64_t entry_bytes(struct run *r, size_t i)
{
    const struct entry *en = &r->ents[i];
    char name[64];

    key_name(name, sizeof(name), i, en->ext);
    return member_bytes(r, name, en->size) +
           member_bytes(r, "000000000.json", (int64_t)strlen(en->meta)) +
           (en->it->text ? member_bytes(r, "000000000.txt",
                                        (int64_t)strlen(en->it->text))
                         : 0);
}

/* Sizes every sample and cuts the list into shards. */
static int plan(struct run *r)
{
    size_t n = r->list.count, k = 0;
    int64_t fill = 0;

    r->ents = dh__calloc(n, sizeof(*r->ents));
    r->first = dh__calloc(n + 1, sizeof(*r->first));
    if (!r->ents || !r->first)
        return -1;
    for (size_t i = 0; i < n; i++) {
        struct entry *en = &r->ents[i];
        const struct dh_probe_item *it = &r->list.items[i];
        struct stat st;
        int64_t need;

        en->it = it;
        if (it->member) {
            en->size = it->size;
        } else if (stat(it->path, &st)) {
            dh_cli_error(CMD, "%s: %s", it->path, strerror(errno));
            return -1;
        } else if (!S_ISREG(st.st_mode)) {
            dh_cli_error(CMD, "%s: not a regular file", it->path);
            return -1;
        } else {
            en->size = (int64_t)st.st_size;
        }
        if (take_ext(en)) {
            dh_cli_error(CMD, "%s: no file extension to name its member by",
                         dh_probe_item_name(it));
            return -1;
        }
        if (!(en->meta = meta_json(it)))
            return -1;
        need = entry_bytes(r, i);
        if (fill > 0 && fill + need > r->o->shard_bytes) {
            r->first[++k] = i;
            fill = 0;
        }
        fill += need;
    }
    r->nshards = n ? k + 1 : 0;
    r->first[r->nshards] = n;
    return 0;
}

static void shard_path(const struct run *r, size_t k, int tmp, char *buf,
                       size_t len)
{
    snprintf(buf, len, "%s/%s%s-%06zu.tar%s", r->o->out, tmp ? "." : "",
             r->o->prefix, k, tmp ? ".part" : "");
}

/* The size shard k has when whole. */
static int64_t shard_size(struct run *r, size_t k)
{
    int64_t total = 2 * DH_TAR_BLOCK; /* the end-of-archive blocks */

    for (size_t i = r->first[k]; i < r->first[k + 1]; i++)
        total += entry_bytes(r, i);
    return total;
}

static int put(int fd, const void *p, size_t n, const char *path)
{
    if (dh__write_all(fd, p, n) == 0)
        return 0;
    dh_cli_error(CMD, "%s: write failed: %s", path, strerror(errno));
    return -1;
}

static int pad(int fd, int64_t size, const char *path)
{
    static const unsigned char zeros[DH_TAR_BLOCK];
    size_t n = (size_t)(dh__tar_padded(size) - size);

    return n ? put(fd, zeros, n, path) : 0;
}

static int put_small(struct run *r, int fd, const char *name, const char *s,
                     const char *path)
{
    size_t n = strlen(s);
    long h = dh__tar_write_header(r->hdr, name, (int64_t)n);

    if (h < 0)
        return -1;
    return put(fd, r->hdr, (size_t)h, path) || put(fd, s, n, path) ||
                   pad(fd, (int64_t)n, path)
               ? -1
               : 0;
}

/* The media's bytes, read through a source (a file or a shard member). */
static int copy_media(struct run *r, int fd, const struct entry *en,
                      const char *path)
{
    struct dh_source_ref ref = {en->it->path, en->it->member, en->it->offset,
                                en->it->size};
    struct dh_source s;
    struct dh_err e;
    int64_t at = 0;
    int rc = 0;

    dh__source_init(&s);
    if (dh__source_open(&s, &ref, &e)) {
        dh_cli_error(CMD, "%s", e.msg);
        rc = -1;
    } else if (s.size != en->size) {
        dh_cli_error(CMD, "%s: changed while being read",
                     dh_probe_item_name(en->it));
        rc = -1;
    }
    while (!rc && at < en->size) {
        int64_t n = dh__source_read(&s, at, r->buf, COPY_BUF, &e);

        if (n < 0)
            dh_cli_error(CMD, "%s", e.msg);
        else if (n == 0)
            dh_cli_error(CMD, "%s: ended early", dh_probe_item_name(en->it));
        if (n <= 0 || put(fd, r->buf, (size_t)n, path))
            rc = -1;
        else
            at += n;
    }
    dh__source_fini(&s);
    return rc ? -1 : pad(fd, en->size, path);
}

static int write_shard(struct run *r, size_t k)
{
    static const unsigned char end[2 * DH_TAR_BLOCK];
    char tmp[4096], final[4096], name[64];
    int fd, rc = 0;

    shard_path(r, k, 1, tmp, sizeof(tmp));
    shard_path(r, k, 0, final, sizeof(final));
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        dh_cli_error(CMD, "%s: %s", tmp, strerror(errno));
        return -1;
    }
    for (size_t i = r->first[k]; !rc && i < r->first[k + 1]; i++) {
        const struct entry *en = &r->ents[i];
        long h;

        key_name(name, sizeof(name), i, en->ext);
        h = dh__tar_write_header(r->hdr, name, en->size);
        rc = h < 0 || put(fd, r->hdr, (size_t)h, tmp) ||
             copy_media(r, fd, en, tmp);
        if (!rc && en->it->text) {
            key_name(name, sizeof(name), i, "txt");
            rc = put_small(r, fd, name, en->it->text, tmp);
        }
        if (!rc) {
            key_name(name, sizeof(name), i, "json");
            rc = put_small(r, fd, name, en->meta, tmp);
        }
    }
    if (!rc)
        rc = put(fd, end, sizeof(end), tmp);
    if (!rc && fsync(fd)) {
        dh_cli_error(CMD, "%s: fsync: %s", tmp, strerror(errno));
        rc = -1;
    }
    if (close(fd) && !rc) {
        dh_cli_error(CMD, "%s: close: %s", tmp, strerror(errno));
        rc = -1;
    }
    if (!rc && rename(tmp, final)) {
        dh_cli_error(CMD, "%s: %s", final, strerror(errno));
        rc = -1;
    }
    if (rc)
        unlink(tmp);
    return rc;
}

static int write_all(struct run *r, size_t *written, size_t *kept)
{
    struct dh_progress p;
    char final[4096];
    int rc = 0;

    if (mkdir(r->o->out, 0755) && errno != EEXIST) {
        dh_cli_error(CMD, "%s: %s", r->o->out, strerror(errno));
        return -1;
    }
    if (!(r->buf = dh__malloc(COPY_BUF)))
        return -1;
    dh_progress_start(&p, "shard", r->nshards);
    if (r->o->quiet)
        dh_progress_log_every(&p, 0);
    for (size_t k = 0; k < r->nshards && !rc; k++) {
        struct stat st;

        shard_path(r, k, 0, final, sizeof(final));
        /* resume: a shard whole from an earlier run has its final name
         * (written only by rename) and its planned size */
        if (!stat(final, &st) && st.st_size == shard_size(r, k))
            (*kept)++;
        else if (!(rc = write_shard(r, k)))
            (*written)++;
        dh_progress_update(&p, k + 1, 0);
    }
    dh_progress_finish(&p);
    return rc;
}

/* The table: `datahelix probe --out TABLE` of the shards, in order. */
static int probe_table(struct run *r)
{
    size_t n = r->nshards + 4;
    char **argv = dh__calloc(n, sizeof(*argv));
    char(*names)[4096] = dh__calloc(r->nshards ? r->nshards : 1,
                                    sizeof(*names));
    int argc = 0, rc = DH_EXIT_FAIL;

    if (argv && names) {
        argv[argc++] = "probe";
        argv[argc++] = "--out";
        argv[argc++] = (char *)r->o->table;
        if (r->o->quiet)
            argv[argc++] = "--quiet";
        for (size_t k = 0; k < r->nshards; k++) {
            shard_path(r, k, 0, names[k], sizeof(names[k]));
            argv[argc++] = names[k];
        }
        rc = dh_cmd_probe(argc, argv);
    }
    dh__free(argv);
    dh__free(names);
    return rc;
}

int dh_cmd_shard(int argc, char **argv)
{
    struct opts o = {.prefix = "shard", .shard_bytes = (int64_t)1 << 30};
    struct run r = {.o = &o};
    size_t written = 0, kept = 0, bytes_in = 0;
    struct dh_err e;
    int first, rc;

    dh__alloc_init();
    if ((rc = dh_cli_getopt(&cli_cmd, argc, argv, &o, &first)) != DH_CLI_RUN)
        return rc;
    if (!o.out || !*o.out)
        return dh_cli_usage_error(CMD, "--out DIR is required");
    if (first >= argc)
        return dh_cli_usage_error(CMD, "no INPUT given");
    dh_probe_list_init(&r.list);
    rc = DH_EXIT_FAIL;
    for (int i = first; i < argc; i++) {
        dh_err_clear(&e);
        if (dh_probe_list_add_input(&r.list, argv[i], &e)) {
            dh_cli_error(CMD, "%s", e.msg);
            goto out;
        }
    }
    for (size_t i = 0; i < r.list.nproblems; i++)
        dh_cli_error_line(CMD, "%s", r.list.problems[i]);
    if (r.list.nproblems || r.list.count == 0) {
        dh_cli_error(CMD, r.list.count ? "the inputs have problems (above); "
                                         "no shard written"
                                       : "no input files");
        goto out;
    }
    if (plan(&r) || write_all(&r, &written, &kept))
        goto out;
    for (size_t i = 0; i < r.list.count; i++)
        bytes_in += (size_t)r.ents[i].size;
    if (!o.quiet)
        fprintf(stderr,
                "shard: %zu samples (%.1f MB) in %zu shards: %zu written, "
                "%zu already whole -> %s\n",
                r.list.count, (double)bytes_in / 1e6, r.nshards, written, kept,
                o.out);
    rc = o.table ? probe_table(&r) : DH_EXIT_OK;
out:
    for (size_t i = 0; r.ents && i < r.list.count; i++)
        dh__free(r.ents[i].meta); /* jansson's, through dh__malloc */
    dh__free(r.ents);
    dh__free(r.first);
    dh__free(r.buf);
    dh_probe_list_fini(&r.list);
    return rc;
}
