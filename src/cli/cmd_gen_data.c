/*
 * cmd_gen_data.c - `datahelix gen-data`: option parsing, progress and the
 * summary line around dh_gen_data() (src/include/datahelix/gendata.h).
 *
 * Design: every argument is validated before any file is touched, so a
 * usage error (exit 2) never leaves output behind; failures while writing
 * are runtime errors (exit 1).  Each error is one stderr line.
 * Locking: single-threaded.
 */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "datahelix/gendata.h"

#define CMD "gen-data"

struct args {
    struct dh_gen_opts o;
};

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: datahelix gen-data --out DIR [--profiles LIST] [--count N]\n"
        "                          [--seed S] [--captions] [--stamp]\n\n"
        "Writes N synthetic H.264 MP4 files (MPEG-4 Part 2 if libx264 is\n"
        "missing) named DIR/NNNNNN_<P>.mp4; the same options give the same\n"
        "bytes.\n\n"
        "  -o, --out DIR        output directory (created with parents)\n"
        "  -p, --profiles LIST  comma list of S,M,L,XL or mixed (= S,M,L);\n"
        "                       files cycle through it (default mixed)\n"
        "                         S  400x224  ~2 s    M  600x336  ~4 s\n"
        "                         L  800x448  ~8 s    XL 1280x720 ~8 s\n"
        "                       (each length jittered +-20%%, 25 fps)\n"
        "  -n, --count N        number of files, 1..%d (default 12)\n"
        "  -s, --seed S         unsigned 64-bit seed (default 0)\n"
        "      --captions       also write DIR/captions.jsonl\n"
        "                       ({\"path\", \"text\"} per line)\n"
        "      --stamp          draw each frame's index (12 bits) in a row\n"
        "                       of 16x16 blocks at the top (for tests)\n"
        "  -h, --help           this text\n",
        DH_GEN_MAX_COUNT);
}

/* Strict unsigned 64-bit decimal: digits only, no sign, no overflow. */
static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v;

    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

static const struct option long_opts[] = {
    {"out", required_argument, NULL, 'o'},
    {"profiles", required_argument, NULL, 'p'},
    {"count", required_argument, NULL, 'n'},
    {"seed", required_argument, NULL, 's'},
    {"captions", no_argument, NULL, 'c'},
    {"stamp", no_argument, NULL, 'S'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* One option; 0 to go on, or an exit code. */
static int take_option(void *ctx, int c)
{
    struct args *a = ctx;

    switch (c) {
    case 'o':
        a->o.out_dir = optarg;
        return 0;
    case 'p':
        a->o.profiles = optarg;
        return 0;
    case 'n':
        if (dh_cli_parse_i64(optarg, 1, DH_GEN_MAX_COUNT, &a->o.count))
            return dh_cli_usage_error(CMD,
                                      "--count must be an integer in "
                                      "1..%d, not '%s'",
                                      DH_GEN_MAX_COUNT, optarg);
        return 0;
    case 's':
        if (parse_u64(optarg, &a->o.seed))
            return dh_cli_usage_error(CMD,
                                      "--seed must be an unsigned 64-bit "
                                      "integer, not '%s'",
                                      optarg);
        return 0;
    case 'c':
        a->o.captions = 1;
        return 0;
    case 'S':
        a->o.stamp = 1;
        return 0;
    default:
        return dh_cli_usage_error(CMD, "bad option");
    }
}

DH_CLI_CMD(CMD, "+:o:p:n:s:h", long_opts, take_option, 0, usage);

static int parse_args(struct args *a, int argc, char **argv)
{
    struct dh_gen_profile_list l;
    struct dh_err e;
    int r;

    if ((r = dh_cli_getopt(&cli_cmd, argc, argv, a, NULL)) != DH_CLI_RUN)
        return r;
    if (!a->o.out_dir || !*a->o.out_dir)
        return dh_cli_usage_error(CMD, "--out DIR is required");
    if (dh_gen_profiles_parse(a->o.profiles, &l, &e) < 0)
        return dh_cli_usage_error(CMD, "--profiles: %s", e.msg);
    return DH_CLI_RUN;
}

static void on_progress(void *ctx, int64_t done, int64_t total)
{
    (void)total;
    dh_progress_update(ctx, (uint64_t)done, 0);
}

int dh_cmd_gen_data(int argc, char **argv)
{
    struct args a = {.o = {.count = 12, .profiles = "mixed"}};
    struct dh_gen_stats st;
    struct dh_progress bar;
    struct dh_err e;
    int r;

    if ((r = parse_args(&a, argc, argv)) != DH_CLI_RUN)
        return r;
    dh_err_clear(&e);
    dh_progress_start(&bar, CMD, (uint64_t)a.o.count);
    a.o.progress = on_progress;
    a.o.progress_ctx = &bar;
    r = dh_gen_data(&a.o, &st, &e);
    dh_progress_finish(&bar);
    if (r < 0) {
        dh_cli_error(CMD, "%s", e.msg);
        return DH_EXIT_FAIL;
    }
    fprintf(stderr,
            "gen-data: %lld files, %llu bytes, %lld frames, %.2f s "
            "(%s) in %s\n",
            (long long)st.files, (unsigned long long)st.bytes,
            (long long)st.frames, dh_cli_now() - bar.t_start,
            st.encoder ? st.encoder : "?", a.o.out_dir);
    return DH_EXIT_OK;
}
