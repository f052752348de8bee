/* reqs_sweep.c: the periodic part of the request state machine (the sweep timer calls it every
 * 100 ms): request deadlines and the waiting queue; and failing every job at shutdown. */
#include "reqs_impl.h"

#include "td_error.h"

#include <stdio.h>

void td_reqs_sweep(td_router_t *rt, double now)
{
    /* deadlines: collect first, failing ends jobs */
    for (;;) {
        td_job_t *late = NULL;
        for (td_job_t *j = rt->jobs; j; j = j->next)
            if (j->deadline > 0 && now > j->deadline && !j->abort_queued) {
                late = j;
                break;
            }
        if (!late)
            break;
        char msg[200];
        snprintf(msg, sizeof(msg), "the request did not finish within %.3g s (request_timeout_s)",
                 rt->cfg.request_timeout_s);
        td__reqs_job_fail(late, 504, TD_ETIMEDOUT, msg);
    }
    td_reqs_kick(rt);
}

void td_reqs_abort_all(td_router_t *rt, const char *msg)
{
    while (rt->jobs)
        td__reqs_job_fail(rt->jobs, 503, TD_ECANCELED, msg);
}
