/* worker.h: the worker daemon that tandem-prefill and tandem-decode both run.
 *
 * One process = one engine, one KV pool (the data plane's UCX-registered memory, so blocks move
 * without a copy), one libuv loop and one compute thread:
 *
 *   loop thread     control plane to every router (td_rpc), data plane (td_kvx), /metrics and
 *                   /health (td_http), the per-request state machine and the scheduler that
 *                   builds each step's batch
 *   compute thread  runs one step at a time (td_engine_step, then sampling), handed over by the
 *                   loop and handed back through a uv_async; it never touches the network
 *
 * The role decides what a worker accepts: a prefill worker takes PrefillTask (compute the prompt,
 * push its KV into a decode worker's pool, report PrefillDone); a decode worker takes DecodeTask
 * (reserve blocks and wait for a prefill worker's push, or prefill locally) and streams
 * TokenChunk frames until the sequence finishes.
 */
#ifndef TD_WORKER_H
#define TD_WORKER_H

#include "control.pb-c.h"

/* Run the daemon: parse argv (INI --config, environment TANDEM_*, flags), load the model, serve
 * until SIGTERM/SIGINT, drain, exit. Returns the process exit status. `role` is
 * TANDEM__ROLE__ROLE_PREFILL or TANDEM__ROLE__ROLE_DECODE. */
int td_worker_main(Tandem__Role role, int argc, char **argv);

#endif
