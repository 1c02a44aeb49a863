/*
 * media_scale.c - one decoded picture -> one output frame: geometry (crop,
 * stretch, random crop), display rotation, layout and dtype.
 *
 * Design (DESIGN 6): the crop is taken on the *source* by offsetting plane
 * pointers, and libswscale converts and resizes that region straight into
 * the destination slot - one write per output pixel, no full-size RGB
 * intermediate.  Rotated sources, TCHW and float32 (all opt-in or rare)
 * go through a small per-worker RGB scratch at output size instead.
 * Direct writes need the slots to be filled in order: swscale may store a
 * few bytes past a row's end, which the next slot then overwrites (the last
 * slot has DH_MEDIA_DST_PAD); when slots are written out of order (explicit
 * index lists, the exact pass after snap-to-reference) scratch is used.
 */
#include <string.h>

#include <libavutil/pixdesc.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "datahelix/media_stages.h"
#include "media/media_internal.h"
#include "core/hash.h"

struct rect {
    int x, y, w, h;
};

static size_t frame_bytes(const struct dh_media_plan *p)
{
    return (size_t)p->width * (size_t)p->height * 3 *
           (p->dtype == DH_DTYPE_F32 ? sizeof(float) : 1);
}

void dh__media_fill(const struct dh_media_plan *p, uint8_t *dst, int64_t slot,
                    int64_t from)
{
    size_t fb = frame_bytes(p);

    if (from < 0)
        memset(dst + (size_t)slot * fb, 0, fb);
    else
        memmove(dst + (size_t)slot * fb, dst + (size_t)from * fb, fb);
}

void dh__media_scale_fini(struct dh_media *m)
{
    sws_freeContext(m->sws);
    m->sws = NULL;
    dh__free(m->scratch);
    m->scratch = NULL;
    m->scratch_cap = 0;
}

/* The region of the displayed (rotated) picture that the output shows. */
static struct rect display_region(const struct dh_media_plan *p, int wd, int hd)
{
    struct rect r = {0, 0, wd, hd};
    double s;
    uint64_t h;

    if (p->geometry == DH_GEOM_STRETCH)
        return r;
    s = (double)p->width / wd > (double)p->height / hd ? (double)p->width / wd
                                                       : (double)p->height / hd;
    r.w = (int)(p->width / s + 0.5);
    r.h = (int)(p->height / s + 0.5);
    r.w = r.w < 1 ? 1 : r.w > wd ? wd : r.w;
    r.h = r.h < 1 ? 1 : r.h > hd ? hd : r.h;
    if (p->geometry == DH_GEOM_CROP) {
        r.x = (wd - r.w) / 2;
        r.y = (hd - r.h) / 2;
        return r;
    }
    h = dh__mix64(p->seed ^ 0x63726f70ull); /* one crop per clip, from seed */
    r.x = (int)(h % (uint64_t)(wd - r.w + 1));
    r.y = (int)(dh__mix64(h) % (uint64_t)(hd - r.h + 1));
    return r;
}

/* Maps a display-space rectangle to the coded picture (rotation is the
 * clockwise turn the display applies to the coded picture). */
static struct rect coded_region(struct rect d, int rot, int wc, int hc)
{
    struct rect c = d;

    if (rot == 180) {
        c.x = wc - d.x - d.w;
        c.y = hc - d.y - d.h;
    } else if (rot == 90) {
        c = (struct rect){d.y, hc - d.x - d.w, d.h, d.w};
    } else if (rot == 270) {
        c = (struct rect){wc - d.y - d.h, d.x, d.h, d.w};
    }
    return c;
}

/* Plane pointers of the region's top-left corner, for any CPU format. */
static int crop_planes(const AVFrame *f, struct rect *c, const uint8_t *out[4])
{
    const AVPixFmtDescriptor *d = av_pix_fmt_desc_get(f->format);

    if (!d ||
        (d->flags & (AV_PIX_FMT_FLAG_BITSTREAM | AV_PIX_FMT_FLAG_HWACCEL)))
        return -1;
    /* Whole chroma samples only: at most one luma pixel of shift. */
    c->x &= ~((1 << d->log2_chroma_w) - 1);
    c->y &= ~((1 << d->log2_chroma_h) - 1);
    for (int i = 0; i < 4; i++) {
        int step = 0, sx = 0, sy = 0;
        out[i] = f->data[i];
        if (!f->data[i] || ((d->flags & AV_PIX_FMT_FLAG_PAL) && i == 1))
            continue;
        for (int k = 0; k < d->nb_components; k++)
            if (d->comp[k].plane == i && !step)
                step = d->comp[k].step;
        if (i == 1 || i == 2) {
            sx = d->log2_chroma_w;
            sy = d->log2_chroma_h;
        }
        out[i] += (ptrdiff_t)(c->y >> sy) * f->linesize[i] +
                  (ptrdiff_t)(c->x >> sx) * step;
    }
    return 0;
}

static int sws_cs_of(enum AVColorSpace cs)
{
    switch (cs) {
    case AVCOL_SPC_BT709:
        return SWS_CS_ITU709;
    case AVCOL_SPC_FCC:
        return SWS_CS_FCC;
    case AVCOL_SPC_SMPTE240M:
        return SWS_CS_SMPTE240M;
    case AVCOL_SPC_BT2020_NCL:
    case AVCOL_SPC_BT2020_CL:
        return SWS_CS_BT2020;
    default:
        return SWS_CS_DEFAULT;
    }
}

static int get_scaler(struct dh_media *m, const AVFrame *f, int sw, int sh,
                      int w, int h, struct dh_err *e)
{
    int cs = sws_cs_of(f->colorspace);
    int want = f->color_range, range = f->color_range == AVCOL_RANGE_JPEG;
    int *inv, *tab, src_range, dst_range, bri, con, sat;
    int key[5] = {sw, sh, f->format, w, h};

    /* A new context may reuse the old one's address: remember the
     * parameters, not the pointer, to know when colour details are due. */
    if (memcmp(key, m->sws_key, sizeof(key))) {
        memcpy(m->sws_key, key, sizeof(key));
        m->sws_set = NULL;
    }
    m->sws = sws_getCachedContext(m->sws, sw, sh, f->format, w, h,
                                  AV_PIX_FMT_RGB24, SWS_BILINEAR, NULL, NULL,
                                  NULL);
    if (!m->sws) {
        const char *n = av_get_pix_fmt_name(f->format);
        return dh_err_set(e, DH_EMEDIA,
                          "%s: cannot convert pixel format %s "
                          "(%dx%d) to RGB %dx%d",
                          m->name, n ? n : "?", sw, sh, w, h);
    }
    if (m->sws_set != m->sws || m->sws_cs != cs || m->sws_range != want) {
        /* An unspecified range keeps swscale's own choice for the format
         * (full for gray and yuvj, limited for yuv), as ffmpeg does. */
        if (f->color_range == AVCOL_RANGE_UNSPECIFIED &&
            sws_getColorspaceDetails(m->sws, &inv, &src_range, &tab, &dst_range,
                                     &bri, &con, &sat) >= 0)
            range = src_range;
        sws_setColorspaceDetails(m->sws, sws_getCoefficients(cs), range,
                                 sws_getCoefficients(SWS_CS_DEFAULT), 1, 0,
                                 1 << 16, 1 << 16);
        m->sws_set = m->sws;
        m->sws_cs = cs;
        m->sws_range = want;
    }
    return 0;
}

static uint8_t *scratch(struct dh_media *m, size_t bytes)
{
    if (bytes > m->scratch_cap) {
        uint8_t *p = dh__realloc(m->scratch, bytes);
        if (!p)
            return NULL;
        m->scratch = p;
        m->scratch_cap = bytes;
    }
    return m->scratch;
}

/* Source pixel of output (xo, yo) in the coded-orientation scratch. */
static void rotate_src(int rot, int W, int H, int xo, int yo, int *xs, int *ys)
{
    switch (rot) {
    case 90:
        *xs = yo;
        *ys = W - 1 - xo;
        break;
    case 180:
        *xs = W - 1 - xo;
        *ys = H - 1 - yo;
        break;
    case 270:
        *xs = H - 1 - yo;
        *ys = xo;
        break;
    default:
        *xs = xo;
        *ys = yo;
        break;
    }
}

/* Scratch (RGB24, coded orientation) -> destination layout and dtype. */
static void transform(const struct dh_media_plan *p, int rot,
                      const uint8_t *src, int stride, uint8_t *out)
{
    int W = p->width, H = p->height;
    size_t plane = (size_t)W * H;
    float lut[3][256];
    float *fo = (float *)(void *)out;

    if (p->dtype == DH_DTYPE_F32)
        for (int c = 0; c < 3; c++)
            for (int v = 0; v < 256; v++)
                lut[c][v] = ((float)v / 255.0f - p->mean[c]) / p->std[c];
    for (int yo = 0; yo < H; yo++) {
        for (int xo = 0; xo < W; xo++) {
            int xs, ys;
            rotate_src(rot, W, H, xo, yo, &xs, &ys);
            const uint8_t *px = src + (size_t)ys * stride + (size_t)xs * 3;
            size_t o = (size_t)yo * W + xo;
            for (int c = 0; c < 3; c++) {
                size_t at = p->layout == DH_LAYOUT_THWC ? o * 3 + c
                                                        : c * plane + o;
                if (p->dtype == DH_DTYPE_F32)
                    fo[at] = lut[c][px[c]];
                else
                    out[at] = px[c];
            }
        }
    }
}

static int emit_frame(struct dh_media *m, const struct dh_media_plan *p,
                      AVFrame *f, int64_t slot, uint8_t *dst, struct dh_err *e)
{
    int rot = m->info.rotation, turned = rot == 90 || rot == 270;
    int wd = turned ? f->height : f->width, hd = turned ? f->width : f->height;
    int sw = turned ? p->height : p->width, sh = turned ? p->width : p->height;
    struct rect c = coded_region(display_region(p, wd, hd), rot, f->width,
                                 f->height);
    const uint8_t *src[4];
    uint8_t *out = dst + (size_t)slot * frame_bytes(p), *buf;
    int direct = rot == 0 && p->layout == DH_LAYOUT_THWC &&
                 p->dtype == DH_DTYPE_U8 && m->emit_in_order;
    int stride = direct ? p->width * 3 : FFALIGN(sw * 3, 64), rc;

    if (crop_planes(f, &c, src))
        return dh_err_set(e, DH_EMEDIA,
                          "%s: decoder returned a picture in a "
                          "format that cannot be read on the CPU",
                          m->name);
    if ((rc = get_scaler(m, f, c.w, c.h, sw, sh, e)))
        return rc;
    buf = direct ? out : scratch(m, (size_t)stride * sh + DH_MEDIA_DST_PAD);
    if (!buf)
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", m->name);
    sws_scale(m->sws, src, f->linesize, 0, c.h,
              (uint8_t *const[]){buf, NULL, NULL, NULL},
              (const int[]){stride, 0, 0, 0});
    if (!direct)
        transform(p, rot, buf, stride, out);
    return 0;
}

/* The public entry, timed as the DH_MS_SCALE stage (media_stages.h). */
int dh__media_emit(struct dh_media *m, const struct dh_media_plan *p,
                   AVFrame *f, int64_t slot, uint8_t *dst, struct dh_err *e)
{
    double t0 = dh__mono_msf();
    int rc = emit_frame(m, p, f, slot, dst, e);

    m->stage_ms[DH_MS_SCALE] += dh__mono_msf() - t0;
    return rc;
}
