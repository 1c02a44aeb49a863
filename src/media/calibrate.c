/*
 * calibrate.c - the measured decode behind `probe --calibrate`: a plain
 * single-threaded "decode everything, scale the sampled frames" loop, the
 * way a simple loader prepares a sample, timed in thread CPU time so that a
 * noisy shared machine does not skew the fit.
 *
 * Thread-safety: reentrant; every call owns its contexts.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libavutil/macros.h>
#include <libswscale/swscale.h>

#include "core/alloc.h"
#include "datahelix/probe.h"
#include "media/av_util.h"

struct cal {
    const char *path;
    AVFormatContext *fc;
    AVCodecContext *cc;
    struct SwsContext *sws;
    AVPacket *pkt;
    AVFrame *frame;
    uint8_t *rgb;
    int idx;
    int32_t out_w, out_h;
    int stride;
    int64_t total, want, decoded, scaled;
};

static double thread_cpu_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int av_fail(struct cal *c, int rc, const char *what, struct dh_err *e)
{
    char buf[128];

    return dh_err_set(e, DH_EMEDIA, "%s: %s at frame %lld: %s", c->path,
                      what, (long long)c->decoded,
                      dh__av_errstr(rc, buf, sizeof(buf)));
}

static int cal_open(struct cal *c, struct dh_err *e)
{
    const AVCodec *dec = NULL;
    int rc = dh__av_open_file(&c->fc, c->path);

    if (rc < 0)
        return av_fail(c, rc, "opening", e);
    rc = avformat_find_stream_info(c->fc, NULL);
    if (rc < 0)
        return av_fail(c, rc, "reading stream info", e);
    c->idx = av_find_best_stream(c->fc, AVMEDIA_TYPE_VIDEO, -1, -1, &dec, 0);
    if (c->idx < 0)
        return av_fail(c, c->idx, "finding a video stream", e);
    c->cc = avcodec_alloc_context3(dec);
    if (!c->cc)
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", c->path);
    rc = avcodec_parameters_to_context(c->cc, c->fc->streams[c->idx]->codecpar);
    if (rc < 0)
        return av_fail(c, rc, "configuring the decoder", e);
    c->cc->thread_count = 1;
    rc = avcodec_open2(c->cc, dec, NULL);
    if (rc < 0)
        return av_fail(c, rc, "opening the decoder", e);
    c->pkt = av_packet_alloc();
    c->frame = av_frame_alloc();
    /* swscale's SIMD paths store whole vectors and may run past the end of
     * a tightly packed row: aligned stride plus slack keeps it in bounds. */
    c->stride = FFALIGN(c->out_w * 3, 64);
    c->rgb = dh__malloc((size_t)c->stride * (size_t)c->out_h + 64);
    if (!c->pkt || !c->frame || !c->rgb)
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", c->path);
    return 0;
}

/* Frame i is sampled when it is the first to reach the next uniform slot. */
static int sampled(const struct cal *c, int64_t i)
{
    if (c->scaled >= c->want)
        return 0;
    return i * c->want >= c->scaled * c->total;
}

static int scale_frame(struct cal *c, struct dh_err *e)
{
    uint8_t *dst[4] = {c->rgb, NULL, NULL, NULL};
    int stride[4] = {c->stride, 0, 0, 0};
    AVFrame *f = c->frame;

    c->sws = sws_getCachedContext(c->sws, f->width, f->height, f->format,
                                  c->out_w, c->out_h, AV_PIX_FMT_RGB24,
                                  SWS_BILINEAR, NULL, NULL, NULL);
    if (!c->sws)
        return dh_err_set(e, DH_EMEDIA, "%s: no scaler for pixel format %d",
                          c->path, f->format);
    sws_scale(c->sws, (const uint8_t *const *)f->data, f->linesize, 0,
              f->height, dst, stride);
    c->scaled++;
    return 0;
}

static int drain(struct cal *c, struct dh_err *e)
{
    int rc;

    while ((rc = avcodec_receive_frame(c->cc, c->frame)) >= 0) {
        if (sampled(c, c->decoded) && (rc = scale_frame(c, e)))
            return rc;
        c->decoded++;
        av_frame_unref(c->frame);
    }
    if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF)
        return 0;
    return av_fail(c, rc, "decoding", e);
}

static int cal_run(struct cal *c, struct dh_err *e)
{
    int rc;

    while ((rc = av_read_frame(c->fc, c->pkt)) >= 0) {
        if (c->pkt->stream_index == c->idx) {
            rc = avcodec_send_packet(c->cc, c->pkt);
            av_packet_unref(c->pkt);
            if (rc < 0 && rc != AVERROR(EAGAIN))
                return av_fail(c, rc, "decoding", e);
            if ((rc = drain(c, e)))
                return rc;
        } else {
            av_packet_unref(c->pkt);
        }
    }
    if (rc != AVERROR_EOF)
        return av_fail(c, rc, "reading", e);
    avcodec_send_packet(c->cc, NULL);
    return drain(c, e);
}

int dh_calibrate_decode(const struct dh_desc *d, int64_t out_frames,
                        int32_t out_w, int32_t out_h, double *cpu_ms,
                        struct dh_err *e)
{
    struct cal c;
    double t0;
    int rc;

    if (out_w <= 0 || out_h <= 0 || out_frames <= 0 || d->frames <= 0)
        return dh_err_set(e, DH_EINVAL, "%s: nothing to calibrate", d->path);
    memset(&c, 0, sizeof(c));
    c.path = d->path;
    c.out_w = out_w;
    c.out_h = out_h;
    c.total = d->frames;
    c.want = out_frames < d->frames ? out_frames : d->frames;
    dh__av_quiet();
    t0 = thread_cpu_ms();
    rc = cal_open(&c, e);
    if (!rc)
        rc = cal_run(&c, e);
    if (!rc && c.decoded == 0)
        rc = dh_err_set(e, DH_EMEDIA, "%s: no frame could be decoded", c.path);
    if (!rc)
        *cpu_ms = thread_cpu_ms() - t0;
    sws_freeContext(c.sws);
    dh__free(c.rgb);
    av_frame_free(&c.frame);
    av_packet_free(&c.pkt);
    avcodec_free_context(&c.cc);
    avformat_close_input(&c.fc);
    return rc;
}
