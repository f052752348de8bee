/* tandem-decode: receives prompts' KV (or prefills locally) and streams tokens (worker.h). */
#include "worker.h"

int main(int argc, char **argv)
{
    return td_worker_main(TANDEM__ROLE__ROLE_DECODE, argc, argv);
}
