/*
 * media_open.c - a media worker's life cycle and the frame table of the
 * open file (see media_internal.h for the table's design).
 *
 * Why a frame table: exact sampling needs to know which frame a decoded
 * picture is and which keyframe to seek to for a target.  MP4/MOV index
 * every sample at open, so for constant-rate streams the table costs no
 * I/O; other containers are scanned once, demuxing only (no decode).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libavutil/pixdesc.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/url.h"
#include "media/av_util.h"
#include "datahelix/media_stages.h"
#include "media/media_internal.h"

#define AVIO_BUF 65536

int dh_media_create(struct dh_media **out, struct dh_err *e)
{
    struct dh_media *m = dh__calloc(1, sizeof(*m));

    dh__av_quiet();
    if (!m)
        return dh_err_set(e, DH_ENOMEM, "media: out of memory");
    dh__source_init(&m->src); /* before any destroy: fd -1, not 0 */
    m->pkt = av_packet_alloc();
    m->frame = av_frame_alloc();
    m->hold = av_frame_alloc();
    if (!m->pkt || !m->frame || !m->hold) {
        dh_media_destroy(m);
        return dh_err_set(e, DH_ENOMEM, "media: out of memory");
    }
    m->threads = 1;
    m->stream = -1;
    *out = m;
    return 0;
}

void dh_media_set_threads(struct dh_media *m, int threads)
{
    m->threads = threads < 0 ? 1 : threads;
}

void dh_media_set_watchdog(struct dh_media *m, int ms)
{
    m->watchdog_ms = ms < 0 ? 0 : ms;
}

int dh__media_overdue(const struct dh_media *m)
{
    return m->deadline_ms && dh__mono_ms() >= m->deadline_ms;
}

int dh__media_watchdog_error(const struct dh_media *m, struct dh_err *e)
{
    return dh_err_set(e, DH_ETIMEOUT,
                      "%s: abandoned after %d ms: "
                      "per-sample watchdog",
                      m->name ? m->name : "input", m->watchdog_ms);
}

/* FFmpeg polls this inside blocking reads: non-zero aborts them. */
static int interrupt_cb(void *opaque)
{
    return dh__media_overdue(opaque);
}

void dh_media_destroy(struct dh_media *m)
{
    if (!m)
        return;
    dh_media_close(m);
    avcodec_free_context(&m->spare);
    avcodec_parameters_free(&m->cc_par);
    av_packet_free(&m->pkt);
    av_frame_free(&m->frame);
    av_frame_free(&m->hold);
    dh__media_scale_fini(m);
    dh__free(m->pts);
    dh__free(m->key_idx);
    dh__free(m->key_seek);
    dh__free(m->name_buf);
    dh__source_fini(&m->src);
    dh__free(m);
}

static void close_input(struct dh_media *m)
{
    avformat_close_input(&m->fc);
    dh__source_avio_free(&m->avio);
}

/* ---- decoder reuse ----
 *
 * Opening a decoder per file costs an allocation of its context and
 * tables (and, with frame threads, starting its threads).  So a closed
 * file's decoder is kept, and the next file takes it over, flushed, when
 * it was opened with the same codec parameters and thread count: the
 * decoder then holds exactly the state a fresh open would give it (the
 * extradata it parsed at open is byte-identical, and a flush is what a
 * seek within one file does anyway).  A decoder that returned an error or
 * output a picture it flagged corrupt or concealed is not kept: whatever
 * state a bad file left it in goes with it.  Only the decoder: a demuxer's
 * context is per input (FFmpeg opens one per avformat_open_input). */

static int same_params(const AVCodecParameters *a, const AVCodecParameters *b)
{
    return a->codec_type == b->codec_type && a->codec_id == b->codec_id &&
           a->codec_tag == b->codec_tag && a->format == b->format &&
           a->profile == b->profile && a->level == b->level &&
           a->width == b->width && a->height == b->height &&
           a->bits_per_coded_sample == b->bits_per_coded_sample &&
           a->bits_per_raw_sample == b->bits_per_raw_sample &&
           a->field_order == b->field_order &&
           a->color_range == b->color_range &&
           a->color_primaries == b->color_primaries &&
           a->color_trc == b->color_trc && a->color_space == b->color_space &&
           a->chroma_location == b->chroma_location &&
           a->sample_aspect_ratio.num == b->sample_aspect_ratio.num &&
           a->sample_aspect_ratio.den == b->sample_aspect_ratio.den &&
           a->video_delay == b->video_delay &&
           a->extradata_size == b->extradata_size &&
           (a->extradata_size <= 0 ||
            !memcmp(a->extradata, b->extradata, (size_t)a->extradata_size));
}

/* The open file's decoder becomes the spare, or is freed. */
static void keep_decoder(struct dh_media *m)
{
    if (!m->cc)
        return;
    avcodec_free_context(&m->spare);
    if (m->cc_tainted || m->no_reuse)
        avcodec_free_context(&m->cc);
    m->spare = m->cc;
    m->cc = NULL;
}

/* 1 when the spare was taken over as the decoder of `par`; else the spare
 * is freed and 0. */
static int reuse_decoder(struct dh_media *m, const AVCodecParameters *par)
{
    if (!m->spare || !m->cc_par || m->cc_threads != m->threads ||
        !same_params(m->cc_par, par)) {
        avcodec_free_context(&m->spare);
        return 0;
    }
    m->cc = m->spare;
    m->spare = NULL;
    avcodec_flush_buffers(m->cc);
    m->cc->skip_frame = AVDISCARD_DEFAULT;
    m->cc_tainted = 0;
    m->decoder_reuses++;
    return 1;
}

void dh__media_decoder_counts(const struct dh_media *m, int64_t *opens,
                              int64_t *reuses)
{
    *opens = m->decoder_opens;
    *reuses = m->decoder_reuses;
}

void dh__media_set_decoder_reuse(struct dh_media *m, int on)
{
    m->no_reuse = !on;
    if (!on)
        avcodec_free_context(&m->spare);
}

void dh_media_close(struct dh_media *m)
{
    if (!m)
        return;
    if (m->hold)
        av_frame_unref(m->hold);
    keep_decoder(m);
    close_input(m);
    dh__source_close(&m->src); /* its per-worker cache stays */
    m->name = NULL;            /* name_buf stays for the next file */
    m->url = NULL;
    m->stream = -1;
    m->selected = 0;
    m->n = m->nkey = 0;
    memset(&m->info, 0, sizeof(m->info));
}

const char *dh__media_errstr(int averr, char *buf, size_t len)
{
    return dh__av_errstr(averr, buf, len);
}

/* ---- opening ---- */

static int open_input(struct dh_media *m, struct dh_err *e)
{
    int rc;

    m->deadline_ms = m->watchdog_ms ? dh__mono_ms() + (uint64_t)m->watchdog_ms
                                    : 0;
    atomic_store(&m->progress_ms, dh__mono_ms()); /* a new attempt */
    m->src.overdue = interrupt_cb;
    m->src.overdue_arg = m;
    m->fc = avformat_alloc_context();
    if (m->fc)
        m->fc->interrupt_callback = (AVIOInterruptCB){.callback = interrupt_cb,
                                                      .opaque = m};
    m->avio = dh__source_avio(&m->src, AVIO_BUF);
    if (!m->fc || !m->avio)
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", m->name);
    m->fc->pb = m->avio;
    rc = dh__av_open_io(&m->fc, m->url);
    if (rc < 0 && dh__media_overdue(m))
        return dh__media_watchdog_error(m, e);
    if (rc < 0)
        return dh__source_input_error(&m->src, rc, e);
    rc = dh__av_find_video(m->fc, m->name, e);
    if (rc < 0)
        return rc;
    m->stream = rc;
    for (unsigned i = 0; i < m->fc->nb_streams; i++)
        m->fc->streams[i]->discard = (int)i == m->stream ? AVDISCARD_DEFAULT
                                                         : AVDISCARD_ALL;
    return 0;
}

static int grow(int64_t **a, size_t *cap, size_t need)
{
    size_t c = *cap ? *cap : 256;
    int64_t *p;

    if (need <= *cap)
        return 0;
    while (c < need)
        c *= 2;
    p = dh__realloc(*a, c * sizeof(**a));
    if (!p)
        return -1;
    *a = p;
    *cap = c;
    return 0;
}

static int grow_keys(struct dh_media *m, size_t need)
{
    size_t cap = m->key_cap;

    if (grow(&m->key_idx, &cap, need))
        return -1;
    cap = m->key_cap;
    if (grow(&m->key_seek, &cap, need))
        return -1;
    m->key_cap = cap;
    return 0;
}

/* MOV with a constant frame duration: pts[k] = start + k * d, keyframes
 * at their decode position (exact for closed GOPs, which encoders write
 * by default).  Returns 1 when built, 0 when the scan must do it. */
static int table_from_index(struct dh_media *m, AVStream *st)
{
    int n = avformat_index_get_entries_count(st);
    const AVIndexEntry *ie;
    int64_t d, start;

    /* The index holds decode times; presentation times are those plus the
     * composition offset, which only the stream's start time reveals.  A
     * fragmented file (and some others) leave it unset at open: without it
     * the table would be shifted by the reorder delay, so scan instead. */
    if (strncmp(m->fc->iformat->name, "mov", 3) || n < 2 ||
        st->start_time == AV_NOPTS_VALUE ||
        !(avformat_index_get_entry(st, 0)->flags & AVINDEX_KEYFRAME))
        return 0; /* a stream that starts mid-GOP: the scan drops the lead */
    d = avformat_index_get_entry(st, 1)->timestamp -
        avformat_index_get_entry(st, 0)->timestamp;
    for (int i = 0; i < n; i++) {
        ie = avformat_index_get_entry(st, i);
        if (ie->flags & AVINDEX_DISCARD_FRAME)
            return 0;
        if (i > 0 &&
            ie->timestamp - avformat_index_get_entry(st, i - 1)->timestamp != d)
            return 0;
    }
    if (d <= 0 || grow(&m->pts, &m->pts_cap, (size_t)n) ||
        grow_keys(m, (size_t)n))
        return -1;
    start = st->start_time;
    m->nkey = 0;
    for (int i = 0; i < n; i++) {
        ie = avformat_index_get_entry(st, i);
        m->pts[i] = start + (int64_t)i * d;
        if (ie->flags & AVINDEX_KEYFRAME) {
            m->key_idx[m->nkey] = i;
            m->key_seek[m->nkey++] = m->pts[i];
        }
    }
    m->n = n;
    m->half = d / 2;
    return 1;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

/* Keyframes were recorded by pts in key_idx: turn them into indices. */
static void keys_to_indices(struct dh_media *m)
{
    for (int64_t k = 0; k < m->nkey; k++)
        m->key_idx[k] = dh__media_frame_index(m, m->key_idx[k]);
}

/* Where the scanned packets end, in seconds from the stream's start. */
static double scan_end_s(const struct dh_media *m, int64_t t0)
{
    if (m->counting || m->n < 1)
        return 0;
    return (double)(m->pts[m->n - 1] - t0 + 2 * m->half) * m->tb;
}

static int finish_scan(struct dh_media *m)
{
    qsort(m->pts, (size_t)m->n, sizeof(*m->pts), cmp_i64);
    for (int64_t i = 1; i < m->n; i++)
        if (m->pts[i] == m->pts[i - 1])
            m->counting = 1; /* timestamps cannot tell these frames apart */
    m->half = m->n > 1 ? (m->pts[m->n - 1] - m->pts[0]) / (m->n - 1) / 2 : 0;
    if (!m->counting)
        keys_to_indices(m);
    if (m->nkey == 0 || (m->nkey > 0 && m->key_idx[0] != 0))
        m->counting = 1; /* nothing safe to seek to before frame 0 */
    return 0;
}

struct scan {
    int ts_trusted; /* some packet carries a presentation time that is
                        not simply its decode time */
    int seen_key;
    int64_t packets;  /* every packet of the stream, for the completeness
                        check against the header */
    int64_t t0;       /* earliest timestamp of any packet, skipped or not */
    int64_t last_dts; /* of the previous packet, AV_NOPTS_VALUE: none */
    int seek_by_dts;  /* see seek_ts() */
};

/* What av_seek_frame(BACKWARD) must be given to land on this keyframe.
 * Demuxers that search the file by decode time (MPEG-TS, PS, FLV) stop at
 * the last packet whose dts is at or before the target: given the key's
 * pts, which is later than its dts when pictures are reordered, they land
 * on a packet after the key and the decode starts a GOP late.  So its dts
 * where the packets carry one - except MOV, whose demuxer shifts dts and
 * seeks by the index's presentation order. */
static int64_t seek_ts(const struct scan *sc, const AVPacket *pkt, int64_t ts)
{
    return sc->seek_by_dts && pkt->dts != AV_NOPTS_VALUE ? pkt->dts : ts;
}

static int scan_packet(struct dh_media *m, const AVPacket *pkt, struct scan *sc)
{
    int64_t ts = pkt->pts != AV_NOPTS_VALUE ? pkt->pts : pkt->dts;

    sc->packets++;
    if (ts != AV_NOPTS_VALUE && (sc->packets == 1 || ts < sc->t0))
        sc->t0 = ts;
    if (!dh__av_counts_as_frame(pkt, &sc->seen_key))
        return 0;
    if (pkt->pts != AV_NOPTS_VALUE &&
        (pkt->dts == AV_NOPTS_VALUE || pkt->pts != pkt->dts))
        sc->ts_trusted = 1;
    if (ts == AV_NOPTS_VALUE)
        m->counting = 1;
    /* Decode times only go forward within one timeline.  A step back is a
     * discontinuity (TS files joined end to end, a recorder restarted):
     * sorting the timestamps would interleave the two timelines, so the
     * pictures are counted in output order instead. */
    if (pkt->dts != AV_NOPTS_VALUE) {
        if (sc->last_dts != AV_NOPTS_VALUE && pkt->dts < sc->last_dts)
            m->counting = 1;
        sc->last_dts = pkt->dts;
    }
    if (grow(&m->pts, &m->pts_cap, (size_t)m->n + 1))
        return -1;
    m->pts[m->n] = ts == AV_NOPTS_VALUE ? m->n : ts;
    m->n++;
    if (pkt->flags & AV_PKT_FLAG_KEY) {
        if (grow_keys(m, (size_t)m->nkey + 1))
            return -1;
        m->key_idx[m->nkey] = ts; /* a pts for now: see keys_to_indices */
        m->key_seek[m->nkey++] = seek_ts(sc, pkt, ts);
    }
    return 0;
}

/* Demuxes the whole stream once, decoding nothing. */
static int table_from_scan(struct dh_media *m, struct dh_err *e)
{
    const AVCodecDescriptor *cd = avcodec_descriptor_get(
        m->fc->streams[m->stream]->codecpar->codec_id);
    char buf[128];
    struct scan sc = {
        .last_dts = AV_NOPTS_VALUE,
        .seek_by_dts = strncmp(m->fc->iformat->name, "mov", 3) != 0,
    };
    int rc;

    m->n = m->nkey = 0;
    while ((rc = dh__media_read_frame(m)) >= 0) {
        if (m->pkt->stream_index == m->stream && scan_packet(m, m->pkt, &sc)) {
            av_packet_unref(m->pkt);
            return dh_err_set(e, DH_ENOMEM, "%s: out of memory", m->name);
        }
        av_packet_unref(m->pkt);
    }
    if (rc != AVERROR_EOF && m->src.failed)
        return dh__source_input_error(&m->src, rc, e);
    if (rc != AVERROR_EOF)
        return dh_err_set(e, DH_EMEDIA, "%s: reading packet %lld: %s", m->name,
                          (long long)m->n, dh__av_errstr(rc, buf, sizeof(buf)));
    if (m->n == 0)
        return dh_err_set(e, DH_EMEDIA, "%s: the video stream has no %s",
                          m->name, sc.packets ? "keyframe" : "packets");
    /* AVI and raw streams stamp packets in decode order: with a codec that
     * reorders (B-frames), timestamps then do not say which picture is
     * which, so count pictures instead.  (Matroska stamps presentation
     * times and no decode times: those are trusted.) */
    if (!sc.ts_trusted && cd && (cd->props & AV_CODEC_PROP_REORDER))
        m->counting = 1;
    if ((rc = finish_scan(m)))
        return rc;
    return dh__av_check_complete(m->fc, m->fc->streams[m->stream], sc.packets,
                                 scan_end_s(m, sc.t0), 0, NULL, m->name, e);
}

static int build_table(struct dh_media *m, struct dh_err *e)
{
    AVStream *st = m->fc->streams[m->stream];
    int rc;

    m->counting = 0;
    m->tb = av_q2d(st->time_base);
    if (m->image) {
        if (grow(&m->pts, &m->pts_cap, 1) || grow_keys(m, 1))
            return dh_err_set(e, DH_ENOMEM, "%s: out of memory", m->name);
        m->n = m->nkey = 1;
        m->pts[0] = m->key_idx[0] = m->key_seek[0] = 0;
        m->counting = 1;
        return 0;
    }
    rc = table_from_index(m, st);
    if (rc < 0)
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", m->name);
    if (rc > 0)
        return 0;
    rc = table_from_scan(m, e);
    if (rc)
        return rc;
    /* The scan consumed the input: reopen it (cheaper and surer than
     * seeking back in every container). */
    close_input(m);
    return open_input(m, e);
}

static int open_decoder(struct dh_media *m, struct dh_err *e)
{
    const AVCodecParameters *par = m->fc->streams[m->stream]->codecpar;
    const AVCodec *dec = avcodec_find_decoder(par->codec_id);
    char buf[128];
    int rc;

    if (!dec)
        return dh_err_set(e, DH_EMEDIA, "%s: no decoder for codec %s", m->name,
                          avcodec_get_name(par->codec_id));
    if (reuse_decoder(m, par))
        return 0;
    m->cc_tainted = 1; /* until it is open and its parameters recorded */
    m->cc = avcodec_alloc_context3(dec);
    if (!m->cc)
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", m->name);
    rc = avcodec_parameters_to_context(m->cc, par);
    if (rc >= 0) {
        m->cc->thread_count = m->threads;
        rc = avcodec_open2(m->cc, dec, NULL);
    }
    if (rc < 0)
        return dh_err_set(e, DH_EMEDIA, "%s: opening the %s decoder: %s",
                          m->name, dec->name,
                          dh__av_errstr(rc, buf, sizeof(buf)));
    m->decoder_opens++;
    /* Without a record of its parameters the decoder is simply not kept. */
    if (!m->cc_par)
        m->cc_par = avcodec_parameters_alloc();
    if (m->cc_par && avcodec_parameters_copy(m->cc_par, par) >= 0) {
        m->cc_threads = m->threads;
        m->cc_tainted = 0;
    }
    return 0;
}

static void fill_info(struct dh_media *m)
{
    AVStream *st = m->fc->streams[m->stream];
    struct dh_media_info *i = &m->info;
    AVRational r = st->avg_frame_rate.num ? st->avg_frame_rate
                                          : st->r_frame_rate;
    /* The stream's format, as a fresh decoder starts with: a decoder taken
     * over from the previous file holds what that file decoded to. */
    const char *pf = av_get_pix_fmt_name(
        st->codecpar->format >= 0 ? (enum AVPixelFormat)st->codecpar->format
                                  : m->cc->pix_fmt);

    i->kind = m->image ? DH_KIND_IMAGE : DH_KIND_VIDEO;
    i->frames = m->n;
    i->keyframes = m->nkey;
    i->width = st->codecpar->width;
    i->height = st->codecpar->height;
    i->rotation = dh__av_stream_rotation(st);
    i->fps = r.num && r.den ? av_q2d(r) : 0;
    if (!m->image && m->n > 1 && !m->counting)
        i->duration_s = (double)(m->pts[m->n - 1] - m->pts[0] + 2 * m->half) *
                        m->tb;
    else if (i->fps > 0)
        i->duration_s = (double)m->n / i->fps;
    if (i->fps <= 0 && i->duration_s > 0)
        i->fps = (double)m->n / i->duration_s;
    snprintf(i->codec, sizeof(i->codec), "%s",
             avcodec_get_name(st->codecpar->codec_id));
    snprintf(i->pix_fmt, sizeof(i->pix_fmt), "%s", pf ? pf : "unknown");
}

static int open_common(struct dh_media *m, struct dh_err *e)
{
    int rc = open_input(m, e);

    if (!rc) {
        m->image = dh__av_is_image_format(m->fc->iformat);
        rc = build_table(m, e);
    }
    if (!rc)
        rc = open_decoder(m, e);
    if (rc) {
        dh_media_close(m);
        return rc;
    }
    fill_info(m);
    dh__media_repositioned(m, m->counting ? 0 : -1);
    m->forward_only = m->counting;
    return 0;
}

/* m->name = a copy of s in the kept buffer, and m->url = "file:" hint
 * after it when a hint is given: a local file's path, a URL's path part
 * (FFmpeg guesses a format by the name's extension; "file:" keeps a ':'
 * in a name from being read as a protocol); DH_ENOMEM. */
static int set_name(struct dh_media *m, const char *s, const char *hint)
{
    size_t n = strlen(s) + 1, h = hint ? strlen(hint) + 1 : 0;
    size_t need = n + (hint ? h + 5 : 0);

    if (dh__buf_reserve(&m->name_buf, &m->name_cap, need))
        return DH_ENOMEM;
    memmove(m->name_buf, s, n);
    m->name = m->name_buf;
    m->url = NULL;
    if (hint) {
        memcpy(m->name_buf + n, "file:", 5);
        memcpy(m->name_buf + n + 5, hint, h);
        m->url = m->name_buf + n;
    }
    return 0;
}

/* The source is open: FFmpeg's input over it, the frame table, the
 * decoder.  `hint` as in set_name(). */
static int open_source(struct dh_media *m, const char *hint, struct dh_err *e)
{
    if (set_name(m, m->src.name, hint))
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", m->src.name);
    return open_common(m, e);
}

static int open_ref(struct dh_media *m, const struct dh_source_ref *ref,
                    struct dh_err *e)
{
    char path[2048];
    int rc;

    dh_media_close(m);
    if (!ref || !ref->path)
        return dh_err_set(e, DH_EINVAL, "media: no input named");
    /* a remote object's open may already read (its size): the watchdog
     * bounds it as it bounds every read after */
    m->deadline_ms = m->watchdog_ms ? dh__mono_ms() + (uint64_t)m->watchdog_ms
                                    : 0;
    m->src.overdue = interrupt_cb;
    m->src.overdue_arg = m;
    rc = dh__source_open(&m->src, ref, e);
    if (rc) {
        dh__source_close(&m->src);
        return rc;
    }
    if (ref->member)
        return open_source(m, NULL, e);
    if (dh__url_kind(ref->path) == DH_URL_NONE)
        return open_source(m, ref->path, e);
    dh__url_path(ref->path, path, sizeof(path));
    return open_source(m, path[0] ? path : NULL, e);
}

/* The public entries, timed as the DH_MS_READ stage (media_stages.h). */
int dh_media_open_ref(struct dh_media *m, const struct dh_source_ref *ref,
                      struct dh_err *e)
{
    double t0 = dh__mono_msf();
    int rc = open_ref(m, ref, e);

    m->stage_ms[DH_MS_READ] += dh__mono_msf() - t0;
    return rc;
}

int dh_media_open(struct dh_media *m, const char *path, struct dh_err *e)
{
    struct dh_source_ref ref = {.path = path};

    return dh_media_open_ref(m, &ref, e);
}

int dh_media_open_mem(struct dh_media *m, const void *data, size_t len,
                      const char *name, struct dh_err *e)
{
    int rc;

    dh_media_close(m);
    rc = dh__source_open_mem(&m->src, data, len, name, e);
    if (rc) {
        dh__source_close(&m->src);
        return rc;
    }
    return open_source(m, NULL, e);
}

int dh_media_info(const struct dh_media *m, struct dh_media_info *out)
{
    if (!m || !m->fc)
        return DH_EINVAL;
    *out = m->info;
    return 0;
}

/* ---- lookups used while decoding ---- */

/* Can timestamp ts be one of the table's frames?  Not when it lies more
 * than half a frame before the first: a picture from before the first
 * keyframe, which the table leaves out.  (Past the end the last entry takes
 * it: a table built from a constant-rate index may place the last frames a
 * little early when their composition offsets vary.) */
int dh__media_in_table(const struct dh_media *m, int64_t ts)
{
    return m->n > 0 && ts >= m->pts[0] - (m->half > 0 ? m->half : 1);
}

/* Can this picture be one of the clip's frames?  After a seek or restart,
 * not until the decoder has its keyframe: one that starts mid-GOP (a seek
 * that landed early in MPEG-TS or PS) may output P-pictures made against a
 * reference it never had.  So the gate opens at a keyframe picture, or at a
 * picture no earlier than a keyframe packet sent since (an edit list's
 * preroll keyframe is decoded but never output).  With timestamps, a
 * picture before the table's first frame is not in the clip either. */
int64_t dh__media_picture_ts(const AVFrame *f)
{
    return f->best_effort_timestamp != AV_NOPTS_VALUE ? f->best_effort_timestamp
                                                      : f->pts;
}

double dh__media_frame_time(const struct dh_media *m, int64_t at)
{
    if (m->counting || at < 0 || at >= m->n)
        return m->info.fps > 0 ? (double)at / m->info.fps : 0;
    return (double)(m->pts[at] - m->pts[0]) * m->tb;
}

int dh__media_trustworthy(struct dh_media *m, const AVFrame *f)
{
    int64_t ts = dh__media_picture_ts(f);
    int after_key = m->gate_key_sent &&
                    (ts == AV_NOPTS_VALUE || m->gate_key_ts == AV_NOPTS_VALUE ||
                     ts >= m->gate_key_ts);

    if (m->gate &&
        (f->key_frame || f->pict_type == AV_PICTURE_TYPE_I || after_key))
        m->gate = 0;
    if (m->gate)
        return 0;
    return m->counting || ts == AV_NOPTS_VALUE || dh__media_in_table(m, ts);
}

void dh__media_note_packet(struct dh_media *m, const AVPacket *pkt)
{
    if (m->gate && !m->gate_key_sent && (pkt->flags & AV_PKT_FLAG_KEY)) {
        m->gate_key_sent = 1;
        m->gate_key_ts = pkt->pts != AV_NOPTS_VALUE ? pkt->pts : pkt->dts;
    }
}

/* Presentation index of timestamp ts: the nearest table entry. */
int64_t dh__media_frame_index(const struct dh_media *m, int64_t ts)
{
    int64_t lo = 0, hi = m->n - 1;

    if (m->n == 0)
        return -1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (m->pts[mid] < ts)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo > 0 && ts - m->pts[lo - 1] < m->pts[lo] - ts)
        lo--;
    return lo;
}

/* Keyframe number (into key_idx) of the last keyframe at or before index. */
int64_t dh__media_key_at_or_before(const struct dh_media *m, int64_t index)
{
    int64_t lo = 0, hi = m->nkey - 1, best = 0;

    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (m->key_idx[mid] <= index) {
            best = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return best;
}

/* The decoder was flushed and the input positioned at keyframe `key`
 * (none: -1): nothing decoded yet, and the keyframe gate closed. */
void dh__media_repositioned(struct dh_media *m, int64_t key)
{
    m->cur_key = key;
    m->last_index = -1;
    m->eof = 0;
    m->gate = 1;
    m->gate_key_sent = 0;
}

/* Positions the demuxer at keyframe `key` and empties the decoder.  The
 * first keyframe is reached by reopening: a timestamp seek lands a GOP late
 * in some containers (MPEG-TS binary-searches by decode time), and the
 * start of the file is the one place every container can go back to. */
int dh__media_rewind(struct dh_media *m, int64_t key, struct dh_err *e)
{
    char buf[128];
    int rc;

    if (key == 0)
        return dh__media_restart(m, e);
    rc = av_seek_frame(m->fc, m->stream, m->key_seek[key],
                       AVSEEK_FLAG_BACKWARD);
    if (rc < 0)
        return dh_err_set(e, DH_EMEDIA, "%s: seeking to frame %lld: %s",
                          m->name, (long long)m->key_idx[key],
                          dh__av_errstr(rc, buf, sizeof(buf)));
    avcodec_flush_buffers(m->cc);
    dh__media_repositioned(m, key);
    m->seeks++;
    return 0;
}

/* Back to the first frame when timestamps cannot be trusted to seek: reopen
 * the input (every container supports that) and reset the decoder. */
int dh__media_restart(struct dh_media *m, struct dh_err *e)
{
    int rc;

    close_input(m);
    rc = open_input(m, e);
    if (rc)
        return rc;
    avcodec_flush_buffers(m->cc);
    dh__media_repositioned(m, 0);
    m->seeks++;
    return 0;
}
