/* fuzz_config.c: the configuration loader (common/base/config.c) with the workers' real option
 * table (td_wk_opts). Input: an INI file's bytes, then optionally a NUL byte and command-line
 * arguments, one per line. The file goes through inih and the option setters exactly as
 * `--config FILE` does (it is written to a memfd and loaded by its /proc path). Checks: the load
 * returns 0 or a TD_E* code with a message; a loaded configuration can be printed as INI and
 * freed. */
#include "fuzz.h"
#include "td_config.h"
#include "td_error.h"
#include "td_worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_ARGS 32

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t ilen = nul ? (size_t)(nul - data) : size;
    int fd = memfd_create("fuzz.ini", 0);
    if (fd < 0)
        abort();
    if (ilen && write(fd, data, ilen) != (ssize_t)ilen)
        abort();
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);

    /* argv: "fuzz", then the lines after the NUL (each NUL-terminated copy) */
    char *args = NULL, *argv[MAX_ARGS + 1];
    int argc = 0;
    argv[argc++] = "fuzz";
    if (nul) {
        size_t alen = size - ilen - 1;
        args = malloc(alen + 1);
        memcpy(args, nul + 1, alen);
        args[alen] = '\0';
        for (char *p = args; argc < MAX_ARGS;) {
            argv[argc++] = p;
            char *nl = memchr(p, '\n', (size_t)(args + alen - p));
            if (!nl)
                break;
            *nl = '\0';
            p = nl + 1;
        }
    }
    argv[argc] = NULL;

    td_wk_cfg_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    int positional[4];
    size_t n_pos = 0;
    int rc = td_config_load(td_wk_opts, td_wk_n_opts, &cfg, path, NULL, argc, argv, positional, 4,
                            &n_pos);
    if (rc) {
        if (rc > 0 || !td_err_msg()[0])
            abort(); /* a failure is a TD_E* code (negative) and always says why */
    } else {
        FILE *out = fopen("/dev/null", "w");
        if (out) {
            td_config_print_ini(out, td_wk_opts, td_wk_n_opts, &cfg);
            fclose(out);
        }
        if (n_pos > 4)
            abort();
    }
    td_config_free(td_wk_opts, td_wk_n_opts, &cfg);
    free(args);
    close(fd);
    return rc ? 1 : 0;
}

void fuzz_seed(td_buf_t *b)
{
    td_buf_append_str(b, "; worker\n"
                         "model = /models/tiny\n"
                         "heartbeat_s = 0.5\n"
                         "[cluster]\n"
                         "secret = s3cr3t\n"
                         "[kv]\n"
                         "memory = 64M\n");
    td_buf_append_char(b, '\0');
    td_buf_append_str(b, "--log-level\ndebug\n--metrics.vllm_names\npositional");
}
