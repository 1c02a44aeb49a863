/*
 * probe.c - one file -> descriptor, from container headers (DESIGN 4.2).
 *
 * Design: headers only where the container carries an exact per-packet
 * index (MP4/MOV: the sample table is read at open, so the index length is
 * the packet count); elsewhere (Matroska/WebM without a frame count, AVI,
 * MPEG-TS, ...) the video stream's packets are counted, reading the file
 * but decoding nothing.  Either way `frames` equals what
 * `ffprobe -count_packets` reports.  Stream info (which decodes a few
 * frames) is only gathered when the header lacks the codec or the size.
 *
 * Thread-safety: reentrant; each call owns its AVFormatContext.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/display.h>

#include "core/alloc.h"
#include "core/url.h"
#include "core/utf8.h"
#include "datahelix/probe.h"
#include "media/av_util.h"
#include "media/source.h"

static int has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);

    return n >= m && !strcasecmp(s + n - m, suffix);
}

static int probe_text(const char *path, const struct stat *st,
                      struct dh_desc *d, struct dh_err *e)
{
    FILE *f = fopen(path, "rb");

    if (!f)
        return dh_err_set(e, DH_EIO, "%s: %s", path, strerror(errno));
    fclose(f);
    d->kind = DH_KIND_TEXT;
    d->bytes = (int64_t)st->st_size;
    d->mtime_ns = dh__mtime_ns(st);
    return 0;
}

static int64_t packet_end(const AVPacket *pkt)
{
    int64_t t = pkt->pts != AV_NOPTS_VALUE ? pkt->pts : pkt->dts;

    return t == AV_NOPTS_VALUE ? INT64_MIN : t + pkt->duration;
}

/* Where a packet of stream `st` ends, in seconds from the file's start;
 * -inf without a timestamp. */
static double packet_end_s(const AVFormatContext *fc, const AVStream *st,
                           const AVPacket *pkt)
{
    int64_t t = packet_end(pkt);
    double start = fc->start_time != AV_NOPTS_VALUE
                       ? (double)fc->start_time / AV_TIME_BASE
                       : 0;

    return t == INT64_MIN ? -INFINITY
                          : (double)t * av_q2d(st->time_base) - start;
}

/* Counts the frames of stream `idx` (c->frames: dh__av_counts_as_frame) and
 * all its packets (c->packets, for the header's count) without decoding
 * them.  c->end_s is where its last packet ends, in seconds from the
 * stream's start, and c->all_end_s where any stream's does, from the
 * file's (0 when packets carry no timestamps): a cut-off file stops all
 * its streams short, a valid one with a longer audio track does not. */
struct packet_count {
    int64_t frames, packets;
    double end_s, all_end_s;
};

static int count_packets(AVFormatContext *fc, int idx, struct packet_count *c,
                         const char *path, struct dh_err *e)
{
    AVPacket *pkt = av_packet_alloc();
    AVStream *st = fc->streams[idx];
    int64_t end = INT64_MIN;
    double all_end = -INFINITY;
    int rc, seen_key = 0;
    char buf[128];

    memset(c, 0, sizeof(*c));
    if (!pkt)
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", path);
    while ((rc = av_read_frame(fc, pkt)) >= 0) {
        double t_s = packet_end_s(fc, fc->streams[pkt->stream_index], pkt);
        all_end = t_s > all_end ? t_s : all_end;
        if (pkt->stream_index == idx) {
            int64_t t = packet_end(pkt);
            c->frames += dh__av_counts_as_frame(pkt, &seen_key);
            c->packets++;
            end = t > end ? t : end;
        }
        av_packet_unref(pkt);
    }
    av_packet_free(&pkt);
    if (rc != AVERROR_EOF)
        return dh_err_set(e, DH_EMEDIA, "%s: reading packet %lld: %s", path,
                          (long long)c->packets,
                          dh__av_errstr(rc, buf, sizeof(buf)));
    if (end != INT64_MIN) {
        int64_t start = st->start_time != AV_NOPTS_VALUE ? st->start_time : 0;
        c->end_s = (double)(end - start) * av_q2d(st->time_base);
        c->all_end_s = isfinite(all_end) ? all_end : 0;
    }
    return 0;
}

/* The index's samples that are frames, counted as the packets would be
 * (dh__av_counts_as_frame): from the first keyframe on, preroll out. */
static int64_t index_frames(AVStream *st, int n)
{
    int64_t frames = 0;
    int seen_key = 0;

    for (int i = 0; i < n; i++) {
        const AVIndexEntry *ie = avformat_index_get_entry(st, i);
        if (ie->flags & AVINDEX_KEYFRAME)
            seen_key = 1;
        frames += seen_key && !(ie->flags & AVINDEX_DISCARD_FRAME);
    }
    return frames;
}

static int64_t index_packets(AVFormatContext *fc, AVStream *st)
{
    int64_t n;

    /* The MOV demuxer loads the whole sample table at open time, except in
     * fragmented files, where moov's sample count (nb_frames) and the
     * fragments indexed so far disagree: count those packet by packet. */
    if (strncmp(fc->iformat->name, "mov", 3))
        return -1;
    n = avformat_index_get_entries_count(st);
    if (n != st->nb_frames)
        return -1;
    return index_frames(st, (int)n);
}

/* A header-only probe must still notice a cut-off file: every sample the
 * MOV index points at has to lie inside the file. */
static int check_index_in_file(AVStream *st, int64_t file_bytes,
                               const char *path, struct dh_err *e)
{
    int n = avformat_index_get_entries_count(st);

    for (int i = 0; i < n; i++) {
        const AVIndexEntry *ie = avformat_index_get_entry(st, i);
        if (ie && ie->pos + ie->size > file_bytes)
            return dh_err_set(e, DH_EMEDIA,
                              "%s: truncated: frame %d lies at bytes "
                              "%lld..%lld but the file has %lld bytes",
                              path, i, (long long)ie->pos,
                              (long long)(ie->pos + ie->size),
                              (long long)file_bytes);
    }
    return 0;
}

/* A stream's own length where the container keeps it only as a tag
 * (Matroska and WebM write DURATION=HH:MM:SS.nnnnnnnnn per track; their
 * streams have no duration field): a sound shorter than the video is then
 * its own length, not the file's.  0: no such tag. */
static double tag_duration(const AVStream *st)
{
    const AVDictionaryEntry *t = av_dict_get(st->metadata, "DURATION", NULL, 0);
    unsigned h, m;
    double s;

    if (!t || sscanf(t->value, "%u:%u:%lf", &h, &m, &s) != 3 || m >= 60 ||
        !(s >= 0 && s < 60))
        return 0;
    return h * 3600.0 + m * 60.0 + s;
}

/* Containers state times in microseconds at best: keep that, not binary
 * noise like 2.1200000000000001. */
static double round6(double x)
{
    return round(x * 1e6) / 1e6;
}

static int fill_video(AVFormatContext *fc, int idx, struct dh_desc *d,
                      int *unchecked, const char *path, struct dh_err *e)
{
    AVStream *st = fc->streams[idx];
    AVCodecParameters *par = st->codecpar;
    AVRational rate = st->avg_frame_rate.num ? st->avg_frame_rate
                                             : st->r_frame_rate;
    int64_t frames;
    int rc;

    snprintf(d->codec, sizeof(d->codec), "%s", avcodec_get_name(par->codec_id));
    d->width = par->width;
    d->height = par->height;
    d->rotation = dh__av_stream_rotation(st);
    d->duration_s = round6(dh__av_stream_seconds(fc, st));
    d->fps = rate.num && rate.den ? round6(av_q2d(rate)) : 0;
    if (dh__av_is_image_format(fc->iformat)) {
        d->kind = DH_KIND_IMAGE;
        d->frames = 1;
        d->fps = 0;
        d->duration_s = 0;
        return 0;
    }
    d->kind = DH_KIND_VIDEO;
    frames = index_packets(fc, st);
    if (frames > 0 && (rc = check_index_in_file(st, d->bytes, path, e)))
        return rc;
    if (frames <= 0) {
        struct packet_count c;
        rc = count_packets(fc, idx, &c, path, e);
        if (!rc)
            rc = dh__av_check_complete(fc, st, c.packets, c.end_s, c.all_end_s,
                                       unchecked, path, e);
        if (rc)
            return rc;
        frames = c.frames;
        /* No duration of the video's own: the container's, as ffprobe
         * says, unless it is clearly another stream's (an audio track
         * seconds longer than the video): then the video packets'. */
        if (d->duration_s <= 0 ||
            (fc->nb_streams > 1 &&
             (st->duration == AV_NOPTS_VALUE || st->duration <= 0) &&
             c.end_s > 0 && d->duration_s > c.end_s + 0.5))
            d->duration_s = round6(c.end_s);
    }
    if (frames <= 0)
        return dh_err_set(e, DH_EMEDIA, "%s: video stream has no packets",
                          path);
    d->frames = frames;
    if (d->fps <= 0 && d->duration_s > 0)
        d->fps = round6((double)frames / d->duration_s);
    return 0;
}

/* The clip's main audio stream (FFmpeg's best one beside the video), if
 * any: what the table says of a clip's sound (issue 38). */
static int fill_audio(AVFormatContext *fc, int video, struct dh_desc *d)
{
    int idx = av_find_best_stream(fc, AVMEDIA_TYPE_AUDIO, -1, video, NULL, 0);
    const AVStream *st;
    const AVCodecParameters *par;

    if (idx < 0)
        return idx;
    st = fc->streams[idx];
    par = st->codecpar;
    snprintf(d->audio_codec, sizeof(d->audio_codec), "%s",
             avcodec_get_name(par->codec_id));
    d->audio_rate = par->sample_rate > 0 ? par->sample_rate : 0;
    d->audio_channels = par->ch_layout.nb_channels > 0
                            ? par->ch_layout.nb_channels
                            : 0;
    d->audio_duration_s = round6(st->duration == AV_NOPTS_VALUE &&
                                         tag_duration(st) > 0
                                     ? tag_duration(st)
                                     : dh__av_stream_seconds(fc, st));
    d->audio_start_s = st->start_time != AV_NOPTS_VALUE
                           ? round6((double)st->start_time *
                                    av_q2d(st->time_base))
                           : 0;
    return 0;
}

/* The header of `ref` (a file, or a shard member) into `d`, read through
 * a source (source.h): FFmpeg gets the bytes through an AVIOContext and no
 * protocol at all, so a playlist or a concat list cannot make it open
 * other files (a FIFO that would block, /etc/passwd) or URLs. */
static int probe_av(const struct dh_source_ref *ref, struct dh_desc *d,
                    struct dh_probe_notes *notes, int audio_only,
                    struct dh_err *e)
{
    struct dh_source src;
    AVFormatContext *fc = NULL;
    AVIOContext *pb = NULL;
    char *url = NULL;
    int idx, rc;

    dh__source_init(&src);
    if ((rc = dh__source_open(&src, ref, e)))
        goto out;
    if (!ref->member && !(url = dh__malloc(strlen(ref->path) + 6))) {
        rc = dh_err_set(e, DH_ENOMEM, "%s: out of memory", src.name);
        goto out;
    }
    if (url && dh__url_kind(ref->path) != DH_URL_NONE) {
        /* a whole remote object: its size is the server's, its name for
         * FFmpeg the URL's path */
        d->bytes = src.size;
        memcpy(url, "file:", 5);
        dh__url_path(ref->path, url + 5, strlen(ref->path) + 1);
    } else if (url) { /* "file:" keeps a ':' in a name from being read as a
                       * protocol; the name lets FFmpeg match extensions */
        snprintf(url, strlen(ref->path) + 6, "file:%s", ref->path);
    }
    if (!(fc = avformat_alloc_context()) ||
        !(pb = dh__source_avio(&src, 65536))) {
        rc = dh_err_set(e, DH_ENOMEM, "%s: out of memory", src.name);
        goto out;
    }
    fc->pb = pb;
    rc = dh__av_open_io(&fc, url);
    if (rc < 0) {
        rc = dh__source_input_error(&src, rc, e);
        goto out; /* avformat_open_input freed fc */
    }
    if (audio_only) {
        rc = fill_audio(fc, -1, d) < 0
                 ? dh_err_set(e, DH_EMEDIA, "%s: no audio stream", src.name)
                 : 0;
    } else {
        idx = dh__av_find_video(fc, src.name, e);
        if (idx < 0 && fill_audio(fc, -1, d) == 0) {
            /* sound alone (a .wav, .mp3, .m4a...): an audio sample */
            dh_err_clear(e);
            d->kind = DH_KIND_AUDIO;
            d->duration_s = d->audio_duration_s;
            snprintf(d->codec, sizeof(d->codec), "%s", d->audio_codec);
            idx = 0;
            rc = 0;
        } else {
            rc = idx < 0
                     ? idx
                     : fill_video(fc, idx, d, notes ? &notes->unchecked : NULL,
                                  src.name, e);
        }
        if (!rc && d->kind == DH_KIND_VIDEO)
            (void)fill_audio(fc, idx, d); /* none: a clip without sound */
    }
    /* a failed read may have looked like the end of the input to the
     * demuxer (a frame count cut short): the read's error instead */
    if (src.failed)
        rc = dh__source_input_error(&src, AVERROR(EIO), e);
out:
    avformat_close_input(&fc);
    avformat_free_context(fc);
    dh__source_avio_free(&pb);
    dh__source_fini(&src);
    dh__free(url);
    return rc;
}

/* A shard member, read in place. */
static int probe_member(const struct dh_source_ref *ref, struct dh_desc *d,
                        struct dh_probe_notes *notes, struct dh_err *e)
{
    if (!(d->path = dh__strdup(ref->path)) ||
        !(d->member = dh__strdup(ref->member)))
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", ref->path);
    d->offset = ref->offset;
    d->bytes = ref->size;
    if (!dh__utf8_valid(ref->path) || !dh__utf8_valid(ref->member))
        return dh_err_set(e, DH_EINVAL,
                          "%s:%s: the name is not valid UTF-8, which a JSON "
                          "table cannot hold",
                          ref->path, ref->member);
    return probe_av(ref, d, notes, 0, e);
}

/* DH_EUNSUPPORTED for a compressed shard's name, else 0. */
static int compressed_shard(const char *path, const char *shown,
                            struct dh_err *e)
{
    if (has_suffix(path, ".tar.gz") || has_suffix(path, ".tgz") ||
        has_suffix(path, ".tar.zst") || has_suffix(path, ".tar.xz") ||
        has_suffix(path, ".tar.bz2"))
        return dh_err_set(e, DH_EUNSUPPORTED,
                          "%s: a compressed tar shard is not read in place "
                          "(a member cannot be reached without decompressing "
                          "everything before it): decompress it to a .tar "
                          "first",
                          shown);
    return 0;
}

/* A whole object named by a URL: read through its source like a file. */
static int probe_remote(const char *url, struct dh_desc *d,
                        struct dh_probe_notes *notes, struct dh_err *e)
{
    struct dh_source_ref ref = {.path = url};
    char shown[2048];
    int rc;

    dh__url_redact(url, shown, sizeof(shown));
    if (!(d->path = dh__strdup(url)))
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", shown);
    if (!dh__utf8_valid(url))
        rc = dh_err_set(e, DH_EINVAL,
                        "%s: the URL is not valid UTF-8, which a JSON table "
                        "cannot hold",
                        shown);
    else if ((rc = compressed_shard(url, shown, e)))
        ;
    else if (has_suffix(url, ".txt"))
        rc = dh_err_set(e, DH_EUNSUPPORTED,
                        "%s: a text sample is read from local disk only",
                        shown);
    else
        rc = probe_av(&ref, d, notes, 0, e);
    if (rc)
        dh_desc_fini(d);
    return rc;
}

int dh_probe_ref_notes(const struct dh_source_ref *ref, struct dh_desc *d,
                       struct dh_probe_notes *notes, struct dh_err *e)
{
    int rc;

    if (!ref->member)
        return dh_probe_file_notes(ref->path, d, notes, e);
    dh_desc_fini(d);
    if (notes)
        memset(notes, 0, sizeof(*notes));
    dh__av_quiet();
    rc = probe_member(ref, d, notes, e);
    if (rc)
        dh_desc_fini(d);
    return rc;
}

int dh_probe_audio_ref(const struct dh_source_ref *ref, struct dh_desc *d,
                       struct dh_err *e)
{
    return probe_av(ref, d, NULL, 1, e);
}

int dh_probe_file(const char *path, struct dh_desc *d, struct dh_err *e)
{
    return dh_probe_file_notes(path, d, NULL, e);
}

int dh_probe_file_notes(const char *path, struct dh_desc *d,
                        struct dh_probe_notes *notes, struct dh_err *e)
{
    struct stat st;
    int rc;

    dh_desc_fini(d);
    if (notes)
        memset(notes, 0, sizeof(*notes));
    dh__av_quiet();
    if (dh__url_kind(path) != DH_URL_NONE)
        return probe_remote(path, d, notes, e);
    if (stat(path, &st))
        return dh_err_set(e, DH_EIO, "%s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return dh_err_set(e, DH_EINVAL, "%s: not a regular file", path);
    d->path = dh__strdup(path);
    if (!d->path)
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", path);
    d->bytes = (int64_t)st.st_size;
    d->mtime_ns = dh__mtime_ns(&st);
    if (!dh__utf8_valid(path)) {
        rc = dh_err_set(e, DH_EINVAL,
                        "%s: the path is not valid UTF-8, which "
                        "a JSON table cannot hold",
                        path);
        goto out_fini;
    }
    if ((rc = compressed_shard(path, path, e)))
        goto out_fini;
    if (has_suffix(path, ".txt")) {
        rc = probe_text(path, &st, d, e);
        goto out_fini;
    }
    if (st.st_size == 0) {
        rc = dh_err_set(e, DH_EMEDIA, "%s: empty file", path);
        goto out_fini;
    }
    {
        struct dh_source_ref ref = {.path = path};

        rc = probe_av(&ref, d, notes, 0, e);
    }
out_fini:
    if (rc)
        dh_desc_fini(d);
    return rc;
}
