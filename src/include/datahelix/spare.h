/*
 * datahelix/spare.h - the skip policy's choice of substitutes (issue 15
 * item 2; docs/dataserver.md "Substitutes").
 *
 * A sample that fails under on_error="skip" is replaced, in its position,
 * by a spare: another sample of the same rank's schedule, so the step keeps
 * its planned size and every rank yields the same number of steps without
 * talking to the others.  Which spares a step gets is decided here, by the
 * client, before the request is sent: a pure function of (seed, epoch,
 * global step, rank) and the rank's own schedule of the pass, so the same
 * schedule gets the same spares in any process, on any pass, after any
 * re-route; a restart of a server or a re-issue cannot change them.
 *
 * Rule (dh_spare_choose): draw d = 0, 1, ... (at most 8 x want draws):
 *   h   = mix(seed ^ mix(epoch ^ mix(step ^ mix(rank ^ mix(d + SALT)))))
 *   q   = (k + 1 + h mod (n_steps - 1)) mod n_steps  (another step)
 *   id  = the ((h >> 32) mod size(q))-th id of step q
 * keeping an id unless it is in step k or already chosen.  Only this
 * rank's share: a spare never comes from another rank's samples, so a
 * substitute is a sample this rank reads anyway in the epoch (a repeat,
 * like DistributedSampler's padding), never one another rank is asked for.
 *
 * Thread-safety: pure.
 */
#ifndef DATAHELIX_SPARE_H
#define DATAHELIX_SPARE_H

#include <stdint.h>

/*
 * Writes up to `want` distinct spare ids for step position k (global step
 * `step`) of a schedule of n_steps steps, step q holding
 * ids[offs[q] .. offs[q + 1]), into out[]; returns how many (0 when the
 * schedule has one step, or every draw was refused).
 */
uint32_t dh_spare_choose(uint64_t seed, uint64_t epoch, uint64_t step,
                         uint32_t rank, const uint64_t *ids,
                         const uint64_t *offs, uint64_t n_steps, uint64_t k,
                         uint32_t want, uint64_t *out);

#endif
