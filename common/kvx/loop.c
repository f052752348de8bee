/* loop.c: how the libuv loop drives UCX. UCX callbacks queue tasks (td__queue_task); the service
 * routine, run from the event-fd poll, prepare, idle and tick handles, progresses the worker, runs
 * the tasks and arms the worker before the loop may sleep. Also the per-request accounting that
 * every UCX completion goes through, and the deadline timer (handshakes, teardowns).
 */
#include "kvx_impl.h"
#include "td_error.h"
#include "td_log.h"
#include "td_util.h"

#include <stdlib.h>
#include <sched.h>

#define SERVICE_ROUNDS 64
#define TICK_MS 1
#define SPIN_NS 50000ull /* keep polling this long after the last progress while busy */

/* ---- tasks -----------------------------------------------------------------------------------*/

void td__queue_task(td_kvx_t *k, task_t *t)
{
    t->next = NULL;
    if (k->tq_tail)
        k->tq_tail->next = t;
    else
        k->tq_head = t;
    k->tq_tail = t;
}

/* Allocation failures inside UCX callbacks cannot be reported to anyone: abort loudly rather than
 * lose a completion (a few dozen bytes; the process is out of memory anyway). */
task_t *td__new_task(task_type_t type)
{
    task_t *t = calloc(1, sizeof(*t));
    TD_ASSERT(t != NULL);
    t->type = type;
    return t;
}

void td__queue_tx_check(xfer_t *x)
{
    if (x->check_queued)
        return;
    x->check_queued = true;
    task_t *t = td__new_task(TASK_TX_CHECK);
    t->x = x;
    td__queue_task(x->peer->kvx, t);
}

void td__queue_rx_check(rx_t *r)
{
    if (r->check_queued)
        return;
    r->check_queued = true;
    task_t *t = td__new_task(TASK_RX_CHECK);
    t->rx = r;
    td__queue_task(r->peer->kvx, t);
}

void td__op_finished(td_kvx_peer_t *p, xfer_t *x, rx_t *r, ucs_status_t st)
{
    TD_ASSERT(p->ops_out > 0);
    p->ops_out--;
    if (x) {
        TD_ASSERT(x->ops_out > 0);
        x->ops_out--;
        if (st != UCS_OK && x->status == 0)
            x->status = td__ucs_to_td(st);
        td__queue_tx_check(x);
    }
    if (r) {
        TD_ASSERT(r->ops_out > 0);
        r->ops_out--;
        if (st != UCS_OK && r->status == 0)
            r->status = td__ucs_to_td(st);
        else if (st == UCS_OK)
            r->runs_done++;
        td__queue_rx_check(r);
    }
}

/* Run one task: the handler of its type, in the file of its concern. */
static void run_task(td_kvx_t *k, task_t *t)
{
    switch (t->type) {
    case TASK_HELLO:
        td__peer_hello(k, t);
        break;
    case TASK_HELLO_ACK:
        td__peer_hello_ack(k, t);
        break;
    case TASK_RECV:
        td__rx_recv(k, t);
        break;
    case TASK_RX_CHECK:
        td__rx_check(t->rx);
        break;
    case TASK_TX_CHECK:
        td__tx_check(t->x);
        break;
    case TASK_ACK:
        td__tx_ack(k, t);
        break;
    case TASK_PULL:
        td__serve_pull(k, t);
        break;
    case TASK_FETCH:
        td__serve_fetch(k, t);
        break;
    case TASK_PEER_ERR:
        td__peer_ep_error(k, t);
        break;
    }
}

/* Run the tasks queued so far (not those they queue). True when any ran. */
bool td__run_tasks(td_kvx_t *k)
{
    task_t *t = k->tq_head;
    if (!t)
        return false;
    k->tq_head = k->tq_tail = NULL;
    while (t) {
        task_t *next = t->next;
        run_task(k, t);
        free(t->data);
        free(t);
        t = next;
    }
    return true;
}

/* Advance the teardown of every failed peer whose endpoint is still open, and close the retired
 * endpoints that are done. */
static void teardown_steps(td_kvx_t *k)
{
    for (td_kvx_peer_t *p = k->peers; p; p = p->next) {
        if (p->tearing)
            td__peer_teardown_step(p);
        if (p->retired)
            td__peer_retired_step(p);
    }
}

/* ---- loop integration ------------------------------------------------------------------------*/

static void idle_cb(uv_idle_t *h);
static void tick_cb(uv_timer_t *h);

uint32_t td__total_ops(const td_kvx_t *k)
{
    uint32_t n = 0;
    for (const td_kvx_peer_t *p = k->peers; p; p = p->next)
        n += p->ops_out;
    return n;
}

/* True while any operation is in flight or any transfer, ours or a peer's, is not finished. */
static bool transfers_open(const td_kvx_t *k)
{
    for (const td_kvx_peer_t *p = k->peers; p; p = p->next)
        if (p->ops_out > 0 || p->rx || (p->tx && p->state == PEER_READY))
            return true;
    return false;
}

/* Progress the worker and run tasks until nothing is left, then arm the event fd so the loop can
 * sleep. While operations are in flight it does not sleep: it keeps an idle handle active so the
 * loop polls the worker once per iteration (UCX's shared-memory transports do not signal the
 * event fd when send resources free up, and a rendezvous needs both sides to progress; measured
 * on sm: 0.08 GB/s sleeping between events against 0.9 polling while busy). When idle, it arms
 * the worker and the loop sleeps. Bounded: under sustained traffic it yields to the loop. */
static void service(td_kvx_t *k)
{
    if (k->in_service || !k->worker)
        return;
    k->in_service = true;
    bool spin = true, progressed = false;
    for (int round = 0; round < SERVICE_ROUNDS; round++) {
        unsigned n = 0;
        while (n < 1024 && ucp_worker_progress(k->worker))
            n++;
        bool did = td__run_tasks(k);
        teardown_steps(k);
        if (did || n > 0) {
            k->spin_until_ns = td_now_ns() + SPIN_NS;
            progressed = true;
        }
        if (did || k->tq_head)
            continue;
        if (n > 0 && round + 1 < SERVICE_ROUNDS)
            continue;
        if (k->busy_poll || td__total_ops(k) > 0 || td_now_ns() < k->spin_until_ns)
            break; /* poll again on the next loop iteration */
        if (ucp_worker_arm(k->worker) == UCS_ERR_BUSY)
            continue;
        spin = false;
        break;
    }
    if (spin && !progressed)
        sched_yield(); /* let the peer we wait for run: on an oversubscribed host a spinning
                          receiver otherwise holds the core its sender needs for a time slice */
    if (spin)
        uv_idle_start(&k->idle, idle_cb);
    else
        uv_idle_stop(&k->idle);
    bool open = !spin && transfers_open(k);
    if (open && !k->tick_on && !k->closing)
        uv_timer_start(&k->tick, tick_cb, TICK_MS, TICK_MS);
    else if (!open && k->tick_on)
        uv_timer_stop(&k->tick);
    k->tick_on = open;
    k->in_service = false;
}

/* The fallback wakeup every TICK_MS while some transfer is open and the worker is armed. */
static void tick_cb(uv_timer_t *h)
{
    service(h->data);
}

/* Polling while busy: runs once per loop iteration while the idle handle is started. */
static void idle_cb(uv_idle_t *h)
{
    service(h->data);
}

/* Before every sleep of the loop: catch up with what user code started since the last service. */
static void prepare_cb(uv_prepare_t *h)
{
    service(h->data);
}

/* The worker's event fd is readable: UCX has something to progress. */
static void poll_cb(uv_poll_t *h, int status, int events)
{
    td_kvx_t *k = h->data;
    k->stats.wakeups++;
    service(k);
}

/* Every 50 ms while a handshake, a teardown or a retired endpoint is pending: fail handshakes past
 * their deadline, advance teardowns, close retired endpoints that are done, and stop once none is
 * left. */
static void timer_cb(uv_timer_t *h)
{
    td_kvx_t *k = h->data;
    uint64_t now = td_now_ns();
    bool need = false;
    for (td_kvx_peer_t *p = k->peers; p; p = p->next) {
        if (p->state == PEER_CONNECTING && now > p->deadline_ns) {
            TD_LOG_W("kvx: peer %016llx: no answer to HELLO in %.1f s",
                     (unsigned long long)p->instance, k->opts.connect_s);
            td__peer_fail(p, td_err_set(TD_ETIMEDOUT, "kvx: handshake timed out"));
        }
        if (p->tearing)
            td__peer_teardown_step(p);
        if (p->retired && td__peer_retired_step(p))
            need = true;
        if (p->state == PEER_CONNECTING || p->tearing)
            need = true;
    }
    if (!need) {
        uv_timer_stop(&k->timer);
        k->timer_on = false;
    }
    service(k);
}

void td__start_timer(td_kvx_t *k)
{
    if (k->timer_on || k->closing)
        return;
    k->timer_on = true;
    uv_timer_start(&k->timer, timer_cb, 50, 50);
}

/* ---- handles: start and close ----------------------------------------------------------------*/

/* Only the event-fd poll keeps the loop alive; the other handles are unreferenced. */
void td__loop_start(td_kvx_t *k)
{
    uv_loop_t *loop = k->loop;
    uv_poll_init(loop, &k->poll, k->efd);
    uv_prepare_init(loop, &k->prepare);
    uv_idle_init(loop, &k->idle);
    uv_timer_init(loop, &k->timer);
    uv_timer_init(loop, &k->tick);
    k->poll.data = k->prepare.data = k->idle.data = k->timer.data = k->tick.data = k;
    k->handles_open = 5;
    uv_poll_start(&k->poll, UV_READABLE, poll_cb);
    uv_prepare_start(&k->prepare, prepare_cb);
    uv_unref((uv_handle_t *)&k->prepare);
    uv_unref((uv_handle_t *)&k->idle);
    uv_unref((uv_handle_t *)&k->timer);
    uv_unref((uv_handle_t *)&k->tick);
}

/* Close callback of each handle: the last one frees k (the handles live inside it), then runs the
 * user's close callback. */
static void handle_closed(uv_handle_t *h)
{
    td_kvx_t *k = h->data;
    if (--k->handles_open > 0)
        return;
    void (*cb)(void *) = k->close_cb;
    void *arg = k->close_arg;
    free(k);
    if (cb)
        cb(arg);
}

void td__loop_close(td_kvx_t *k)
{
    uv_close((uv_handle_t *)&k->poll, handle_closed);
    uv_close((uv_handle_t *)&k->prepare, handle_closed);
    uv_close((uv_handle_t *)&k->idle, handle_closed);
    uv_close((uv_handle_t *)&k->timer, handle_closed);
    uv_close((uv_handle_t *)&k->tick, handle_closed);
}
