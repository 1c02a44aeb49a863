/*
 * audio_decode.c - a source's sound as float32 samples (issue 38): the
 * main audio stream decoded with libavcodec and resampled with
 * libswresample to the rate and channels asked for, between two times on
 * the container's clock.
 *
 * Design notes:
 *   - Reads through the source layer (source.h) like the video pipeline:
 *     a file, a shard member or a remote object, with the same checks
 *     (size and mtime against the table's).
 *   - The decoder drops encoder priming itself (skip_samples side data,
 *     edit lists applied by the demuxer), so output sample 0 is the first
 *     sample a player plays; its time is the first decoded frame's
 *     timestamp.  A span [start, end) keeps the output samples whose time
 *     lies in it: sample i of the resampled stream is at t0 + i / rate.
 *   - A span near the stream's start is decoded from the start; one far
 *     into a long stream from a seek shortly before it (seek_near).
 *   - Output grows by doubling; bounded by DH_AUDIO_MAX_SAMPLES per
 *     channel so a hostile header cannot make it allocate without end.
 */
#include <math.h>
#include <string.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/channel_layout.h>
#include <libavutil/opt.h>
#include <libswresample/swresample.h>

#include "core/alloc.h"
#include "core/url.h"
#include "datahelix/audio.h"
#include "media/av_util.h"
#include "media/source.h"

struct audio_out {
    float *buf[2];
    int64_t n, cap; /* samples per channel kept, allocated */
    int fixed;      /* buf is the caller's (cap samples): keep what fits */
    int full;       /* fixed and filled: the rest of the span is dropped */
    int channels;
    int64_t produced;    /* samples the resampler has output so far */
    double t0;           /* time of resampled sample 0 */
    int64_t first, last; /* kept: [first, last) of the produced samples */
    int sought;          /* the decode starts from a seek (seek_near): the first
                      frame is cut to the grid of a decode from the start */
    double origin;       /* then: the time of that decode's first sample */
    /* the frames' format the resampler was made for */
    int in_fmt, in_rate;
    AVChannelLayout in_layout;
};

static int grow(struct audio_out *o, int64_t want, struct dh_err *e)
{
    int64_t cap = o->cap ? o->cap : 16384;

    if (want <= o->cap)
        return 0;
    while (cap < want)
        cap *= 2;
    if (cap > DH_AUDIO_MAX_SAMPLES)
        cap = DH_AUDIO_MAX_SAMPLES;
    if (want > cap)
        return dh_err_set(e, DH_ETOOBIG,
                          "more than %lld audio samples per channel",
                          (long long)DH_AUDIO_MAX_SAMPLES);
    for (int c = 0; c < o->channels; c++) {
        float *p = dh__realloc(o->buf[c], (size_t)cap * sizeof(float));

        if (!p)
            return dh_err_set(e, DH_ENOMEM, "out of memory");
        o->buf[c] = p;
    }
    o->cap = cap;
    return 0;
}

/* Keeps the part of `got` fresh samples (planar, in tmp) that falls in
 * [first, last) of the produced stream. */
static int keep(struct audio_out *o, float *const *tmp, int got,
                struct dh_err *e)
{
    int64_t from = o->produced, to = o->produced + got;
    int64_t a = from > o->first ? from : o->first;
    int64_t b = o->last >= 0 && to > o->last ? o->last : to;
    int rc;

    o->produced = to;
    if (b <= a)
        return 0;
    if (o->fixed && o->n + (b - a) >= o->cap) {
        b = a + (o->cap - o->n);
        o->full = 1;
    }
    if ((rc = grow(o, o->n + (b - a), e)))
        return rc;
    for (int c = 0; c < o->channels; c++)
        memcpy(o->buf[c] + o->n, tmp[c] + (a - from),
               (size_t)(b - a) * sizeof(float));
    o->n += b - a;
    return 0;
}

/* Resamples one decoded frame (NULL: flush) and keeps what falls in the
 * span. */
static int convert(SwrContext *swr, const AVFrame *f, int skip,
                   struct audio_out *o, float **tmp, int *tmp_cap,
                   struct dh_err *e)
{
    const uint8_t *in[64];
    int n = f ? f->nb_samples - skip : 0;
    int want = swr_get_out_samples(swr, n);
    int got;

    if (f) { /* the frame's samples from `skip` on */
        int planar = av_sample_fmt_is_planar((enum AVSampleFormat)f->format);
        int bps = av_get_bytes_per_sample((enum AVSampleFormat)f->format);
        int nch = f->ch_layout.nb_channels;

        for (int c = 0; c < (planar ? nch : 1) && c < 64; c++)
            in[c] = f->extended_data[c] +
                    (size_t)skip * (size_t)bps * (size_t)(planar ? 1 : nch);
    }

    if (want < 0)
        return dh_err_set(e, DH_EMEDIA, "resampler: %d", want);
    if (want > *tmp_cap) {
        for (int c = 0; c < o->channels; c++) {
            float *p = dh__realloc(tmp[c], (size_t)want * sizeof(float));

            if (!p)
                return dh_err_set(e, DH_ENOMEM, "out of memory");
            tmp[c] = p;
        }
        *tmp_cap = want;
    }
    got = swr_convert(swr, (uint8_t **)tmp, want, f ? in : NULL, n);
    if (got < 0)
        return dh_err_set(e, DH_EMEDIA, "resampler: %d", got);
    return keep(o, tmp, got, e);
}

static int open_decoder(AVFormatContext *fc, int idx, AVCodecContext **out,
                        const char *name, struct dh_err *e)
{
    const AVCodecParameters *par = fc->streams[idx]->codecpar;
    const AVCodec *codec = avcodec_find_decoder(par->codec_id);
    AVCodecContext *cc;
    char eb[128];
    int r;

    if (!codec)
        return dh_err_set(e, DH_EUNSUPPORTED,
                          "%s: no decoder for audio codec %s", name,
                          avcodec_get_name(par->codec_id));
    if (!(cc = avcodec_alloc_context3(codec)))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    cc->pkt_timebase = fc->streams[idx]->time_base;
    cc->thread_count = 1;
    if ((r = avcodec_parameters_to_context(cc, par)) < 0 ||
        (r = avcodec_open2(cc, codec, NULL)) < 0) {
        avcodec_free_context(&cc);
        return dh_err_set(e, DH_EMEDIA, "%s: audio decoder: %s", name,
                          dh__av_errstr(r, eb, sizeof(eb)));
    }
    *out = cc;
    return 0;
}

/* A resampler from frame f's format, rate and layout (what the frame has,
 * not what the codec context said: a stream may change them midway). */
static int open_resampler(const AVFrame *f, int rate, int channels,
                          SwrContext **out, const char *name, struct dh_err *e)
{
    AVChannelLayout ol, il;
    char eb[128];
    int r;

    if (f->sample_rate <= 0 || f->ch_layout.nb_channels <= 0 ||
        f->ch_layout.nb_channels > 64)
        return dh_err_set(e, DH_EMEDIA, "%s: audio frame of %d Hz, %d channels",
                          name, f->sample_rate, f->ch_layout.nb_channels);
    av_channel_layout_default(&ol, channels);
    if (f->ch_layout.order == AV_CHANNEL_ORDER_UNSPEC)
        av_channel_layout_default(&il, f->ch_layout.nb_channels);
    else if (av_channel_layout_copy(&il, &f->ch_layout) < 0)
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    r = swr_alloc_set_opts2(out, &ol, AV_SAMPLE_FMT_FLTP, rate, &il,
                            (enum AVSampleFormat)f->format, f->sample_rate, 0,
                            NULL);
    av_channel_layout_uninit(&il);
    av_channel_layout_uninit(&ol);
    /* phases of the exact ratio: a decode resumed from a seek then meets
     * the same filter phases as one from the start */
    if (r >= 0)
        r = av_opt_set_int(*out, "exact_rational", 1, 0);
    if (r >= 0)
        r = swr_init(*out);
    if (r < 0)
        return dh_err_set(e, DH_EMEDIA, "%s: resampler (%d Hz, %d ch): %s",
                          name, rate, channels,
                          dh__av_errstr(r, eb, sizeof(eb)));
    return 0;
}

static int note_format(struct audio_out *o, const AVFrame *f, struct dh_err *e)
{
    o->in_fmt = f->format;
    o->in_rate = f->sample_rate;
    av_channel_layout_uninit(&o->in_layout);
    if (av_channel_layout_copy(&o->in_layout, &f->ch_layout) < 0)
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    return 0;
}

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;

        a = b;
        b = t;
    }
    return a;
}

/*
 * After a seek, the first frame's samples to drop so that the resampler
 * starts on an input sample that a decode from the stream's start maps to
 * a whole output sample (every q-th input sample, q = in / gcd(in, out)):
 * its outputs are then that decode's, not a fraction of a sample off.  -1
 * when the frame cannot be placed (no timestamp, before the origin): the
 * decode goes on unaligned, within a sample of the grid.  *at: the input
 * sample the frame starts at, counted from the origin.
 */
static int grid_skip(const struct audio_out *o, const AVFrame *f, double t0,
                     int rate, int64_t *at)
{
    int64_t q;

    if (f->best_effort_timestamp == AV_NOPTS_VALUE || f->sample_rate <= 0 ||
        t0 < o->origin)
        return -1;
    *at = llround((t0 - o->origin) * f->sample_rate);
    q = f->sample_rate / gcd64(f->sample_rate, rate);
    return (int)((q - *at % q) % q);
}

/* Sends one packet (NULL: drain) and converts every frame it yields. */
static int decode_packet(AVCodecContext *cc, const AVPacket *pkt, AVFrame *f,
                         SwrContext **swr, const struct dh_audio_opts *ao,
                         struct audio_out *o, float **tmp, int *tmp_cap,
                         AVRational tb, const char *name, struct dh_err *e)
{
    char eb[128];
    int r = avcodec_send_packet(cc, pkt), rc, skip;

    /* a damaged packet: the decoder says so and goes on, as players do */
    if (r < 0 && r != AVERROR(EAGAIN) && r != AVERROR_EOF &&
        r != AVERROR_INVALIDDATA)
        return dh_err_set(e, DH_EMEDIA, "%s: audio decode: %s", name,
                          dh__av_errstr(r, eb, sizeof(eb)));
    while ((r = avcodec_receive_frame(cc, f)) >= 0) {
        if (*swr && (f->format != o->in_fmt || f->sample_rate != o->in_rate ||
                     av_channel_layout_compare(&f->ch_layout, &o->in_layout))) {
            /* the stream changed its format: what the old resampler holds
             * goes out, then a new one for the new format */
            if ((rc = convert(*swr, NULL, 0, o, tmp, tmp_cap, e)))
                return rc;
            swr_free(swr);
            if ((rc = open_resampler(f, ao->rate, ao->channels, swr, name,
                                     e)) ||
                (rc = note_format(o, f, e)))
                return rc;
        }
        skip = 0;
        if (!*swr) {
            int64_t ts = f->best_effort_timestamp, at = 0;
            double t0 = ts != AV_NOPTS_VALUE ? (double)ts * av_q2d(tb) : 0;

            if (o->sought &&
                (skip = grid_skip(o, f, t0, ao->rate, &at)) >= f->nb_samples) {
                av_frame_unref(f); /* wholly before the grid's next point */
                continue;
            }
            if ((rc = open_resampler(f, ao->rate, ao->channels, swr, name,
                                     e)) ||
                (rc = note_format(o, f, e)))
                return rc;
            if (o->sought && skip >= 0) {
                /* at + skip: the input sample the grid's point falls on */
                o->produced = (at + skip) * ao->rate / f->sample_rate;
                t0 = o->origin;
            }
            if (skip < 0)
                skip = 0;
            o->t0 = t0;
            o->first = ao->start_s > t0
                           ? (int64_t)llround((ao->start_s - t0) * ao->rate)
                           : 0;
            o->last = ao->end_s > 0
                          ? (int64_t)llround((ao->end_s - t0) * ao->rate)
                          : -1;
            if (ao->end_s > 0 && o->last < 0)
                o->last = 0; /* a span before the stream: nothing */
            if (o->last >= 0 && o->last < o->first)
                o->last = o->first;
        }
        rc = convert(*swr, f, skip, o, tmp, tmp_cap, e);
        av_frame_unref(f);
        if (rc)
            return rc;
    }
    if (r != AVERROR(EAGAIN) && r != AVERROR_EOF && r != AVERROR_INVALIDDATA)
        return dh_err_set(e, DH_EMEDIA, "%s: audio decode: %s", name,
                          dh__av_errstr(r, eb, sizeof(eb)));
    return 0;
}

/*
 * A span past the stream's first seconds starts its decode a little
 * before the span instead of at the stream's start: memory is bounded by
 * the span either way, time is not (a podcast asked for 5 s at 3 h).  The
 * decoder's first frames after a seek lack what came before them (AAC's
 * overlap, MP3's bit reservoir, Opus's pre-roll), so SEEK_MARGIN_S of them
 * are decoded and dropped, and the first kept frame is cut to the
 * resampler's grid of a decode from the start (grid_skip): where
 * seek_exact() holds, the span is that decode's samples.  Elsewhere
 * (Vorbis; Matroska's millisecond timestamps) only a span past
 * SEEK_AFTER_ROUGH_S seeks, and lies within a few ms of that decode's.
 * A seek that lands on untimed packets, or after the span, goes back to
 * the start.
 */
#define SEEK_AFTER_S 1.5
#define SEEK_AFTER_ROUGH_S 30.0
#define SEEK_MARGIN_S 0.5

/* Whether a decode resumed from a seek gives the very samples of a decode
 * from the start: a codec whose decoder is whole again within the margin
 * after a flush (not Vorbis, whose first blocks after one are cut), and
 * timestamps that name one sample (MP4's 1 / rate, not Matroska's ms). */
static int seek_exact(const AVStream *st)
{
    const AVCodecParameters *par = st->codecpar;
    enum AVCodecID id = par->codec_id;
    int pcm = id >= AV_CODEC_ID_PCM_S16LE && id < AV_CODEC_ID_ADPCM_IMA_QT;

    if (!pcm && id != AV_CODEC_ID_AAC && id != AV_CODEC_ID_MP3 &&
        id != AV_CODEC_ID_MP2 && id != AV_CODEC_ID_FLAC &&
        id != AV_CODEC_ID_ALAC && id != AV_CODEC_ID_OPUS)
        return 0;
    return par->sample_rate > 0 && st->time_base.num > 0 &&
           (int64_t)st->time_base.den >=
               (int64_t)st->time_base.num * par->sample_rate;
}

/* The stream's start on the container's clock, seconds (0: not said). */
static double start_seconds(const AVStream *st)
{
    return st->start_time != AV_NOPTS_VALUE
               ? (double)st->start_time * av_q2d(st->time_base)
               : 0;
}

/* The time of the stream's first decoded frame (what a decode from the
 * start calls sample 0), decoding as few packets as it takes; -1: none
 * found (no timestamp, an error). */
static double first_frame_time(AVFormatContext *fc, int idx, AVCodecContext *cc,
                               AVPacket *pkt, AVFrame *f)
{
    double tb = av_q2d(fc->streams[idx]->time_base), t = -1;
    int r = 0;

    for (int n = 0; n < 64 && t < 0 && r >= 0; n++) {
        if ((r = av_read_frame(fc, pkt)) < 0)
            break;
        if (pkt->stream_index == idx)
            avcodec_send_packet(cc, pkt);
        av_packet_unref(pkt);
        if (avcodec_receive_frame(cc, f) >= 0) {
            if (f->best_effort_timestamp != AV_NOPTS_VALUE)
                t = (double)f->best_effort_timestamp * tb;
            else
                r = -1;
            av_frame_unref(f);
        }
    }
    return t;
}

/* Back to the stream's start, decoder flushed: 0, or -1 when the demuxer
 * cannot go there. */
static int rewind_stream(AVFormatContext *fc, int idx, AVCodecContext *cc)
{
    AVStream *st = fc->streams[idx];
    int64_t t0 = st->start_time != AV_NOPTS_VALUE ? st->start_time : 0;

    avcodec_flush_buffers(cc);
    if (av_seek_frame(fc, idx, t0, AVSEEK_FLAG_BACKWARD) >= 0 ||
        av_seek_frame(fc, -1, 0, AVSEEK_FLAG_BYTE) >= 0)
        return 0;
    return -1;
}

static int seek_near(AVFormatContext *fc, int idx, AVCodecContext *cc,
                     AVPacket *pkt, AVFrame *f, double start_s,
                     struct audio_out *o)
{
    AVStream *st = fc->streams[idx];
    double tb = av_q2d(st->time_base), origin, st0 = start_seconds(st);
    int64_t target = (int64_t)((start_s - SEEK_MARGIN_S) / tb);
    double after = seek_exact(st) ? SEEK_AFTER_S : SEEK_AFTER_ROUGH_S;
    int landed = 0;

    if (tb <= 0 || start_s - st0 < after)
        return 0;
    origin = first_frame_time(fc, idx, cc, pkt, f);
    if (origin < 0 || start_s - origin < after)
        return rewind_stream(fc, idx, cc);
    avcodec_flush_buffers(cc);
    if (av_seek_frame(fc, idx, target, AVSEEK_FLAG_BACKWARD) < 0)
        return rewind_stream(fc, idx, cc);
    /* where did it land?  The first packet of the stream says: timed, and
     * before the span (then the demuxer is put back to it) */
    while (av_read_frame(fc, pkt) >= 0) {
        int64_t ts = pkt->pts != AV_NOPTS_VALUE ? pkt->pts : pkt->dts;
        int mine = pkt->stream_index == idx;

        landed = mine && ts != AV_NOPTS_VALUE &&
                 (double)ts * tb <= start_s - SEEK_MARGIN_S / 2;
        av_packet_unref(pkt);
        if (mine)
            break;
    }
    if (landed && av_seek_frame(fc, idx, target, AVSEEK_FLAG_BACKWARD) >= 0) {
        o->sought = 1;
        o->origin = origin;
        return 0;
    }
    return rewind_stream(fc, idx, cc);
}

static int check_opts(const struct dh_audio_opts *ao, struct dh_err *e)
{
    if (ao->crop && !(ao->crop_s > 0 && ao->crop_u >= 0 && ao->crop_u <= 1))
        return dh_err_set(e, DH_EINVAL,
                          "audio: a crop of > 0 s at 0..1 of the room");
    if (ao->channels < 1 || ao->channels > 2 || ao->rate < DH_AUDIO_MIN_RATE ||
        ao->rate > DH_AUDIO_MAX_RATE || !(ao->start_s >= 0) ||
        (ao->end_s > 0 && ao->end_s <= ao->start_s))
        return dh_err_set(e, DH_EINVAL,
                          "audio: channels 1 or 2, rate %d..%d Hz, "
                          "0 <= start < end (end <= 0: to the end)",
                          DH_AUDIO_MIN_RATE, DH_AUDIO_MAX_RATE);
    return 0;
}

/* A crop's window on the container's clock (dh_audio_opts.crop). */
static void place_crop(struct dh_audio_opts *a, const AVFormatContext *fc,
                       const AVStream *st)
{
    double t0 = start_seconds(st);
    double room = dh__av_stream_seconds(fc, st) - a->crop_s;

    a->start_s = t0 > 0 ? t0 : 0;
    if (room > 0) /* crop_u is in 0..1: check_opts */
        a->start_s += a->crop_u * room;
    a->end_s = a->start_s + a->crop_s;
}

/* The span of `ao` into o (its buffers grown, or the caller's when
 * o->fixed); *missing = 1 when the source has no audio stream (then
 * DH_EMEDIA). */
static int decode_span(const struct dh_source_ref *ref,
                       const struct dh_audio_opts *ao_in, struct audio_out *o,
                       int *missing, struct dh_err *e)
{
    struct dh_audio_opts a = *ao_in;
    const struct dh_audio_opts *ao = &a;
    struct dh_source src;
    AVFormatContext *fc = NULL;
    AVIOContext *pb = NULL;
    AVCodecContext *cc = NULL;
    SwrContext *swr = NULL;
    AVPacket *pkt = NULL;
    AVFrame *f = NULL;
    float *tmp[2] = {NULL, NULL};
    int tmp_cap = 0, idx, rc, r;
    char url[4096], eb[128];

    *missing = 0;
    if ((rc = check_opts(ao, e)))
        return rc;
    dh__av_quiet();
    dh__source_init(&src);
    if ((rc = dh__source_open(&src, ref, e)))
        goto out;
    if (!(fc = avformat_alloc_context()) ||
        !(pb = dh__source_avio(&src, 65536)) || !(pkt = av_packet_alloc()) ||
        !(f = av_frame_alloc())) {
        rc = dh_err_set(e, DH_ENOMEM, "%s: out of memory", src.name);
        goto out;
    }
    fc->pb = pb;
    /* the name lets FFmpeg match extensions: a URL's path, or the file's */
    memcpy(url, "file:", 5);
    if (dh__url_kind(ref->path) != DH_URL_NONE)
        dh__url_path(ref->path, url + 5, sizeof(url) - 5);
    else
        snprintf(url + 5, sizeof(url) - 5, "%s", ref->path);
    if ((r = dh__av_open_io(&fc, ref->member ? NULL : url)) < 0) {
        rc = dh__source_input_error(&src, r, e);
        goto out;
    }
    if ((r = avformat_find_stream_info(fc, NULL)) < 0 ||
        (idx = av_find_best_stream(fc, AVMEDIA_TYPE_AUDIO, -1, -1, NULL, 0)) <
            0) {
        *missing = !src.failed && r >= 0;
        rc = src.failed
                 ? dh__source_input_error(&src, AVERROR(EIO), e)
                 : dh_err_set(e, DH_EMEDIA, "%s: no audio stream", src.name);
        goto out;
    }
    if ((rc = open_decoder(fc, idx, &cc, src.name, e)))
        goto out;
    if (a.crop)
        place_crop(&a, fc, fc->streams[idx]);
    if (seek_near(fc, idx, cc, pkt, f, ao->start_s, o)) {
        rc = dh_err_set(e, DH_EMEDIA,
                        "%s: audio without timestamps, and the stream "
                        "cannot be read again from its start",
                        src.name);
        goto out;
    }
    while ((r = av_read_frame(fc, pkt)) >= 0) {
        if (pkt->stream_index == idx)
            rc = decode_packet(cc, pkt, f, &swr, ao, o, tmp, &tmp_cap,
                               fc->streams[idx]->time_base, src.name, e);
        av_packet_unref(pkt);
        if (rc)
            goto out;
        if ((o->last >= 0 && o->produced >= o->last) || o->full)
            break; /* the span is whole, or all the caller has room for */
    }
    if (r < 0 && r != AVERROR_EOF) {
        rc = src.failed ? dh__source_input_error(&src, r, e)
                        : dh_err_set(e, DH_EMEDIA, "%s: reading: %s", src.name,
                                     dh__av_errstr(r, eb, sizeof(eb)));
        goto out;
    }
    if (src.failed) {
        rc = dh__source_input_error(&src, AVERROR(EIO), e);
        goto out;
    }
    if ((rc = decode_packet(cc, NULL, f, &swr, ao, o, tmp, &tmp_cap,
                            fc->streams[idx]->time_base, src.name, e)))
        goto out;
    if (swr && (rc = convert(swr, NULL, 0, o, tmp, &tmp_cap, e)))
        goto out;
out:
    for (int c = 0; c < 2; c++)
        dh__free(tmp[c]);
    av_channel_layout_uninit(&o->in_layout);
    swr_free(&swr);
    avcodec_free_context(&cc);
    av_frame_free(&f);
    av_packet_free(&pkt);
    avformat_close_input(&fc);
    avformat_free_context(fc);
    dh__source_avio_free(&pb);
    dh__source_fini(&src);
    return rc;
}

int dh_audio_decode(const struct dh_source_ref *ref,
                    const struct dh_audio_opts *ao, struct dh_audio *out,
                    struct dh_err *e)
{
    struct audio_out o = {.channels = ao->channels, .last = -1};
    int missing, rc;

    memset(out, 0, sizeof(*out));
    rc = decode_span(ref, ao, &o, &missing, e);
    out->missing = rc && missing;
    if (!rc) {
        out->channels = ao->channels;
        out->rate = ao->rate;
        out->n = o.n;
        out->start_s = o.t0 + (double)o.first / ao->rate;
        for (int c = 0; c < ao->channels; c++) {
            out->data[c] = o.buf[c];
            o.buf[c] = NULL;
        }
    }
    for (int c = 0; c < 2; c++)
        dh__free(o.buf[c]);
    return rc;
}

int dh_audio_decode_into(const struct dh_source_ref *ref,
                         const struct dh_audio_opts *ao, float *const dst[2],
                         int64_t cap, int64_t *n, int *missing,
                         struct dh_err *e)
{
    struct audio_out o = {.channels = ao->channels, .last = -1, .fixed = 1};
    int rc;

    *n = 0;
    if (cap < 1)
        return dh_err_set(e, DH_EINVAL, "audio: room for %lld samples",
                          (long long)cap);
    o.cap = cap;
    for (int c = 0; c < ao->channels && c < 2; c++)
        o.buf[c] = dst[c];
    rc = decode_span(ref, ao, &o, missing, e);
    *n = o.n;
    return rc;
}

void dh_audio_free(struct dh_audio *a)
{
    if (!a)
        return;
    for (int c = 0; c < 2; c++) {
        dh__free(a->data[c]);
        a->data[c] = NULL;
    }
    a->n = 0;
}
