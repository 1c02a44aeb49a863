/*
 * datahelix/export.h - DH_API, the mark of a function that belongs to the
 * public C API (docs/c-api.md).
 *
 * The library is compiled with -fvisibility=hidden, so libdatahelix.so
 * exports only what is marked here: the functions declared in the installed
 * headers (error, table, index, media, client).  Internal functions
 * (dh__*, and the modules under src/include/datahelix/) stay hidden; the
 * build's own programs reach them by linking the static archive.
 * tests/abi/exported-symbols.txt lists what the shared library exports and
 * the build checks it, so a change to the list is always a deliberate one.
 *
 * Place DH_API at the start of a declaration:
 *
 *     DH_API const char *dh_strerror(int code);
 *
 * Thread-safety: not applicable (macros only).
 */
#ifndef DATAHELIX_EXPORT_H
#define DATAHELIX_EXPORT_H

#if defined(__GNUC__) && __GNUC__ >= 4
#define DH_API __attribute__((visibility("default")))
#else
#define DH_API
#endif

#endif
