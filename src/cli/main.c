/*
 * main.c - the `datahelix` binary: dispatches argv[1] through one table.
 * Subcommands that later issues deliver are listed so that `datahelix --help`
 * shows the whole tool, and answer with a clear "not implemented" error.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

struct dh_cmd {
    const char *name;
    dh_cmd_fn fn; /* NULL: not implemented yet */
    const char *summary;
};

static const struct dh_cmd commands[] = {
    {"gen-data", dh_cmd_gen_data,
     "write a synthetic heterogeneous video set (real H.264 files)"},
    {"probe", dh_cmd_probe, "scan media files into a descriptor table (JSONL)"},
    {"index", dh_cmd_index,
     "compile a descriptor table into a compact mmap-able index (.dhx)"},
    {"decode", dh_cmd_decode,
     "run the media pipeline on files (sampled decode)"},
    {"coordinator", dh_cmd_coordinator, "run the control plane"},
    {"dataserver", dh_cmd_dataserver, "run a data-plane server"},
    {"consume", dh_cmd_consume, "iterate batches like a training rank"},
    {"plan", dh_cmd_plan, "print the Tier-1 plan of an epoch"},
    {"bench", dh_cmd_bench,
     "data loaders side by side under one CPU budget (paper metrics)"},
    {"sim", dh_cmd_sim, "discrete-event simulator at cluster scale"},
    {"keygen", dh_cmd_keygen, "write a new job key file (CURVE, mode 0600)"},
    {"demo", dh_cmd_demo,
     "train a small video model on 4 CPU ranks, torch's loader beside "
     "datahelix's"},
    {"top", dh_cmd_top,
     "live view of a running job, from its Coordinator's metrics"},
};
#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *f)
{
    fprintf(f, "usage: datahelix <command> [options]   (datahelix <command> "
               "--help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-12s %s%s\n", commands[i].name, commands[i].summary,
                commands[i].fn ? "" : " (not implemented yet)");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return DH_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(stdout);
        return DH_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("datahelix 0.1.0\n");
        return DH_EXIT_OK;
    }
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(argv[1], commands[i].name))
            continue;
        if (!commands[i].fn) {
            dh_cli_error(commands[i].name, "not implemented yet in this "
                                           "version of datahelix");
            return DH_EXIT_USAGE;
        }
        return commands[i].fn(argc - 1, argv + 1);
    }
    dh_cli_error(argv[1], "unknown command (see datahelix --help)");
    return DH_EXIT_USAGE;
}
