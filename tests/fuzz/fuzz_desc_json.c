/*
 * fuzz_desc_json.c - libFuzzer target: dh_desc_from_json on arbitrary bytes;
 * whatever parses must serialise and parse back to an equal descriptor.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/table.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int str_eq(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static int desc_eq(const struct dh_desc *a, const struct dh_desc *b)
{
    return a->id == b->id && a->kind == b->kind && a->bytes == b->bytes &&
           a->width == b->width && a->height == b->height &&
           a->rotation == b->rotation && a->fps == b->fps &&
           a->duration_s == b->duration_s && a->frames == b->frames &&
           a->est_cpu_ms == b->est_cpu_ms &&
           a->est_out_bytes == b->est_out_bytes &&
           a->est_tokens == b->est_tokens && str_eq(a->path, b->path) &&
           str_eq(a->text, b->text) && str_eq(a->extra_json, b->extra_json) &&
           strcmp(a->codec, b->codec) == 0 &&
           strcmp(a->profile, b->profile) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dh_desc d, back;
    struct dh_err e;
    char *json = NULL;

    dh_desc_init(&d);
    dh_desc_init(&back);
    if (dh_desc_from_json((const char *)data, size, &d, &e) == 0) {
        if (dh_desc_to_json(&d, &json) != 0)
            abort(); /* everything that parses must serialise */
        if (dh_desc_from_json(json, strlen(json), &back, &e) != 0 ||
            !desc_eq(&d, &back))
            abort();
        free(json);
    }
    dh_desc_fini(&d);
    dh_desc_fini(&back);
    return 0;
}
