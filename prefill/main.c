/* tandem-prefill: computes prompts and pushes their KV into decode workers' pools (prefill.h). */
#include "prefill.h"

static const td_worker_role_t prefill_role = {
    .role = TANDEM__ROLE__ROLE_PREFILL,
    .name = "prefill",
    .env_prefix = "TANDEM_PREFILL",
    .takes = "prefill tasks and pushes each prompt's KV into a decode worker's pool",
    .task_case = TANDEM__FRAME__BODY_PREFILL_TASK,
    .on_task = td_prefill_on_task,
    .report_failure = td_prefill_report_failure,
    .abandon = td_prefill_abandon,
    .chunk_done = td_prefill_chunk_done,
    .prefilled = td_prefill_prefilled,
};

int main(int argc, char **argv)
{
    return td_worker_main(&prefill_role, argc, argv);
}
