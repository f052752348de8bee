/* fuzz_frame.c: the control-plane frame reader and protobuf unpacking. Input: a byte stream cut
 * into chunks of sizes taken from its first byte; every frame found is unpacked through the
 * connection's arena (td_frame_arena_t, as rpc.c does) and through malloc, and both must agree:
 * both fail, or both repack to the same bytes, which the one-pass packer (td_frame_encode) must
 * write too. */
#include "control.pb-c.h"
#include "fuzz.h"
#include "td_frame.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t chunk = 1 + data[0] % 64;
    data++, size--;
    td_frame_reader_t r;
    td_frame_reader_init(&r, 4096);
    td_frame_arena_t a;
    td_frame_arena_init(&a);
    for (size_t off = 0; off < size; off += chunk) {
        size_t n = size - off < chunk ? size - off : chunk;
        if (td_frame_reader_feed(&r, data + off, n) != 0)
            break; /* oversize frame: the connection would be closed */
        const uint8_t *p;
        size_t len;
        int rc;
        while ((rc = td_frame_reader_next(&r, &p, &len)) == 1) {
            Tandem__Frame *f = tandem__frame__unpack(NULL, len, p);
            Tandem__Frame *g = tandem__frame__unpack(td_frame_arena_allocator(&a), len, p);
            if (!f != !g)
                abort();
            if (f) {
                size_t sz = tandem__frame__get_packed_size(f);
                if (sz != tandem__frame__get_packed_size(g))
                    abort();
                uint8_t *x = malloc(sz ? sz : 1), *y = malloc(sz ? sz : 1);
                if (!x || !y)
                    abort();
                tandem__frame__pack(f, x);
                tandem__frame__pack(g, y);
                if (memcmp(x, y, sz) != 0)
                    abort();
                td_buf_t one; /* the one-pass packer (pbpack.c) writes protobuf-c's bytes */
                td_buf_init(&one);
                if (td_frame_encode(&g->base, &one) != 0 || one.len != TD_FRAME_HEADER + sz ||
                    memcmp(one.data + TD_FRAME_HEADER, x, sz) != 0)
                    abort();
                td_buf_free(&one);
                free(x);
                free(y);
                tandem__frame__free_unpacked(f, NULL);
            }
            td_frame_arena_reset(&a);
        }
        if (rc < 0)
            break;
    }
    td_frame_reader_free(&r);
    td_frame_arena_free(&a);
    return 0;
}

void fuzz_seed(td_buf_t *b)
{
    td_buf_append_char(b, 7); /* chunk size */
    Tandem__Load load = TANDEM__LOAD__INIT;
    load.free_blocks = 12;
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    hb.seq = 3;
    hb.load = &load;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_HEARTBEAT;
    f.heartbeat = &hb;
    td_frame_encode(&f.base, b);
    Tandem__Hello h = TANDEM__HELLO__INIT;
    h.worker_id = "decode-0";
    h.model = "tiny";
    uint8_t addr[40] = {1, 2, 3};
    h.ucx_address.data = addr;
    h.ucx_address.len = sizeof(addr);
    Tandem__Frame g = TANDEM__FRAME__INIT;
    g.body_case = TANDEM__FRAME__BODY_HELLO;
    g.hello = &h;
    td_frame_encode(&g.base, b);
}
