/*
 * cli_dispatch.c - argv[1] through a program's command table: shared by
 * the `datahelix` binary (main.c) and the media-free `datahelix-svc`
 * (main_svc.c), so that both answer --help, --version and unknown
 * commands alike.
 */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "cli/cli.h"

static void usage(FILE *f, const struct dh_cli_program *p)
{
    fprintf(f,
            "usage: %s <command> [options]   (%s <command> "
            "--help for its options)\n",
            p->name, p->name);
    if (p->about)
        fprintf(f, "\n%s\n", p->about);
    fprintf(f, "\ncommands:\n");
    for (size_t i = 0; i < p->n; i++)
        fprintf(f, "  %-12s %s\n", p->commands[i].name, p->commands[i].summary);
}

/* The soft limit on open files raised to the hard one: a Coordinator or
 * DataServer holds a descriptor per connection, and the soft 1,024 of many
 * distributions is what a crowd of idle connections exhausts first
 * (issue 36 item 6).  Nothing here uses select(), so a high fd is fine. */
static void raise_nofile(void)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl); /* best effort */
    }
}

int dh_cli_dispatch(const struct dh_cli_program *p, int argc, char **argv)
{
    raise_nofile();
    if (argc < 2) {
        usage(stderr, p);
        return DH_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(stdout, p);
        return DH_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("%s 0.1.0\n", p->name);
        return DH_EXIT_OK;
    }
    for (size_t i = 0; i < p->n; i++)
        if (!strcmp(argv[1], p->commands[i].name))
            return p->commands[i].fn(argc - 1, argv + 1);
    dh_cli_error(argv[1], "unknown command (see %s --help)%s", p->name,
                 p->unknown_hint ? p->unknown_hint : "");
    return DH_EXIT_USAGE;
}
