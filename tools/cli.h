/* cli.h: the subcommands of the `tandem` tool. Each returns the process exit status. */
#ifndef TD_CLI_H
#define TD_CLI_H

typedef struct td_cli_cmd {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the subcommand name */
} td_cli_cmd_t;

/* `tandem mkmodel`: write a deterministic random-weight model (cmd_mkmodel.c). */
int td_cmd_mkmodel(int argc, char **argv);

/* `tandem generate`: offline generation in one process (cmd_generate.c). */
int td_cmd_generate(int argc, char **argv);

/* `tandem tokenize` / `tandem detokenize`: text <-> token ids with a model's tokenizer.json
 * (cmd_tokenize.c). */
int td_cmd_tokenize(int argc, char **argv);
int td_cmd_detokenize(int argc, char **argv);
/* `tandem apikey`: a new API key and its key file line, or a key's line (cmd_apikey.c). */
int td_cmd_apikey(int argc, char **argv);
/* `tandem kvhash`: a prompt's hash version 1 block hashes (cmd_kvhash.c). */
int td_cmd_kvhash(int argc, char **argv);

/* `tandem ctl`: status, drain, generate and batch through a router's RPC (cmd_ctl.c). */
int td_cmd_ctl(int argc, char **argv);

/* `tandem bench`: the load generator (bench/bench_main.c). */
int td_cmd_bench(int argc, char **argv);

#endif
