/*
 * aws_ini.h - the AWS shared config and credentials files (internal,
 * pure: the caller reads the files).  The format AWS's own tools read:
 * `[section]` headers (`[default]`, `[name]` in credentials, `[profile
 * name]` in config), `key = value` lines, `#` and `;` comments, and one
 * level of nested settings (`s3 =` followed by indented `key = value`),
 * which are looked up as "s3.key".
 */
#ifndef DH_CORE_AWS_INI_H
#define DH_CORE_AWS_INI_H

#include <stddef.h>

/* The value of `key` in section `section` of `text` (NUL-terminated), with
 * blanks around it trimmed, into out: 1 when found (cut to cap-1 bytes),
 * 0 when not.  Keys and section names match exactly; a later duplicate
 * wins, as in AWS's reader. */
int dh__aws_ini_get(const char *text, const char *section, const char *key,
                    char *out, size_t cap);

#endif
