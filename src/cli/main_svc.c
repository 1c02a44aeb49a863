/*
 * main_svc.c - `datahelix-svc`: the commands that serve a job without
 * decoding media (the Coordinator, a DataServer of Python workers, keygen),
 * linked without FFmpeg (media_none.c).  Each start of `datahelix` maps the
 * ~140 shared libraries libavformat pulls in, about 40 ms here; the Python
 * loaders start their Coordinator and a DistributedDataLoader's DataServer
 * with this program when it lies beside `datahelix` (docs/python.md
 * "Start-up").  The options and behaviour are `datahelix`'s own.
 */
#include "cli/cli.h"

static const struct dh_cli_entry commands[] = {
    {"coordinator", dh_cmd_coordinator, "run the control plane"},
    {"dataserver", dh_cmd_dataserver,
     "run a data-plane server of Python workers (--python-dataset); "
     "video needs `datahelix dataserver`"},
    {"keygen", dh_cmd_keygen, "write a new job key file (CURVE, mode 0600)"},
};

int main(int argc, char **argv)
{
    const struct dh_cli_program p = {
        .name = "datahelix-svc",
        .about = "datahelix's service commands without media decoding "
                 "(FFmpeg is not linked); every other command is "
                 "`datahelix`'s.",
        .commands = commands,
        .n = sizeof(commands) / sizeof(commands[0]),
        .unknown_hint = "; media commands are `datahelix`'s",
    };

    return dh_cli_dispatch(&p, argc, argv);
}
