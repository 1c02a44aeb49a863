/*
 * gen_encode.c - encode one synthetic clip to MP4 with libavcodec/libavformat.
 *
 * Design: one encoder context, one muxer, one reused AVFrame and AVPacket per
 * clip.  Determinism comes from single-threaded encoding (x264 threads=1,
 * so no frame-thread scheduling), AV_CODEC_FLAG_BITEXACT on the encoder and
 * AVFMT_FLAG_BITEXACT on the muxer (no library version strings, no creation
 * time), and content that is a pure function of (size, frame, seed).
 * H.264 (libx264, preset veryfast, CRF 23, its default 3 B-frames) when
 * available, else MPEG-4 Part 2 (fixed quantiser, 2 B-frames); both with a
 * 2 s GOP.  The MP4 is written "faststart" (moov first), as published
 * training sets usually are.
 *
 * Errors: every failure unwinds all FFmpeg state and removes the output.
 * Locking: none; each call owns its contexts.
 */
#include "media/gen_encode.h"

#include <stdio.h>
#include <string.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/avstring.h>
#include <libavutil/cpu.h>
#include <libavutil/opt.h>

#include "datahelix/gendata.h"
#include "media/av_util.h"
#include "media/gen_content.h"

struct enc {
    const struct dh__gen_clip *clip;
    const AVCodec *codec;
    AVFormatContext *oc;
    AVCodecContext *cc;
    AVStream *st;
    AVFrame *frame;
    AVPacket *pkt;
};

const char *dh__gen_encoder_name(void)
{
    if (avcodec_find_encoder_by_name("libx264"))
        return "libx264";
    if (avcodec_find_encoder_by_name("mpeg4"))
        return "mpeg4";
    return NULL;
}

static int av_fail(struct dh_err *e, int code, const struct enc *x,
                   const char *what, int averr)
{
    char buf[AV_ERROR_MAX_STRING_SIZE];

    return dh_err_set(e, code, "%s: %s: %s", x->clip->path, what,
                      dh__av_errstr(averr, buf, sizeof(buf)));
}

/*
 * x264's AVX-512 code paths read uninitialised heap bytes (x264 core 164
 * r3095 with FFmpeg 5.1, on AVX-512 CPUs): a clip's bytes then depend on
 * what earlier clips left in freed memory, and two runs differ.  Capping
 * x264 at its AVX2 level (every AVX-512 CPU has AVX2/FMA3/BMI2) restores
 * byte-identical output and matches what non-AVX-512 machines produce.
 * Valgrind (no AVX-512) cannot see it; glibc's malloc perturb hides it.
 */
static int x264_cap_asm(struct enc *x)
{
    if (!(av_get_cpu_flags() & AV_CPU_FLAG_AVX512))
        return 0;
    return av_opt_set(x->cc->priv_data, "x264-params", "asm=AVX2", 0);
}

static int set_codec_options(struct enc *x, struct dh_err *e)
{
    int r = 0;

    if (!strcmp(x->codec->name, "libx264")) {
        r = av_opt_set(x->cc->priv_data, "preset", "veryfast", 0);
        if (r >= 0)
            r = av_opt_set(x->cc->priv_data, "crf", "23", 0);
        if (r >= 0)
            r = x264_cap_asm(x);
    } else {
        x->cc->max_b_frames = 2;
        x->cc->flags |= AV_CODEC_FLAG_QSCALE;
        x->cc->global_quality = FF_QP2LAMBDA * 4;
    }
    return r < 0 ? av_fail(e, DH_EMEDIA, x, "encoder options", r) : 0;
}

static int open_codec(struct enc *x, struct dh_err *e)
{
    const struct dh__gen_clip *c = x->clip;
    int r;

    x->cc = avcodec_alloc_context3(x->codec);
    if (!x->cc)
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", c->path);
    x->cc->width = c->width;
    x->cc->height = c->height;
    x->cc->pix_fmt = AV_PIX_FMT_YUV420P;
    x->cc->color_range = AVCOL_RANGE_MPEG;
    x->cc->sample_aspect_ratio = (AVRational){1, 1};
    x->cc->time_base = (AVRational){1, DH_GEN_FPS};
    x->cc->framerate = (AVRational){DH_GEN_FPS, 1};
    x->cc->gop_size = DH_GEN_GOP;
    x->cc->thread_count = 1;
    x->cc->flags |= AV_CODEC_FLAG_BITEXACT;
    if (x->oc->oformat->flags & AVFMT_GLOBALHEADER)
        x->cc->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    r = set_codec_options(x, e);
    if (r < 0)
        return r;
    r = avcodec_open2(x->cc, x->codec, NULL);
    if (r < 0)
        return av_fail(e, DH_EMEDIA, x, x->codec->name, r);
    return 0;
}

static int open_output(struct enc *x, struct dh_err *e)
{
    const char *path = x->clip->path;
    int r;

    r = avformat_alloc_output_context2(&x->oc, NULL, "mp4", path);
    if (r < 0 || !x->oc)
        return av_fail(e, DH_EMEDIA, x, "mp4 muxer", r < 0 ? r : AVERROR_BUG);
    x->oc->flags |= AVFMT_FLAG_BITEXACT;
    x->st = avformat_new_stream(x->oc, NULL);
    if (!x->st)
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", path);
    return 0;
}

static int write_header(struct enc *x, struct dh_err *e)
{
    AVDictionary *mux_opts = NULL;
    int r;

    r = avcodec_parameters_from_context(x->st->codecpar, x->cc);
    if (r < 0)
        return av_fail(e, DH_EMEDIA, x, "stream parameters", r);
    x->st->time_base = x->cc->time_base;
    x->st->avg_frame_rate = x->cc->framerate;
    {
        /* "file:" so that a ':' in the folder is not read as a protocol */
        char *url = av_asprintf("file:%s", x->clip->path);
        r = url ? avio_open(&x->oc->pb, url, AVIO_FLAG_WRITE) : AVERROR(ENOMEM);
        av_free(url);
    }
    if (r < 0)
        return av_fail(e, DH_EIO, x, "open for writing", r);
    r = av_dict_set(&mux_opts, "movflags", "+faststart", 0);
    if (r >= 0)
        r = avformat_write_header(x->oc, &mux_opts);
    av_dict_free(&mux_opts);
    return r < 0 ? av_fail(e, DH_EMEDIA, x, "write header", r) : 0;
}

/*
 * Zeroes the whole buffer, row padding included: x264's SIMD plane copy may
 * read past the width, and stale heap bytes there (from a previous, larger
 * clip) would otherwise leak into the bitstream and break determinism.
 */
static void clear_padding(AVFrame *f)
{
    for (int i = 0; i < AV_NUM_DATA_POINTERS && f->buf[i]; i++)
        memset(f->buf[i]->data, 0, f->buf[i]->size);
}

static int alloc_frame(struct enc *x, struct dh_err *e)
{
    int r;

    x->frame = av_frame_alloc();
    x->pkt = av_packet_alloc();
    if (!x->frame || !x->pkt)
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", x->clip->path);
    x->frame->format = AV_PIX_FMT_YUV420P;
    x->frame->width = x->clip->width;
    x->frame->height = x->clip->height;
    x->frame->color_range = AVCOL_RANGE_MPEG;
    r = av_frame_get_buffer(x->frame, 0);
    if (r < 0)
        return av_fail(e, DH_ENOMEM, x, "frame buffer", r);
    clear_padding(x->frame);
    return 0;
}

/* Moves every packet the encoder has ready into the muxer. */
static int drain(struct enc *x, struct dh_err *e)
{
    int r;

    for (;;) {
        r = avcodec_receive_packet(x->cc, x->pkt);
        if (r == AVERROR(EAGAIN) || r == AVERROR_EOF)
            return 0;
        if (r < 0)
            return av_fail(e, DH_EMEDIA, x, "encode", r);
        av_packet_rescale_ts(x->pkt, x->cc->time_base, x->st->time_base);
        x->pkt->stream_index = x->st->index;
        r = av_interleaved_write_frame(x->oc, x->pkt);
        if (r < 0)
            return av_fail(e, DH_EIO, x, "write packet", r);
    }
}

static int encode_frame(struct enc *x, int64_t i, struct dh_err *e)
{
    struct dh__gen_planes pl;
    int r;

    r = av_frame_make_writable(x->frame);
    if (r < 0)
        return av_fail(e, DH_ENOMEM, x, "frame buffer", r);
    for (int p = 0; p < 3; p++) {
        pl.data[p] = x->frame->data[p];
        pl.linesize[p] = x->frame->linesize[p];
    }
    pl.width = x->clip->width;
    pl.height = x->clip->height;
    dh__gen_content_fill(&pl, i, x->clip->seed);
    if (x->clip->stamp)
        dh__gen_stamp_draw(&pl, i);
    x->frame->pts = i;
    r = avcodec_send_frame(x->cc, x->frame);
    if (r < 0)
        return av_fail(e, DH_EMEDIA, x, "encode", r);
    return drain(x, e);
}

static int encode_all(struct enc *x, struct dh_err *e)
{
    int r;

    for (int64_t i = 0; i < x->clip->frames; i++) {
        r = encode_frame(x, i, e);
        if (r < 0)
            return r;
    }
    r = avcodec_send_frame(x->cc, NULL);
    if (r < 0)
        return av_fail(e, DH_EMEDIA, x, "flush encoder", r);
    r = drain(x, e);
    if (r < 0)
        return r;
    r = av_write_trailer(x->oc);
    if (r < 0)
        return av_fail(e, DH_EIO, x, "write trailer", r);
    r = avio_closep(&x->oc->pb);
    return r < 0 ? av_fail(e, DH_EIO, x, "close", r) : 0;
}

static void enc_free(struct enc *x)
{
    av_packet_free(&x->pkt);
    av_frame_free(&x->frame);
    avcodec_free_context(&x->cc);
    if (x->oc) {
        avio_closep(&x->oc->pb);
        avformat_free_context(x->oc);
        x->oc = NULL;
    }
}

int dh__gen_encode_clip(const struct dh__gen_clip *c, struct dh_err *e)
{
    struct enc x = {.clip = c};
    const char *name = dh__gen_encoder_name();
    int r;

    dh__av_quiet();
    if (!name)
        return dh_err_set(e, DH_EUNSUPPORTED,
                          "%s: this FFmpeg has neither "
                          "libx264 nor mpeg4 encoder",
                          c->path);
    x.codec = avcodec_find_encoder_by_name(name);
    r = open_output(&x, e);
    if (r < 0)
        goto out_free;
    r = open_codec(&x, e);
    if (r < 0)
        goto out_free;
    r = alloc_frame(&x, e);
    if (r < 0)
        goto out_free;
    r = write_header(&x, e);
    if (r < 0)
        goto out_free;
    r = encode_all(&x, e);
out_free:
    enc_free(&x);
    if (r < 0)
        remove(c->path);
    return r;
}
