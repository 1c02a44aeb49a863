#include "cli/cli.h"

int dh_cmd_gen_data(int argc, char **argv)
{
    (void)argc;
    dh_cli_error(argv[0], "not implemented yet");
    return DH_EXIT_USAGE;
}
