/* bench_tokenizer.c: encode throughput of tandem's tokenizer on one document.
 *
 * usage: bench_tokenizer TOKENIZER_PATH DOCUMENT [REPEATS] [CHUNK]
 * Prints one line: "<bytes> bytes <tokens> tokens best <s> s <MB/s> MB/s cpu <s> s <us> us/call"
 * (MB = 10^6 bytes): the best wall time of REPEATS (default 5) runs after one warm-up run, then the
 * best thread CPU time and that per encode call (steadier than wall time on a loaded machine). A
 * run encodes the whole document in one call, or with CHUNK > 0 cuts it after the first newline at
 * or past every CHUNK bytes and encodes the pieces one call each (as a server tokenizes prompts;
 * CHUNK 1: one call per line, e.g. bench/random_prompts.py's prompts). bench/tokenizer.sh runs
 * it. */
#include "td_error.h"
#include "td_tokenizer.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double thread_cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tokenizer TOKENIZER_PATH DOCUMENT [REPEATS]\n");
        return 2;
    }
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    size_t chunk = argc > 4 ? strtoul(argv[4], NULL, 10) : 0;
    td_tokenizer_t *tok;
    if (td_tokenizer_load(argv[1], &tok)) {
        fprintf(stderr, "bench_tokenizer: %s\n", td_err_msg());
        return 1;
    }
    char *doc;
    size_t len;
    if (td_file_read_all(argv[2], &doc, &len)) {
        fprintf(stderr, "bench_tokenizer: %s\n", td_err_msg());
        return 1;
    }
    td_tokens_t ids;
    td_tokens_init(&ids);
    double best = 1e30, best_cpu = 1e30;
    size_t calls = 0;
    for (int r = 0; r <= reps; r++) {
        ids.len = 0;
        td_tokens_free(&ids); /* each run allocates its output, as a caller would */
        double t0 = td_now_s(), c0 = thread_cpu_s();
        calls = 0;
        for (size_t at = 0; at < len; calls++) {
            size_t end = len;
            if (chunk) {
                const char *nl =
                    at + chunk < len ? memchr(doc + at + chunk, '\n', len - at - chunk) : NULL;
                end = nl ? (size_t)(nl - doc) + 1 : len;
            }
            if (td_tokenizer_encode(tok, doc + at, end - at, false, &ids)) {
                fprintf(stderr, "bench_tokenizer: %s\n", td_err_msg());
                return 1;
            }
            at = end;
        }
        double dt = td_now_s() - t0, dc = thread_cpu_s() - c0;
        if (r > 0 && dt < best) /* run 0 warms up */
            best = dt;
        if (r > 0 && dc < best_cpu)
            best_cpu = dc;
    }
    printf("%zu bytes %zu tokens best %.4f s %.2f MB/s cpu %.4f s %.2f us/call\n", len, ids.len,
           best, len / best / 1e6, best_cpu, best_cpu / (double)(calls ? calls : 1) * 1e6);
    td_tokens_free(&ids);
    free(doc);
    td_tokenizer_free(tok);
    return 0;
}
