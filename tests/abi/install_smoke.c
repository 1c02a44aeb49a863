/*
 * install_smoke.c - a C user of the installed library (docs/c-api.md), a
 * CTest (abi_install) built by tests/abi/install-smoke.sh against nothing
 * but `cmake --install`'s include/ and lib/libdatahelix.so: the public
 * headers must compile alone, in strict C11, and what they declare must link
 * and work.  Touches each public module once: errors, a descriptor table
 * written and read, its binary index, a media plan and a failed open, and a
 * client whose Coordinator does not answer.
 *
 * Usage: install_smoke SCRATCH_DIR.  Exit 0 when every check holds; else a
 * line per failed check on stderr and exit 1.
 */
#include <datahelix/datahelix.h>

#include <stdio.h>
#include <string.h>

static int failures;

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "install_smoke: %s:%d: %s\n", __FILE__, __LINE__,  \
                    #cond);                                                    \
            failures++;                                                        \
        }                                                                      \
    } while (0)

static void check_errors(void)
{
    struct dh_err e;

    CHECK(strcmp(dh_strerror(DH_EINVAL), "invalid argument") == 0);
    CHECK(dh_err_set(&e, DH_EIO, "disk %d", 7) == DH_EIO);
    CHECK(e.code == DH_EIO && strcmp(e.msg, "disk 7") == 0);
    dh_err_clear(&e);
    CHECK(e.code == 0 && e.msg[0] == '\0');
}

/* Two text samples written as JSONL, then indexed and read back. */
static void check_table_and_index(const char *dir)
{
    char jsonl[512], dhx[512];
    const char *texts[2] = {"hello", "world"};
    struct dh_table_writer *w = NULL;
    struct dh_index *ix = NULL;
    struct dh_desc d;
    struct dh_err e = {0};

    snprintf(jsonl, sizeof(jsonl), "%s/smoke.jsonl", dir);
    snprintf(dhx, sizeof(dhx), "%s/smoke.dhx", dir);
    CHECK(dh_table_writer_open(jsonl, NULL, &w, &e) == 0);
    if (!w) {
        fprintf(stderr, "install_smoke: %s\n", e.msg);
        return;
    }
    dh_desc_init(&d);
    for (int i = 0; i < 2; i++) {
        d.id = i;
        d.kind = DH_KIND_TEXT;
        d.text = (char *)texts[i];
        CHECK(dh_table_writer_write(w, &d, &e) == 0);
    }
    d.text = NULL; /* borrowed above: not for dh_desc_fini() to free */
    dh_desc_fini(&d);
    CHECK(dh_table_writer_close(w, &e) == 0);

    CHECK(dh_index_build_from_table(jsonl, dhx, &e) == 0);
    CHECK(dh_index_open(dhx, DH_INDEX_VERIFY, &ix, &e) == 0);
    if (!ix) {
        fprintf(stderr, "install_smoke: %s\n", e.msg);
        return;
    }
    CHECK(dh_index_count(ix) == 2);
    CHECK(dh_index_text(ix, 1) && strcmp(dh_index_text(ix, 1), "world") == 0);
    dh_index_close(ix);
}

static void check_media(void)
{
    struct dh_media_plan p;
    struct dh_media *m = NULL;
    struct dh_err e = {0};

    dh_media_plan_init(&p);
    CHECK(dh_media_plan_check(&p, &e) == 0);
    CHECK(dh_media_plan_bytes(&p, p.frames) ==
          (size_t)p.frames * (size_t)p.width * (size_t)p.height * 3u);
    CHECK(dh_media_create(&m, &e) == 0);
    CHECK(dh_media_open(m, "/nonexistent/clip.mp4", &e) < 0);
    CHECK(strstr(e.msg, "/nonexistent/clip.mp4") != NULL);
    dh_media_destroy(m);
}

/* Nothing listens at the address: create() gives up within its bound. */
static void check_client(const char *dir)
{
    char dhx[512];
    struct dh_client_opts o;
    struct dh_client *c = NULL;
    struct dh_err e = {0};

    dh_client_opts_default(&o);
    CHECK(dh_client_create(&o, &c, &e) == DH_EINVAL && c == NULL);
    snprintf(dhx, sizeof(dhx), "%s/smoke.dhx", dir);
    o.coordinator = "tcp://127.0.0.1:9"; /* discard: nobody answers */
    o.index_path = dhx;
    o.start_timeout_ms = 200;
    CHECK(dh_client_create(&o, &c, &e) == DH_ETIMEOUT && c == NULL);
    dh_client_destroy(NULL);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: install_smoke SCRATCH_DIR\n");
        return 2;
    }
    check_errors();
    check_table_and_index(argv[1]);
    check_media();
    check_client(argv[1]);
    if (failures)
        return 1;
    printf("install_smoke: ok\n");
    return 0;
}
