/*
 * spare.c - the skip policy's substitutes (datahelix/spare.h): which ids of
 * this rank's schedule stand in for a step's failed samples.
 *
 * Design: a seeded draw over the other steps of the schedule, a pure
 * function of its arguments (no state, no clock), bounded by 8 draws per
 * spare wanted.  Drawing a step first and then a position in it keeps a
 * short step as likely as a long one to give a spare; the ids refused
 * (already in step k, already chosen) cost one draw each.
 */
#include "datahelix/spare.h"
#include "core/hash.h"

#define SPARE_SALT 0x5350415245ull /* "SPARE" */
#define DRAWS_PER_SPARE 8

static int in_range(const uint64_t *ids, uint64_t lo, uint64_t hi, uint64_t v)
{
    for (uint64_t i = lo; i < hi; i++)
        if (ids[i] == v)
            return 1;
    return 0;
}

static uint64_t draw(uint64_t seed, uint64_t epoch, uint64_t step,
                     uint32_t rank, uint64_t d)
{
    return dh__mix64(
        seed ^
        dh__mix64(
            epoch ^
            dh__mix64(step ^ dh__mix64(rank ^ dh__mix64(d + SPARE_SALT)))));
}

uint32_t dh_spare_choose(uint64_t seed, uint64_t epoch, uint64_t step,
                         uint32_t rank, const uint64_t *ids,
                         const uint64_t *offs, uint64_t n_steps, uint64_t k,
                         uint32_t want, uint64_t *out)
{
    uint64_t draws = (uint64_t)want * DRAWS_PER_SPARE;
    uint32_t n = 0;

    if (n_steps < 2 || k >= n_steps)
        return 0;
    for (uint64_t d = 0; d < draws && n < want; d++) {
        uint64_t h = draw(seed, epoch, step, rank, d);
        uint64_t q = (k + 1 + h % (n_steps - 1)) % n_steps;
        uint64_t size = offs[q + 1] - offs[q];
        uint64_t id;

        if (offs[q + 1] <= offs[q])
            continue;
        id = ids[offs[q] + (h >> 32) % size];
        if (in_range(ids, offs[k], offs[k + 1], id) || in_range(out, 0, n, id))
            continue;
        out[n++] = id;
    }
    return n;
}
