/* stopstr.h: stop strings over a growing text, as the router applies them while streaming.
 *
 * The generated text grows at its end; after each growth the router asks whether a stop string
 * now occurs (td_stop_find: only occurrences that end in the new bytes are possible, so the
 * search starts just before them), and, when none does, how many bytes at the end must be held
 * back from the client because they could be the start of a stop string that the next tokens
 * complete (td_stop_holdback). Pure functions over bytes: no allocation, no state.
 */
#ifndef TD_ROUTER_STOPSTR_H
#define TD_ROUTER_STOPSTR_H

#include <stddef.h>

/* The earliest occurrence in text[0, len) of any of stop[0, n) (NUL-terminated, empty ones
 * ignored) that ends after byte `scanned` (the length already searched; `max_len` is the longest
 * stop string). Returns the index of the stop string that occurs first (the lowest index among
 * several starting at the same byte) with its start in *pos, or -1 when none occurs. */
int td_stop_find(const char *const *stop, size_t n, size_t max_len, const char *text, size_t len,
                 size_t scanned, size_t *pos);

/* The length of the longest suffix of text[0, len) that is a proper prefix of some stop string:
 * those bytes may not be released yet. 0 when no stop string could be starting. */
size_t td_stop_holdback(const char *const *stop, size_t n, const char *text, size_t len);

#endif
