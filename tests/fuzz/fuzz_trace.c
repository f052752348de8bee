/* fuzz_trace.c: the Mooncake trace parser of `tandem bench` (td_bench_trace_parse,
 * tools/loadgen/workload_trace.c) over arbitrary bytes, with a start and limit taken from the
 * first byte. What it accepts must hold what its contract says: ids as many as
 * ceil(input_length / 512), lengths >= 1, timestamps non-decreasing, lines increasing; what it
 * rejects must say where ("trace:LINE:" or "trace: no request"). */
#include "bench.h"
#include "fuzz.h"
#include "td_error.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t start = size ? data[0] % 4 : 0, limit = size ? (data[0] >> 2) % 8 : 0;
    const char *text = size ? (const char *)data + 1 : "";
    size_t len = size ? size - 1 : 0;
    td_bench_trace_t t;
    int rc = td_bench_trace_parse("trace", text, len, start, limit, &t);
    if (rc) {
        if (t.reqs || t.n || strncmp(td_err_msg(), "trace", 5) != 0)
            __builtin_trap(); /* an error must leave nothing and name the input */
        return 0;
    }
    if (t.n == 0 || (limit && t.n > limit))
        __builtin_trap();
    for (size_t i = 0; i < t.n; i++) {
        const td_bench_trace_req_t *r = &t.reqs[i];
        if (r->input_length < 1 || r->output_length < 1 || r->timestamp_ms < 0 ||
            (int64_t)r->n_ids != (r->input_length + 511) / 512 ||
            (i && (r->timestamp_ms < t.reqs[i - 1].timestamp_ms || r->line <= t.reqs[i - 1].line)))
            __builtin_trap();
        for (size_t k = 0; k < r->n_ids; k++)
            if (r->hash_ids[k] < 0)
                __builtin_trap();
    }
    td_bench_trace_free(&t);
    return 0;
}

void fuzz_seed(td_buf_t *b)
{
    td_buf_append_char(b, 0x04); /* start 0, limit 1: the first request only */
    td_buf_append_str(b, "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, "
                         "\"hash_ids\": [0, 1]}\n"
                         "{\"timestamp\": 3, \"input_length\": 1100, \"output_length\": 9, "
                         "\"hash_ids\": [0, 2, 3]}\r\n\n"
                         "{\"timestamp\": 3, \"input_length\": 1, \"output_length\": 1, "
                         "\"hash_ids\": [7]}\n");
}
