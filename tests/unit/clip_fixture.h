/*
 * clip_fixture.h - the shared fixture of the tests that decode through an
 * index (test_batch.c, test_workers.c, test_client.c, and through
 * loop_fixture.h test_dataserver.c and test_remote.c): NCLIPS small S
 * clips from gen-data, indexed as ids 0..NCLIPS-1, plus (clip_fixture_
 * setup) a truncated copy of clip 0, cut.mp4, as id NCLIPS; and a small
 * media plan.  Header-only test code: define NCLIPS, then include it once.
 */
#ifndef DH_TEST_CLIP_FIXTURE_H
#define DH_TEST_CLIP_FIXTURE_H

static char dir[512], dhx[600];
static char paths[NCLIPS + 1][600];
static struct dh_index *ix;

static void make_truncated(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    char buf[4096];
    size_t n, total = 0;

    assert_non_null(in);
    assert_non_null(out);
    /* Keep the front (the index lives there), lose most samples. */
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0 && total < 12000) {
        fwrite(buf, 1, n, out);
        total += n;
    }
    fclose(in);
    fclose(out);
}

/* The clips in $DH_TEST_TMP/sub, indexed into `dhx`, opened as `ix`; the
 * truncated clip only when with_cut. */
static int clip_fixture_build(const char *sub, uint64_t seed, int with_cut)
{
    const char *tmp = getenv("DH_TEST_TMP");
    struct dh_gen_opts o = {0};
    struct dh_index_builder *b;
    struct dh_desc d;
    struct dh_err e;

    snprintf(dir, sizeof(dir), "%s/%s", tmp ? tmp : "/tmp", sub);
    o.out_dir = dir;
    o.profiles = "S";
    o.count = NCLIPS;
    o.seed = seed;
    if (dh_gen_data(&o, &(struct dh_gen_stats){0}, &e))
        fail_msg("gen-data: %s", e.msg);
    for (int i = 0; i < NCLIPS; i++)
        snprintf(paths[i], sizeof(paths[i]), "%s/%06d_S.mp4", dir, i);
    if (with_cut) {
        snprintf(paths[NCLIPS], sizeof(paths[NCLIPS]), "%s/cut.mp4", dir);
        make_truncated(paths[0], paths[NCLIPS]);
    }
    assert_int_equal(dh_index_builder_create(&b, &e), 0);
    for (int i = 0; i < NCLIPS + !!with_cut; i++) {
        dh_desc_init(&d);
        d.path = paths[i];
        d.id = i;
        d.kind = DH_KIND_VIDEO;
        snprintf(d.profile, sizeof(d.profile), "16x224");
        assert_int_equal(dh_index_builder_add(b, &d, &e), 0);
    }
    snprintf(dhx, sizeof(dhx), "%s/m.dhx", dir);
    if (dh_index_builder_finish(b, dhx, &e))
        fail_msg("index: %s", e.msg);
    dh_index_builder_destroy(b);
    assert_int_equal(dh_index_open(dhx, 0, &ix, &e), 0);
    return 0;
}

static inline int clip_fixture_setup(const char *sub, uint64_t seed)
{
    return clip_fixture_build(sub, seed, 1);
}

static int clip_fixture_teardown(void **state)
{
    (void)state;
    dh_index_close(ix);
    return 0;
}

/* 4 uniform frames at 32 x 24: enough to decode for real, fast under ASan. */
static inline struct dh_media_plan fixture_plan(void)
{
    struct dh_media_plan p;

    dh_media_plan_init(&p);
    p.frames = 4;
    p.width = 32;
    p.height = 24;
    return p;
}

#endif
