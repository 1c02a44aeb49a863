/*
 * wire_internal.h - shared pieces of the wire codec (wire.c, wire_pb.c,
 * wire_check.c); internal to src/core/.  The only file that sees the
 * protobuf-c generated types besides the unit test.
 */
#ifndef DH_CORE_WIRE_INTERNAL_H
#define DH_CORE_WIRE_INTERNAL_H

#include <stddef.h>

#include "datahelix.pb-c.h"
#include "datahelix/wire.h"

typedef Datahelix__Wire__Envelope PbEnvelope;
typedef Datahelix__Wire__TaskId PbTask;
typedef Datahelix__Wire__SamplingPlan PbPlan;
typedef Datahelix__Wire__DescriptorRequest PbRequest;
typedef Datahelix__Wire__PeerLink PbLink;

/*
 * Context of a check or a copy: `bad` is the code of an invalid value
 * (DH_EINVAL when encoding: the caller's mistake; DH_EFORMAT when decoding:
 * the peer's); `where` names the message ("heartbeat", "route.request").
 */
struct dh__wire_ck {
    int bad;
    const char *where;
    struct dh_err *e;
};

/* Records "wire: <where>.<fmt...>" with `code` in c->e; returns `code`. */
int dh__wire_fail(const struct dh__wire_ck *c, int code, const char *fmt, ...)
    DH_PRINTF(3, 4);
#define WIRE_BAD(c, ...) dh__wire_fail((c), (c)->bad, __VA_ARGS__)
#define WIRE_BIG(c, ...) dh__wire_fail((c), DH_ETOOBIG, __VA_ARGS__)

/* A text field we hold: NUL-terminated within cap + 1 (else DH_ETOOBIG),
 * and non-empty if asked. */
int dh__wire_ck_text(const struct dh__wire_ck *c, const char *field,
                     const char *s, size_t cap, int nonempty);

/* Checks every field of `m` (see datahelix/wire.h for the rules). */
int dh__wire_check(const struct dh_wire_msg *m, int bad, struct dh_err *e);

/* *out = a seam-allocated copy of n elements of `size` bytes (zeroed when
 * src is NULL; NULL when n == 0).  DH_ETOOBIG over `cap`, DH_ENOMEM. */
int dh__wire_copy_array(void **out, const void *src, size_t n, size_t size,
                        size_t cap, const char *field, struct dh_err *e);

/* Everything one envelope borrows or needs besides our message. */
struct dh__wire_pb_out {
    PbEnvelope env;
    union {
        Datahelix__Wire__RegisterClient register_client;
        Datahelix__Wire__RegisterServer register_server;
        Datahelix__Wire__Heartbeat heartbeat;
        Datahelix__Wire__Route route;
        Datahelix__Wire__ResultNotice result;
        Datahelix__Wire__ErrorNotice error;
        Datahelix__Wire__Release release;
        Datahelix__Wire__Shutdown shutdown;
    } b;
    PbTask task, req_task;
    PbRequest req;
    PbPlan plan;
    Datahelix__Wire__DeadlineHints hints;
    Datahelix__Wire__RankReport report;
    Datahelix__Wire__StageTimes stages;
    PbLink *links; /* seam-allocated, n_links: free both after packing */
    PbLink **link_ptrs;
};

/* Fills o->env from a checked message `m` (o zeroed by the caller); the
 * envelope borrows m's memory.  DH_ENOMEM only. */
int dh__wire_to_pb(struct dh__wire_pb_out *o, const struct dh_wire_msg *m,
                   struct dh_err *e);

/* Our type of an envelope's body case (DH_WIRE_NONE: none or unknown). */
enum dh_wire_type dh__wire_type_of(Datahelix__Wire__Envelope__BodyCase bc);

/* Copies env's body into m (initialised with dh__wire_type_of()'s type);
 * counts and strings over their caps are refused before copying. */
int dh__wire_from_pb(struct dh_wire_msg *m, const PbEnvelope *env,
                     struct dh_err *e);

#endif
