/*
 * main.c - the `datahelix` binary: dispatches argv[1] through one table
 * (cli_dispatch.c).  main_svc.c is the media-free program of a few of
 * these commands.
 */
#include "cli/cli.h"

static const struct dh_cli_entry commands[] = {
    {"gen-data", dh_cmd_gen_data,
     "write a synthetic heterogeneous video set (real H.264 files)"},
    {"probe", dh_cmd_probe, "scan media files into a descriptor table (JSONL)"},
    {"shard", dh_cmd_shard,
     "write WebDataset tar shards (and their table) from files or a table"},
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

int main(int argc, char **argv)
{
    const struct dh_cli_program p = {
        .name = "datahelix",
        .commands = commands,
        .n = sizeof(commands) / sizeof(commands[0]),
    };

    return dh_cli_dispatch(&p, argc, argv);
}
