/*
 * utf8.h - UTF-8 validation (internal, pure).  JSON strings must be valid
 * UTF-8, so a path that is not cannot be put in a descriptor table.
 */
#ifndef DH_CORE_UTF8_H
#define DH_CORE_UTF8_H

/* 1 when `s` (NUL-terminated) is valid UTF-8: no overlong forms, no
 * surrogates, nothing above U+10FFFF. */
int dh__utf8_valid(const char *s);

#endif
