/* tandem-prefill: computes prompts and pushes their KV into decode workers' pools (worker.h). */
#include "worker.h"

int main(int argc, char **argv)
{
    return td_worker_main(TANDEM__ROLE__ROLE_PREFILL, argc, argv);
}
