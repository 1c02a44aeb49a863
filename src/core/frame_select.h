/*
 * frame_select.h - which source frames a sampling plan takes (internal,
 * pure: no I/O, no allocation).  The media pipeline feeds it the clip's
 * frame table; the simulator and planner may call it on descriptors.
 */
#ifndef DH_CORE_FRAME_SELECT_H
#define DH_CORE_FRAME_SELECT_H

#include <stdint.h>

#include "datahelix/error.h"
#include "datahelix/media.h"

/* What frame selection needs to know about a clip. */
struct dh__clip_frames {
    int64_t n;          /* presentation frames, >= 1 */
    const int64_t *pts; /* n presentation timestamps, ascending, or NULL
                           (then frame i is at i / fps seconds) */
    double time_base;   /* seconds per pts unit (with pts) */
    double fps;         /* frames per second (> 0 when pts is NULL) */
    const int64_t *key; /* presentation indices of keyframes, ascending */
    int64_t nkey;
};

/*
 * Fills out[0..*count) with the source frame index of each output frame of
 * plan `p` (-1 for zero padding) and sets *valid to how many came from the
 * clip (the rest are padding: the last index repeated, or -1).  `out` holds
 * DH_MEDIA_MAX_FRAMES entries.  *stride is the mean gap between planned
 * frames, in frames (the default snap tolerance is half of it).
 * Errors (DH_EINVAL with a message): an index out of range, a plan asking
 * for more than DH_MEDIA_MAX_FRAMES frames.
 *
 * Per kind (n = c->n, N = p->frames):
 *   UNIFORM  n >= N: frame floor((i + 0.5) n / N) of each of N segments
 *            (TSN test sampling), stride n / N; n < N: 0..n-1 then padding.
 *   FPS      times k / p->fps while inside the clip (duration = last pts -
 *            first pts + the mean frame gap, or n / c->fps without pts),
 *            each the nearest frame by time (ties: the earlier); repeats
 *            when p->fps is above the clip's rate; at most N when N > 0;
 *            with N == 0 more than DH_MEDIA_MAX_FRAMES is an error.
 *            stride = clip fps / p->fps.  Never padded; at least 1 frame.
 *   INDICES  the caller's indices in the caller's order (not sorted);
 *            stride = mean |gap| between neighbours (1 for one index).
 *   JITTER   n <= N: as UNIFORM's short clip.  Else stride s uniform in
 *            1..(n-1)/(N-1), offset uniform in 0..n-1-(N-1)s, frames
 *            offset + i s (N == 1: one uniform frame); SplitMix64(p->seed),
 *            so the same seed gives the same frames.
 *   ALL      0..min(n, DH_MEDIA_MAX_FRAMES)-1.
 * On error out[] may have been written; *count, *valid, *stride not.
 */
int dh__frames_plan(const struct dh_media_plan *p,
                    const struct dh__clip_frames *c, int64_t *out,
                    int64_t *count, int64_t *valid, double *stride,
                    struct dh_err *e) DH_MUST_CHECK;

/*
 * Snaps the first `valid` targets in idx[] (ascending) to the nearest of
 * the `ncand` ascending candidate indices cand[] within `tol` frames, never
 * using a candidate twice while another unused one is within tolerance;
 * a target with no candidate in reach keeps its index.  Returns the mean
 * |shift| over the targets.  Pure; idx is updated in place and stays
 * ascending.
 *
 * Greedy in target order: each target takes the nearest candidate in
 * [t - tol, t + tol] (ties: the earlier) that is above the previous
 * target's result (so no candidate is used twice) and not past the next
 * target's planned index (below it when they differ, at most equal when
 * the plan repeats a frame).  tol < 0 or NaN moves nothing; callers
 * resolve "<= 0: half the stride" before calling.  Entries past `valid`
 * are not touched: after snapping, the caller re-derives REPEAT padding
 * from the new idx[valid - 1] (ZERO padding stays -1).
 */
double dh__frames_snap(int64_t *idx, int64_t valid, const int64_t *cand,
                       int64_t ncand, double tol);

#endif
