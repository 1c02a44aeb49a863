/*
 * cmd_keygen.c - `datahelix keygen FILE`: writes a new job key (a CURVE
 * key pair, docs/security.md "Key files") to FILE, mode 0600, atomically.
 *
 * Design: a thin shell over dh__keys_generate / dh__keys_write.  The key
 * goes only into the file, never to stdout or a command line; what is
 * printed is the public key, which is not a secret.
 * Locking: single-threaded.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "runtime/keys.h"

#define CMD "keygen"

struct args {
    int force;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: datahelix keygen [--force] FILE\n\n"
            "Writes a new job key to FILE (mode 0600, atomically): a ZeroMQ\n"
            "CURVE key pair in Z85, lines `public-key = ...` and\n"
            "`secret-key = ...` (docs/security.md).  Give the same FILE to\n"
            "every process of the job (--keyfile FILE or\n"
            "DATAHELIX_KEYFILE=FILE): the Coordinator and the DataServers\n"
            "then admit only peers holding it, and all traffic is encrypted.\n"
            "Whoever can read FILE can join the job: it must stay readable\n"
            "by its owner only (other modes are refused).\n\n"
            "  --force      replace FILE if it exists (default: refuse)\n"
            "  -h, --help   this text\n");
}

static const struct option long_opts[] = {
    {"force", no_argument, NULL, 'f'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int parse_opt(void *ctx, int c)
{
    struct args *a = ctx;

    if (c == 'f') {
        a->force = 1;
        return 0;
    }
    return dh_cli_usage_error(CMD, "bad option");
}

DH_CLI_CMD(CMD, ":h", long_opts, parse_opt, 1, usage);

int dh_cmd_keygen(int argc, char **argv)
{
    struct args a = {0};
    struct dh_keys k;
    struct dh_err e;
    int first = 0, r;

    if ((r = dh_cli_getopt(&cli_cmd, argc, argv, &a, &first)) != DH_CLI_RUN)
        return r;
    if (first >= argc)
        return dh_cli_usage_error(CMD, "the key FILE is required");
    dh_err_clear(&e);
    if (dh__keys_generate(&k, &e) < 0 ||
        dh__keys_write(argv[first], &k, a.force, &e) < 0) {
        dh__keys_wipe(&k);
        dh_cli_error(CMD, "%s", e.msg);
        return DH_EXIT_FAIL;
    }
    printf("%s: job key written (mode 0600); public key %s\n", argv[first],
           k.pub);
    dh__keys_wipe(&k);
    return DH_EXIT_OK;
}
