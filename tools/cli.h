/* cli.h: the subcommands of the `tandem` tool. Each returns the process exit status. */
#ifndef TD_CLI_H
#define TD_CLI_H

typedef struct td_cli_cmd {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the subcommand name */
} td_cli_cmd_t;

#endif
