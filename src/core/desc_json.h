/*
 * desc_json.h - descriptor <-> jansson object helpers shared by desc.c and
 * the table reader/writer (internal).
 *
 * The reader parses each line once and needs the object (to spot the header
 * record) before turning it into a descriptor; these entry points avoid a
 * second parse.  Thread-safety: pure functions.
 */
#ifndef DH_CORE_DESC_JSON_H
#define DH_CORE_DESC_JSON_H

#include <jansson.h>

#include "datahelix/table.h"

/* Fills `d` (fini'ed first) from a parsed object; `e` gets "field ...". */
int dh__desc_from_object(json_t *obj, struct dh_desc *d,
                         struct dh_err *e) DH_MUST_CHECK;

/*
 * Whether a failed jansson load was an allocation failure.  jansson reports
 * some of those as syntax errors (its lexer swallows them), so besides its
 * error code this probes the allocator: if a small allocation fails too,
 * the failure is taken to be memory.
 */
int dh__json_error_is_oom(const json_error_t *je);

/* Maps a jansson load error to DH_ENOMEM or DH_EFORMAT with its message. */
int dh__json_load_error(const json_error_t *je, struct dh_err *e);

#endif
