/* stopstr.c: stop-string search and hold-back (stopstr.h). */
#include "stopstr.h"

#include "td_util.h"

#include <string.h>

int td_stop_find(const char *const *stop, size_t n, size_t max_len, const char *text, size_t len,
                 size_t scanned, size_t *pos)
{
    size_t start = scanned >= max_len ? scanned - max_len + 1 : 0;
    int best = -1;
    size_t best_pos = 0;
    if (start > len)
        start = len;
    for (size_t k = 0; k < n; k++) {
        size_t sl = strlen(stop[k]);
        if (!sl || len - start < sl)
            continue;
        const char *hit = memmem(text + start, len - start, stop[k], sl);
        if (hit && (best < 0 || (size_t)(hit - text) < best_pos)) {
            best = (int)k;
            best_pos = (size_t)(hit - text);
        }
    }
    *pos = best_pos;
    return best;
}

size_t td_stop_holdback(const char *const *stop, size_t n, const char *text, size_t len)
{
    size_t h = 0;
    for (size_t k = 0; k < n; k++) {
        size_t sl = strlen(stop[k]);
        for (size_t m = TD_MIN(sl ? sl - 1 : 0, len); m > h; m--)
            if (memcmp(text + len - m, stop[k], m) == 0) {
                h = m;
                break;
            }
    }
    return h;
}
