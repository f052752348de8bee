/* half_fixture.h: IEEE half <-> float for tests, independent of the CPU backend's conversions:
 * the compiler's _Float16 where it has one. Clang before 15 has none on x86 (and its __fp16 calls
 * a helper Debian's clang 14 does not link); there, mkmodel's exact bit conversions, which write
 * the F16 test models. Tests that include this link modelgen. */
#ifndef TD_TEST_HALF_FIXTURE_H
#define TD_TEST_HALF_FIXTURE_H

#include <stdint.h>
#include <string.h>

#if defined(__clang__) && __clang_major__ < 15 && (defined(__x86_64__) || defined(__i386__))
#include "modelgen_impl.h"

/* f rounded to the nearest half (ties to even), as its bits */
static inline uint16_t fx_f32_to_f16(float f)
{
    return td__mg_f32_to_f16(f);
}

/* the half with bits h, exactly */
static inline float fx_f16_to_f32(uint16_t h)
{
    return td__mg_f16_to_f32(h);
}
#else
static inline uint16_t fx_f32_to_f16(float f)
{
    _Float16 v = (_Float16)f;
    uint16_t h;
    memcpy(&h, &v, 2);
    return h;
}

static inline float fx_f16_to_f32(uint16_t h)
{
    _Float16 v;
    memcpy(&v, &h, 2);
    return (float)v;
}
#endif

#endif
