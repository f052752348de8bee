/* tandem-decode: receives prompts' KV (or prefills locally) and streams tokens (decode.h). */
#include "decode.h"

static const td_worker_role_t decode_role = {
    .role = TANDEM__ROLE__ROLE_DECODE,
    .name = "decode",
    .env_prefix = "TANDEM_DECODE",
    .takes = "decode tasks, receives KV from prefill workers (or prefills locally) and\n"
             "streams tokens back",
    .task_case = TANDEM__FRAME__BODY_DECODE_TASK,
    .on_task = td_decode_on_task,
    .report_failure = td_decode_report_failure,
    .prefilled = td_decode_first_token,
    .decoded = td_decode_decoded,
    .blocks_busy = td_decode_blocks_busy,
    .on_kv_recv = td_decode_on_kv_recv,
    .sweep = td_decode_sweep,
};

int main(int argc, char **argv)
{
    return td_worker_main(&decode_role, argc, argv);
}
