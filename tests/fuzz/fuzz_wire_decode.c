/*
 * fuzz_wire_decode.c - libFuzzer target: dh_wire_decode on arbitrary bytes.
 * Whatever decodes must encode again, and the encoding must decode to the
 * same message and re-encode to the same bytes (a fixed point).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dh_wire_msg m, back;
    uint8_t *b1 = NULL, *b2 = NULL;
    size_t n1, n2;
    struct dh_err e;

    if (dh_wire_decode(data, size, &m, &e) != 0)
        return 0;
    if (dh_wire_encode(&m, &b1, &n1, &e) != 0)
        abort(); /* everything that decodes must encode */
    if (dh_wire_decode(b1, n1, &back, &e) != 0 || back.type != m.type)
        abort();
    if (dh_wire_encode(&back, &b2, &n2, &e) != 0 || n1 != n2 ||
        memcmp(b1, b2, n1) != 0)
        abort();
    dh_wire_free(b1);
    dh_wire_free(b2);
    dh_wire_msg_fini(&back);
    dh_wire_msg_fini(&m);
    return 0;
}
