/*
 * media_decode.c - decode only what the plan needs (issue "Media pipeline",
 * DESIGN 6).
 *
 * Design: targets are visited in presentation order.  Before each one the
 * decoder either goes on from where it is (the target lies in the GOP being
 * decoded) or seeks to the keyframe at or before it (a later GOP: skipping
 * whole GOPs beats decoding them).  While the next target is ahead, packets
 * that cannot be it are decoded with AVDISCARD_NONREF, so non-reference
 * pictures are not even reconstructed.  Decoded pictures are identified by
 * timestamp through the frame table, so a seek that lands early costs time,
 * never exactness; one that lands late (or past the end) is retried from
 * earlier keyframes and then by decoding forward from the start, which
 * every container can do.  Snap-to-keyframe decodes each target's keyframe
 * alone: seek, one packet, drain.
 *
 * Not thread-safe: one dh_media per worker.
 */
#include <stdlib.h>
#include <string.h>

#include "core/frame_select.h"
#include "core/clock.h"
#include "datahelix/audio.h"
#include "datahelix/media_stages.h"
#include "media/media_internal.h"

struct run {
    struct dh_media *m;
    const struct dh_media_plan *p;
    uint8_t *dst;
    int64_t *ord; /* output slots of the valid part, by source index */
    int64_t next; /* position in ord of the next target */
    int64_t valid;
    int64_t counter; /* counting mode: output order of the last frame */
    int missed;      /* a target went by without its picture */
    int accept;      /* snap-to-key: the first picture serves the target */
    /* snap to reference frames */
    int ref;
    double tol;
    int64_t best;      /* candidate written for the current target, -1 */
    int64_t last_used; /* no candidate at or before this is used again */
    int64_t nfb;       /* targets left for the exact pass, in m->fb */
};

static int64_t target(const struct run *r)
{
    return r->m->idx[r->ord[r->next]];
}

static int is_ascending(const int64_t *a, int64_t n)
{
    for (int64_t i = 1; i < n; i++)
        if (a[i] < a[i - 1])
            return 0;
    return 1;
}

static void clip_view(const struct dh_media *m, struct dh__clip_frames *c)
{
    memset(c, 0, sizeof(*c));
    c->n = m->n;
    c->pts = m->counting ? NULL : m->pts;
    c->time_base = m->tb;
    c->fps = m->info.fps > 0 ? m->info.fps : 25.0;
    c->key = m->key_idx;
    c->nkey = m->counting ? 0 : m->nkey;
}

static int select_frames(struct dh_media *m, const struct dh_media_plan *p,
                         int64_t *out_frames, struct dh_err *e)
{
    struct dh__clip_frames c;
    struct dh_err sub;
    int rc;

    if (!m->fc)
        return dh_err_set(e, DH_EINVAL, "media: no file is open");
    if ((rc = dh_media_plan_check(p, e)))
        return rc;
    if (p->geometry == DH_GEOM_NATIVE)
        return dh_err_set(e, DH_EINVAL,
                          "%s: a native-size plan is resolved per file "
                          "first (dh_media_plan_resolve)",
                          m->name);
    clip_view(m, &c);
    m->selected = 0;
    if (m->image) { /* a still image is one frame, whatever the plan */
        m->idx[0] = 0;
        m->count = m->valid = 1;
        m->stride = 1;
    } else if ((rc = dh__frames_plan(p, &c, m->idx, &m->count, &m->valid,
                                     &m->stride, &sub))) {
        return dh_err_set(e, rc, "%s: %s", m->name, sub.msg);
    }
    if ((rc = dh_media_plan_check_pixels(p, m->count, &sub)))
        return dh_err_set(e, rc, "%s: %s", m->name, sub.msg);
    m->shift = 0;
    memcpy(m->planned, m->idx, (size_t)m->count * sizeof(*m->idx));
    if (p->snap == DH_SNAP_KEY && c.nkey > 0 &&
        is_ascending(m->idx, m->valid)) {
        double tol = p->snap_tol > 0 ? p->snap_tol : m->stride / 2;
        m->shift = dh__frames_snap(m->idx, m->valid, m->key_idx, m->nkey, tol);
        for (int64_t i = m->valid; i < m->count; i++)
            if (m->idx[i] >= 0)
                m->idx[i] = m->idx[m->valid - 1];
    }
    m->sel_plan = *p;
    m->selected = 1;
    *out_frames = m->count;
    return 0;
}

/* The public entry, timed as the DH_MS_READ stage (media_stages.h). */
int dh_media_select(struct dh_media *m, const struct dh_media_plan *p,
                    int64_t *out_frames, struct dh_err *e)
{
    double t0 = dh__mono_msf();
    int rc = select_frames(m, p, out_frames, e);

    m->stage_ms[DH_MS_READ] += dh__mono_msf() - t0;
    return rc;
}

const int64_t *dh_media_indices(const struct dh_media *m)
{
    return m->idx;
}

/* ---- delivery ---- */

/* Snap-to-reference: only reference pictures are decoded; each target
 * takes the nearest one within the tolerance (written at once, rewritten if
 * a nearer one follows), and a target none reaches is kept for an exact
 * pass.  Targets ascend, candidates are used once. */
static int settle(struct run *r, struct dh_err *e)
{
    struct dh_media *m = r->m;
    int64_t slot = r->ord[r->next];
    int rc = 0;

    if (r->best >= 0) {
        m->idx[slot] = r->best;
        r->last_used = r->best;
        rc = dh__media_emit(m, r->p, m->hold, slot, r->dst, e);
        av_frame_unref(m->hold);
    } else {
        m->fb[r->nfb++] = slot;
    }
    r->best = -1;
    r->next++;
    return rc;
}

static int deliver_ref(struct run *r, AVFrame *f, int64_t k, struct dh_err *e)
{
    struct dh_media *m = r->m;
    int rc;

    while (r->next < r->valid) {
        int64_t t = target(r);
        if (k <= r->last_used || (double)k < (double)t - r->tol)
            return 0;
        if ((double)k > (double)t + r->tol) {
            if ((rc = settle(r, e))) /* k may still serve the next target */
                return rc;
            continue;
        }
        if (r->best < 0 || llabs(k - t) < llabs(r->best - t)) {
            /* Held without a copy until settled: scaled once. */
            av_frame_unref(m->hold);
            av_frame_move_ref(m->hold, f);
            r->best = k;
        }
        return k >= t ? settle(r, e) : 0; /* later pictures are farther */
    }
    return 0;
}

/* A picture of presentation index k came out: it serves every pending
 * target <= k (a target the decoder never produced - a damaged picture -
 * gets the next one rather than nothing). */
static int deliver(struct run *r, AVFrame *f, int64_t k, struct dh_err *e)
{
    struct dh_media *m = r->m;
    int rc;

    if (r->ref)
        return deliver_ref(r, f, k, e);
    if (r->missed)
        return 0;
    if (r->accept && r->next < r->valid) {
        m->idx[r->ord[r->next]] = k; /* the keyframe as it really is */
        r->accept = 0;
        rc = dh__media_emit(m, r->p, f, r->ord[r->next], r->dst, e);
        r->next++;
        return rc;
    }
    while (r->next < r->valid && target(r) <= k) {
        int64_t slot = r->ord[r->next];
        int dup = r->next > 0 && m->idx[r->ord[r->next - 1]] == target(r);
        if (target(r) < k && !dup) {
            /* Its picture never came: a leading picture of an open GOP
             * the seek skipped, or a damaged one.  Never hand over a
             * neighbour instead: the caller retries or fails. */
            r->missed = 1;
            return 0;
        }
        if (dup) {
            dh__media_fill(r->p, r->dst, slot, r->ord[r->next - 1]);
        } else if ((rc = dh__media_emit(m, r->p, f, slot, r->dst, e))) {
            return rc;
        }
        r->next++;
    }
    return 0;
}

static int64_t picture_index(struct run *r, const AVFrame *f)
{
    int64_t ts = dh__media_picture_ts(f);

    if (r->m->counting || ts == AV_NOPTS_VALUE)
        return r->counter++;
    return dh__media_frame_index(r->m, ts);
}

int dh__media_read_frame(struct dh_media *m)
{
    int rc = av_read_frame(m->fc, m->pkt);

    /* a demuxer may take a failed read for the end of its input: the
     * clip would end early, silently */
    if (rc == AVERROR_EOF && m->src.failed)
        rc = AVERROR(EIO);
    return rc;
}

int dh__media_av_fail(struct dh_media *m, int rc, const char *what,
                      struct dh_err *e)
{
    char buf[128];
    int64_t at = m->last_index + 1;

    if (dh__media_overdue(m)) /* the interrupt callback cut a read */
        return dh__media_watchdog_error(m, e);
    if (m->src.failed) /* a read failed: its cause, not the demuxer's */
        return dh__source_input_error(&m->src, rc, e);
    return dh_err_set(e, DH_EMEDIA, "%s: %s%sframe %lld (%.3f s): %s", m->name,
                      what ? what : "", what ? " near " : "", (long long)at,
                      dh__media_frame_time(m, at),
                      dh__media_errstr(rc, buf, sizeof(buf)));
}

static int drain(struct dh_media *m, const char *what, dh__media_picture_fn pic,
                 void *ctx, struct dh_err *e)
{
    int rc;

    while ((rc = avcodec_receive_frame(m->cc, m->frame)) >= 0) {
        m->decoded++;
        /* A picture the decoder concealed errors in: its state is suspect. */
        if (m->frame->decode_error_flags ||
            (m->frame->flags & AV_FRAME_FLAG_CORRUPT))
            m->cc_tainted = 1;
        rc = dh__media_trustworthy(m, m->frame) ? pic(ctx, m->frame, e) : 0;
        av_frame_unref(m->frame);
        if (rc)
            return rc;
    }
    if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF)
        return 0;
    return dh__media_av_fail(m, rc, what, e);
}

int dh__media_feed(struct dh_media *m, const AVPacket *pkt, const char *what,
                   dh__media_picture_fn pic, void *ctx, struct dh_err *e)
{
    int rc;

    if (dh__media_overdue(m))
        return dh__media_watchdog_error(m, e);
    if (pkt)
        dh__media_note_packet(m, pkt);
    while ((rc = avcodec_send_packet(m->cc, pkt)) == AVERROR(EAGAIN))
        if ((rc = drain(m, what, pic, ctx, e)))
            return rc;
    if (rc < 0 && rc != AVERROR_EOF)
        return dh__media_av_fail(m, rc, what, e);
    return drain(m, what, pic, ctx, e);
}

/* A picture that may be a frame of the clip came out of the decoder. */
static int on_picture(void *ctx, AVFrame *f, struct dh_err *e)
{
    struct run *r = ctx;
    int64_t k = picture_index(r, f);

    r->m->last_index = k;
    return deliver(r, f, k, e);
}

static int send(struct run *r, const AVPacket *pkt, struct dh_err *e)
{
    return dh__media_feed(r->m, pkt, "decoding", on_picture, r, e);
}

/* Is presentation index k one of the targets not yet delivered?  (The
 * decoder's reorder delay means packets run ahead of delivery, so "before
 * the next target" is not the test.) */
static int pending(const struct run *r, int64_t k)
{
    int64_t lo = r->next, hi = r->valid - 1;

    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2, t = r->m->idx[r->ord[mid]];
        if (t == k)
            return 1;
        if (t < k)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return 0;
}

/* Packets that cannot be a pending target need no non-reference work. */
static void choose_discard(struct run *r, const AVPacket *pkt)
{
    struct dh_media *m = r->m;
    int64_t k;

    if (m->counting || pkt->pts == AV_NOPTS_VALUE) {
        m->cc->skip_frame = AVDISCARD_DEFAULT;
        return;
    }
    k = dh__media_frame_index(m, pkt->pts);
    if (pkt->flags & AV_PKT_FLAG_KEY)
        m->cur_key = dh__media_key_at_or_before(m, k);
    m->cc->skip_frame = !r->ref && pending(r, k) ? AVDISCARD_DEFAULT
                                                 : AVDISCARD_NONREF;
}

/* Reads and decodes one packet; 1 once the stream is drained. */
static int step(struct run *r, struct dh_err *e)
{
    struct dh_media *m = r->m;
    int rc;

    if (m->eof)
        return 1;
    rc = dh__media_read_frame(m);
    if (rc == AVERROR_EOF) {
        m->eof = 1;
        m->cc->skip_frame = AVDISCARD_DEFAULT;
        rc = send(r, NULL, e);
        return rc ? rc : 1;
    }
    if (rc < 0)
        return dh__media_av_fail(m, rc, "reading", e);
    if (m->pkt->stream_index == m->stream) {
        choose_discard(r, m->pkt);
        rc = send(r, m->pkt, e);
    }
    av_packet_unref(m->pkt);
    return rc;
}

/* Going on beats seeking when the target's keyframe is the one being
 * decoded, or only a few pictures ahead (intra-only streams, the start of
 * the next GOP): a seek flushes the decoder and re-reads the index. */
#define SEEK_GAP 8

static int must_seek(const struct dh_media *m, int64_t key, int64_t t)
{
    if (m->cur_key < 0 || m->eof || t <= m->last_index)
        return 1;
    return key > m->cur_key && m->key_idx[key] - m->last_index > SEEK_GAP;
}

/* Positions the decoder so that target t comes next. */
static int position_for(struct run *r, int64_t t, int back, struct dh_err *e)
{
    struct dh_media *m = r->m;
    int64_t key;

    if (m->forward_only) {
        if (t > m->last_index && !m->eof && !back)
            return 0;
        r->counter = 0;
        return dh__media_restart(m, e);
    }
    key = dh__media_key_at_or_before(m, t);
    if (!back && !must_seek(m, key, t))
        return 0;
    /* A retry starts `back` keyframes earlier: a leading picture of an
     * open GOP decodes only from the GOP before its keyframe. */
    return dh__media_rewind(m, key > back ? key - back : 0, e);
}

static int missing(struct run *r, struct dh_err *e)
{
    struct dh_media *m = r->m;

    return dh_err_set(e, DH_EMEDIA,
                      "%s: decoding ended after frame %lld, before frame "
                      "%lld of %lld (truncated or damaged)",
                      m->name, (long long)m->last_index, (long long)target(r),
                      (long long)m->n);
}

#define MAX_BACK 2 /* retries from earlier keyframes before giving up */

static int run_exact_one(struct run *r, struct dh_err *e)
{
    int64_t before = r->next;
    int rc = 0;

    for (int back = 0; back <= MAX_BACK; back++) {
        r->missed = 0;
        rc = position_for(r, target(r), back, e);
        while (!rc && r->next == before && !r->missed)
            rc = step(r, e);
        if (rc < 0 || r->next > before)
            return rc < 0 ? rc : 0;
        /* The stream ended first: final when decoding from the start, but
         * after a seek it may just have landed past the target. */
        if (!r->missed && r->m->forward_only)
            return missing(r, e);
        if (r->m->forward_only)
            break;
    }
    if (!r->m->forward_only) {
        /* Seeks keep missing: the container cannot seek reliably (or the
         * frame is damaged).  Decoding forward from the start settles it,
         * and this file is not sought in again. */
        r->m->forward_only = 1;
        r->m->fallbacks++;
        return run_exact_one(r, e);
    }
    return dh_err_set(e, DH_EMEDIA,
                      "%s: frame %lld did not come out of the decoder, even "
                      "decoding from the start (damaged, or a picture that "
                      "needs frames the file lacks)",
                      r->m->name, (long long)target(r));
}

static int64_t key_number(const struct dh_media *m, int64_t index)
{
    int64_t k = dh__media_key_at_or_before(m, index);

    return m->nkey > 0 && m->key_idx[k] == index ? k : -1;
}

/* Snap-to-key: seek, decode the keyframe's packet alone, drain. */
static int run_key_one(struct run *r, int64_t key, struct dh_err *e)
{
    struct dh_media *m = r->m;
    int64_t before = r->next;
    int rc = dh__media_rewind(m, key, e), averr = 0;

    m->cc->skip_frame = AVDISCARD_DEFAULT;
    while (!rc && (averr = dh__media_read_frame(m)) >= 0) {
        int mine = m->pkt->stream_index == m->stream;
        if (mine)
            rc = send(r, m->pkt, e);
        av_packet_unref(m->pkt);
        if (mine)
            break;
    }
    if (rc)
        return rc;
    if (averr < 0 && averr != AVERROR_EOF)
        return dh__media_av_fail(m, averr, "reading", e);
    r->accept = 1; /* whatever the keyframe turns out to be, it is used */
    rc = send(r, NULL, e);
    r->accept = 0;
    if (rc)
        return rc;
    avcodec_flush_buffers(m->cc); /* leave the drained state */
    dh__media_repositioned(m, -1);
    if (r->next == before) /* the keyframe did not decode: exact path */
        return run_exact_one(r, e);
    return 0;
}

/* Reference-snap pass for the current target's window. */
static int run_ref_one(struct run *r, struct dh_err *e)
{
    struct dh_media *m = r->m;
    int64_t before = r->next, t = target(r);
    int64_t lo = t - (int64_t)r->tol < 0 ? 0 : t - (int64_t)r->tol;
    /* The target's own GOP: the tail of an earlier one is not worth
     * decoding for a candidate a little nearer. */
    int64_t key = dh__media_key_at_or_before(m, t);
    int rc = 0;

    if ((double)m->last_index >= (double)t + r->tol ||
        must_seek(m, key, lo > m->last_index ? lo : m->last_index + 1))
        rc = dh__media_rewind(m, key, e);
    while (!rc && r->next == before)
        rc = step(r, e);
    if (rc < 0)
        return rc;
    while (rc == 1 && r->next < r->valid) { /* the stream ended: what is */
        int s = settle(r, e);               /* reached stays */
        if (s)
            return s;
    }
    return 0;
}

/* Snap to reference frames, then decode exactly the targets none reached. */
static int run_ref(struct run *r, struct dh_err *e)
{
    struct dh_media *m = r->m;
    int rc = 0;

    r->ref = 1;
    r->best = r->last_used = -1;
    while (!rc && r->next < r->valid)
        rc = run_ref_one(r, e);
    if (rc || r->nfb == 0)
        return rc;
    r->ref = 0;
    m->emit_in_order = 0; /* the leftovers fill earlier slots */
    r->ord = m->fb;
    r->valid = r->nfb;
    r->next = 0;
    m->cur_key = -1; /* the decoder skipped non-reference frames so far */
    while (!rc && r->next < r->valid)
        rc = run_exact_one(r, e);
    return rc;
}

static int run_all(struct run *r, struct dh_err *e)
{
    int rc = 0;

    if (r->p->snap == DH_SNAP_REF && !r->m->forward_only) {
        r->tol = r->p->snap_tol > 0 ? r->p->snap_tol : r->m->stride / 2;
        return run_ref(r, e);
    }
    while (!rc && r->next < r->valid) {
        int64_t key = r->p->snap == DH_SNAP_KEY ? key_number(r->m, target(r))
                                                : -1;
        /* Another target in the same GOP: decode it once, from its key. */
        if (key >= 0 && r->next + 1 < r->valid &&
            dh__media_key_at_or_before(r->m, r->m->idx[r->ord[r->next + 1]]) ==
                key)
            key = -1;
        rc = key >= 0 && !r->m->forward_only ? run_key_one(r, key, e)
                                             : run_exact_one(r, e);
    }
    return rc;
}

/* ---- entry point ---- */

static int64_t *sort_slots(struct dh_media *m, int64_t *ord)
{
    for (int64_t i = 0; i < m->valid; i++)
        ord[i] = i;
    /* Insertion sort, stable: plans are ascending already except explicit
     * index lists, which are short. */
    for (int64_t i = 1; i < m->valid; i++) {
        int64_t v = ord[i], j = i;
        while (j > 0 && m->idx[ord[j - 1]] > m->idx[v]) {
            ord[j] = ord[j - 1];
            j--;
        }
        ord[j] = v;
    }
    return ord;
}

static int check_dst(struct dh_media *m, const struct dh_media_plan *p,
                     size_t dst_len, struct dh_err *e)
{
    size_t need = dh_media_plan_bytes(p, m->count);

    if (need == SIZE_MAX || dst_len < need + DH_MEDIA_DST_PAD)
        return dh_err_set(e, DH_EINVAL,
                          "%s: destination holds %zu bytes, the plan needs "
                          "%zu + %d",
                          m->name, dst_len, need, DH_MEDIA_DST_PAD);
    return 0;
}

static int decode_frames(struct dh_media *m, const struct dh_media_plan *p,
                         void *dst, size_t dst_len, struct dh_media_result *res,
                         struct dh_err *e)
{
    struct run r;
    int64_t frames, seeks0, dec0, fb0;
    int rc;

    /* Snapping rewrites idx[] with the frames used: start from the plan. */
    if (!m->selected || memcmp(&m->sel_plan, p, sizeof(*p)) ||
        p->snap != DH_SNAP_EXACT)
        if ((rc = select_frames(m, p, &frames, e)))
            return rc;
    if ((rc = check_dst(m, p, dst_len, e)))
        return rc;
    m->emit_in_order = p->kind != DH_PLAN_INDICES;
    memset(&r, 0, sizeof(r));
    r.m = m;
    r.p = p;
    r.dst = dst;
    r.valid = m->valid;
    r.ord = sort_slots(m, m->ord);
    seeks0 = m->seeks;
    dec0 = m->decoded;
    fb0 = m->fallbacks;
    rc = run_all(&r, e);
    if (rc)
        return rc;
    m->shift = 0;
    for (int64_t i = 0; i < m->valid; i++)
        m->shift += (double)llabs(m->idx[i] - m->planned[i]);
    m->shift = m->valid ? m->shift / (double)m->valid : 0;
    for (int64_t i = m->valid; i < m->count; i++) {
        dh__media_fill(p, dst, i, p->pad == DH_PAD_REPEAT ? m->valid - 1 : -1);
        if (p->pad == DH_PAD_REPEAT)
            m->idx[i] = m->idx[m->valid - 1];
    }
    if (res) {
        res->frames = m->count;
        res->valid_frames = m->valid;
        res->decoded_frames = m->decoded - dec0;
        res->seeks = m->seeks - seeks0;
        res->seek_fallbacks = m->fallbacks - fb0;
        res->mean_abs_shift = m->shift;
    }
    return 0;
}

/* The public entry, timed as the DH_MS_DECODE stage (media_stages.h);
 * the time its source's reads took inside it (packets read between
 * decodes) is the read stage's: a slow store shows as read, not decode. */
int dh_media_decode(struct dh_media *m, const struct dh_media_plan *p,
                    void *dst, size_t dst_len, struct dh_media_result *res,
                    struct dh_err *e)
{
    double t0 = dh__mono_msf(), r0 = m->src.read_ms, reads;
    int rc = decode_frames(m, p, dst, dst_len, res, e);

    if (rc) /* any error: the decoder is not carried to the next file */
        m->cc_tainted = 1;
    reads = m->src.read_ms - r0;
    m->stage_ms[DH_MS_DECODE] += dh__mono_msf() - t0 - reads;
    m->stage_ms[DH_MS_READ] += reads;
    return rc;
}

/* ---- the span the selection covers (audio.h) ---- */

/* Source frame k's time on the container's clock, seconds: its timestamp,
 * or (frames identified by count) the stream's start plus k frames. */
static double frame_clock(const struct dh_media *m, int64_t k)
{
    const AVStream *st = m->fc->streams[m->stream];
    double fps = m->info.fps > 0 ? m->info.fps : 25.0;
    double t0 = st->start_time != AV_NOPTS_VALUE
                    ? (double)st->start_time * m->tb
                    : 0;

    if (m->counting || k < 0 || k >= m->n)
        return t0 + (double)k / fps;
    return (double)m->pts[k] * m->tb;
}

int dh__media_span(const struct dh_media *m, const struct dh_media_plan *p,
                   double *start_s, double *end_s)
{
    int64_t lo = INT64_MAX, hi = -1;
    double dur;

    if (!m->fc || !m->selected || m->valid < 1)
        return DH_EINVAL;
    if (m->image) {
        *start_s = 0;
        *end_s = 1.0 / 25;
        return 0;
    }
    for (int64_t i = 0; i < m->valid; i++) {
        if (m->idx[i] < 0)
            continue;
        lo = m->idx[i] < lo ? m->idx[i] : lo;
        hi = m->idx[i] > hi ? m->idx[i] : hi;
    }
    if (hi < 0)
        return DH_EINVAL;
    if (p->kind == DH_PLAN_FPS && p->fps > 0)
        dur = 1.0 / p->fps; /* each output frame stands for 1 / fps */
    else if (!m->counting && m->half > 0)
        dur = 2.0 * (double)m->half * m->tb;
    else
        dur = 1.0 / (m->info.fps > 0 ? m->info.fps : 25.0);
    *start_s = frame_clock(m, lo);
    *end_s = frame_clock(m, hi) + dur;
    if (*start_s < 0)
        *start_s = 0; /* before the clock's zero: no sound is there */
    if (!(*end_s > *start_s))
        *end_s = *start_s + dur;
    return 0;
}
