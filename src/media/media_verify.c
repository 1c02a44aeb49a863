/*
 * media_verify.c - a full decode of the open file, checked against its
 * frame table (dh_media_verify, `datahelix probe --verify`).
 *
 * Why: the cheap checks at open (header counts and durations against the
 * packets) cannot see a picture that does not decode.  A training job finds
 * such a file at its first sample from it, possibly at step 16 on one rank
 * of many; a verified table finds it once, before the job.  So this decodes
 * every packet from the start, with no frame skipped and nothing scaled,
 * and fails on the first sign that the file does not give exactly the
 * frames the table promises.
 */
#include <string.h>

#include "media/media_internal.h"

struct vrun {
    struct dh_media *m;
    int64_t next; /* table index the next picture must have */
};

static int fail(struct dh_media *m, int64_t at, const char *what,
                struct dh_err *e)
{
    if (dh__media_overdue(m))
        return dh__media_watchdog_error(m, e);
    return dh_err_set(e, DH_EMEDIA, "%s: frame %lld (%.3f s): %s", m->name,
                      (long long)at, dh__media_frame_time(m, at), what);
}

static int check_picture(struct vrun *v, const AVFrame *f, struct dh_err *e)
{
    struct dh_media *m = v->m;
    int64_t ts = dh__media_picture_ts(f);
    char why[160];

    if (f->decode_error_flags || (f->flags & AV_FRAME_FLAG_CORRUPT))
        return fail(m, v->next, "the decoder reports the picture damaged", e);
    if (v->next >= m->n) {
        snprintf(why, sizeof(why),
                 "a picture past the %lld frames the file's packets promise",
                 (long long)m->n);
        return fail(m, v->next, why, e);
    }
    if (!m->counting && ts != AV_NOPTS_VALUE &&
        dh__media_frame_index(m, ts) != v->next) {
        snprintf(why, sizeof(why),
                 "the picture's timestamp %lld is that of frame %lld: a "
                 "frame before it did not decode",
                 (long long)ts, (long long)dh__media_frame_index(m, ts));
        return fail(m, v->next, why, e);
    }
    v->next++;
    return 0;
}

/* dh__media_feed()'s picture callback: m->last_index follows, so that a
 * decoder error names the frame after the last good one. */
static int on_picture(void *ctx, AVFrame *f, struct dh_err *e)
{
    struct vrun *v = ctx;
    int rc = check_picture(v, f, e);

    v->m->last_index = v->next - 1;
    return rc;
}

static int decode_everything(struct vrun *v, struct dh_media_verify *res,
                             struct dh_err *e)
{
    struct dh_media *m = v->m;
    int rc;

    m->cc->skip_frame = AVDISCARD_DEFAULT;
    while ((rc = dh__media_read_frame(m)) >= 0) {
        /* A packet the demuxer flags corrupt is not failed by itself: the
         * MPEG-TS demuxer flags the first packet after a continuity-counter
         * jump, which every pair of joined recordings has, intact or not.
         * Whether its picture decodes is what counts. */
        int mine = m->pkt->stream_index == m->stream;
        if (mine) {
            res->packets++;
            rc = dh__media_feed(m, m->pkt, NULL, on_picture, v, e);
        }
        av_packet_unref(m->pkt);
        if (rc)
            return rc;
    }
    if (rc != AVERROR_EOF)
        return dh__media_av_fail(m, rc, NULL, e);
    return dh__media_feed(m, NULL, NULL, on_picture, v, e);
}

int dh_media_verify(struct dh_media *m, struct dh_media_verify *res,
                    struct dh_err *e)
{
    struct dh_media_verify scratch;
    struct vrun v = {.m = m};
    char why[160];
    int rc, er;

    if (!res)
        res = &scratch;
    memset(res, 0, sizeof(*res));
    if (!m->fc)
        return dh_err_set(e, DH_EINVAL, "media: no file is open");
    if ((rc = dh__media_restart(m, e)))
        return rc;
    /* Decoders conceal what they can (a cut JPEG decodes as a grey lower
     * half); here every error they notice must count. */
    er = m->cc->err_recognition;
    m->cc->err_recognition |= AV_EF_EXPLODE;
    rc = decode_everything(&v, res, e);
    m->cc->err_recognition = er;
    /* Leave a state dh_media_decode() starts from, whatever happened. */
    avcodec_flush_buffers(m->cc);
    dh__media_repositioned(m, m->counting ? 0 : -1);
    m->eof = 1; /* so that a counting-mode decode starts over */
    if (!rc) {
        res->frames = v.next;
        res->media_s = m->info.duration_s;
    }
    if (!rc && v.next < m->n) {
        snprintf(why, sizeof(why),
                 "decoding ended after %lld of the %lld frames its packets "
                 "promise",
                 (long long)v.next, (long long)m->n);
        rc = fail(m, v.next, why, e);
    }
    if (rc) /* any error: the decoder is not carried to the next file */
        m->cc_tainted = 1;
    return rc;
}
