/* main.c: `tandem` CLI entry point: dispatches to subcommands. */
#include "cli.h"
#include "td_config_build.h"
#include "td_log.h"

#include <stdio.h>
#include <string.h>

static const td_cli_cmd_t commands[] = {
    {"mkmodel", "write a deterministic random-weight test model", td_cmd_mkmodel},
    {"generate", "generate tokens offline with a model in this process", td_cmd_generate},
    {"bench", "open-loop load test of an OpenAI-compatible server (vLLM's metrics)", td_cmd_bench},
    {"tokenize", "print the token ids of a text (tokenizer.json)", td_cmd_tokenize},
    {"detokenize", "print the text of token ids (tokenizer.json)", td_cmd_detokenize},
    {"apikey", "make an API key and its key file line, or hash a key", td_cmd_apikey},
    {"kvhash", "print a prompt's KV block hashes (the cache and cluster index keys)", td_cmd_kvhash},
    {"ctl", "status, drain, generate through a running cluster's router", td_cmd_ctl},
    {NULL, NULL, NULL},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: tandem COMMAND [OPTIONS]\n\ncommands:\n");
    for (const td_cli_cmd_t *c = commands; c->name; c++)
        fprintf(out, "  %-12s %s\n", c->name, c->summary);
    fprintf(out, "\n`tandem COMMAND --help` describes each command.\n");
}

int main(int argc, char **argv)
{
    td_log_init("tandem", TD_LOG_WARN, TD_LOG_LOGFMT, 2);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("tandem %s\n", TD_VERSION);
        return 0;
    }
    for (const td_cli_cmd_t *c = commands; c->name; c++)
        if (strcmp(argv[1], c->name) == 0)
            return c->run(argc - 1, argv + 1);
    fprintf(stderr, "tandem: unknown command \"%s\"\n\n", argv[1]);
    usage(stderr);
    return 2;
}
