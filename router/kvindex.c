/* kvindex.c: open-addressing table (linear probing, tombstones) from block hash to holders. The
 * first holder of a block lives in its slot (most blocks have one), further ones in an array, so
 * a mirror of 1M blocks costs one allocation, not a million (a router's rebuild from Redis is
 * bounded by this table's inserts). */
#include "kvindex.h"
#include "td_error.h"
#include "td_util.h"

#include <stdlib.h>
#include <string.h>

typedef struct holder {
    uint32_t worker;
    uint8_t tier;
} holder_t;

typedef enum { SLOT_EMPTY = 0, SLOT_FULL, SLOT_DEAD } slot_state_t;

typedef struct slot {
    td_kvhash_t key;
    uint32_t worker0;  /* holder 0 */
    uint8_t tier0;
    uint8_t state;     /* slot_state_t */
    uint8_t n;         /* holders in use: holder 0, then more[0 .. n-1) */
    uint8_t cap;       /* more[] allocated */
    holder_t *more;
} slot_t;

struct td_kvindex {
    slot_t *slots; /* [cap], cap a power of two */
    size_t cap;
    size_t used;   /* FULL slots */
    size_t dead;   /* tombstones */
    size_t more;   /* holder_t allocated in slots' more[] arrays */
};

#define MAX_HOLDERS 255

static uint64_t key_hash(const td_kvhash_t *h)
{
    uint64_t v;
    memcpy(&v, h->b, sizeof(v)); /* the key is already a uniform hash */
    return v;
}

td_kvindex_t *td_kvindex_new(void)
{
    td_kvindex_t *ix = calloc(1, sizeof(*ix));
    if (!ix)
        return NULL;
    ix->cap = 1024;
    ix->slots = calloc(ix->cap, sizeof(slot_t));
    if (!ix->slots) {
        free(ix);
        return NULL;
    }
    return ix;
}

void td_kvindex_free(td_kvindex_t *ix)
{
    if (!ix)
        return;
    for (size_t i = 0; i < ix->cap; i++)
        free(ix->slots[i].more);
    free(ix->slots);
    free(ix);
}

static slot_t *find(const td_kvindex_t *ix, const td_kvhash_t *h)
{
    size_t mask = ix->cap - 1;
    for (size_t i = key_hash(h) & mask, probes = 0; probes < ix->cap; i = (i + 1) & mask, probes++) {
        slot_t *s = &ix->slots[i];
        if (s->state == SLOT_EMPTY)
            return NULL;
        if (s->state == SLOT_FULL && memcmp(&s->key, h, sizeof(*h)) == 0)
            return s;
    }
    return NULL;
}

/* Rehash into `cap` slots (a power of two above the live ones), dropping tombstones. */
static int rehash(td_kvindex_t *ix, size_t cap)
{
    slot_t *slots = calloc(cap, sizeof(slot_t));
    if (!slots)
        return TD_ENOMEM;
    for (size_t i = 0; i < ix->cap; i++) {
        slot_t *s = &ix->slots[i];
        if (s->state != SLOT_FULL)
            continue;
        size_t j = key_hash(&s->key) & (cap - 1);
        while (slots[j].state == SLOT_FULL)
            j = (j + 1) & (cap - 1);
        slots[j] = *s;
    }
    free(ix->slots);
    ix->slots = slots;
    ix->cap = cap;
    ix->dead = 0;
    return 0;
}

/* The smallest power-of-two capacity that keeps `n` slots under 3/4 load. */
static size_t cap_for(size_t n)
{
    size_t cap = 1024;
    while ((n + 1) * 4 > cap * 3)
        cap *= 2;
    return cap;
}

int td_kvindex_reserve(td_kvindex_t *ix, size_t blocks)
{
    size_t cap = cap_for(blocks + ix->dead);
    return cap > ix->cap ? rehash(ix, cap) : 0;
}

static holder_t *holder_at(slot_t *s, uint8_t k, holder_t *tmp)
{
    if (k == 0) {
        *tmp = (holder_t){s->worker0, s->tier0};
        return tmp;
    }
    return &s->more[k - 1];
}

int td_kvindex_add(td_kvindex_t *ix, const td_kvhash_t *h, uint32_t worker, uint8_t tier)
{
    slot_t *s = find(ix, h);
    if (!s) {
        if ((ix->used + ix->dead + 1) * 4 > ix->cap * 3) { /* keep load under 3/4 */
            int rc = rehash(ix, ix->used * 2 >= ix->cap ? ix->cap * 2 : ix->cap);
            if (rc)
                return rc;
        }
        size_t mask = ix->cap - 1, i = key_hash(h) & mask;
        while (ix->slots[i].state == SLOT_FULL)
            i = (i + 1) & mask;
        s = &ix->slots[i];
        if (s->state == SLOT_DEAD)
            ix->dead--;
        *s = (slot_t){.key = *h, .worker0 = worker, .tier0 = tier, .state = SLOT_FULL, .n = 1};
        ix->used++;
        return 0;
    }
    if (s->worker0 == worker) {
        s->tier0 = tier;
        return 0;
    }
    for (uint8_t k = 1; k < s->n; k++) {
        if (s->more[k - 1].worker == worker) {
            s->more[k - 1].tier = tier;
            return 0;
        }
    }
    if (s->n == MAX_HOLDERS)
        return TD_ENOSPC;
    if (s->n - 1 == s->cap) {
        uint8_t cap = s->cap ? (uint8_t)TD_MIN(2 * s->cap, MAX_HOLDERS - 1) : 2;
        holder_t *hs = realloc(s->more, cap * sizeof(holder_t));
        if (!hs)
            return TD_ENOMEM;
        ix->more += cap - s->cap;
        s->more = hs;
        s->cap = cap;
    }
    s->more[s->n++ - 1] = (holder_t){worker, tier};
    return 0;
}

static void drop_holder(td_kvindex_t *ix, slot_t *s, uint8_t k)
{
    if (s->n == 1) {
        ix->more -= s->cap;
        free(s->more);
        s->more = NULL;
        s->cap = 0;
        s->n = 0;
        s->state = SLOT_DEAD;
        ix->used--;
        ix->dead++;
        return;
    }
    holder_t last = s->more[s->n - 2]; /* the last holder takes k's place */
    s->n--;
    if (k == 0) {
        s->worker0 = last.worker;
        s->tier0 = last.tier;
    } else {
        s->more[k - 1] = last;
    }
}

static int holder_index(slot_t *s, uint32_t worker)
{
    if (s->worker0 == worker)
        return 0;
    for (uint8_t k = 1; k < s->n; k++)
        if (s->more[k - 1].worker == worker)
            return k;
    return -1;
}

void td_kvindex_remove(td_kvindex_t *ix, const td_kvhash_t *h, uint32_t worker)
{
    slot_t *s = find(ix, h);
    int k = s ? holder_index(s, worker) : -1;
    if (k >= 0)
        drop_holder(ix, s, (uint8_t)k);
}

void td_kvindex_remove_worker(td_kvindex_t *ix, uint32_t worker)
{
    for (size_t i = 0; i < ix->cap; i++) {
        slot_t *s = &ix->slots[i];
        int k = s->state == SLOT_FULL ? holder_index(s, worker) : -1;
        if (k >= 0)
            drop_holder(ix, s, (uint8_t)k);
    }
}

int td_kvindex_tier(const td_kvindex_t *ix, const td_kvhash_t *h, uint32_t worker)
{
    slot_t *s = find(ix, h);
    int k = s ? holder_index(s, worker) : -1;
    holder_t tmp;
    return k < 0 ? -1 : holder_at(s, (uint8_t)k, &tmp)->tier;
}

size_t td_kvindex_prefix(const td_kvindex_t *ix, const td_kvhash_t *hashes, size_t n,
                         uint32_t worker, uint8_t max_tier)
{
    return td_kvindex_prefix_tiers(ix, hashes, n, worker, max_tier, NULL);
}

size_t td_kvindex_prefix_tiers(const td_kvindex_t *ix, const td_kvhash_t *hashes, size_t n,
                               uint32_t worker, uint8_t max_tier, size_t *slow)
{
    size_t i = 0, below = 0;
    for (; i < n; i++) {
        int t = td_kvindex_tier(ix, &hashes[i], worker);
        if (t < 0 || t > max_tier)
            break;
        below += t > TD_TIER_POOL;
    }
    if (slow)
        *slow = below;
    return i;
}

void td_kvindex_prefetch(const td_kvindex_t *ix, const td_kvhash_t *h)
{
    __builtin_prefetch(&ix->slots[key_hash(h) & (ix->cap - 1)], 1);
}

size_t td_kvindex_blocks(const td_kvindex_t *ix)
{
    return ix->used;
}

size_t td_kvindex_bytes(const td_kvindex_t *ix)
{
    return sizeof(*ix) + ix->cap * sizeof(slot_t) + ix->more * sizeof(holder_t);
}
